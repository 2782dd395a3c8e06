"""Who is calling: the ``Principal`` a request acts as, the roles it may hold, and ``ANY``
(every org or namespace).

It sits below the op registry (which names each op's role), the auth layer (``app.auth``,
which resolves a call's identity from it) and the token store (which builds one from a token's
claims), and imports none of them, so a store never imports the layer above it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Role = Literal["viewer", "writer", "admin"]
ROLE_RANK: dict[str, int] = {"viewer": 0, "writer": 1, "admin": 2}
ANY = "*"


@dataclass(frozen=True)
class Principal:
    org: str
    namespace: str = ANY
    role: str = "admin"
    read_scope: str = "namespace"
    read_user_id: str | None = None
    session_id: str | None = None
    agent: str | None = None
    scopes: frozenset[str] = field(default_factory=frozenset)
    token_id: str | None = None
    single_user: bool = False
    # Where an install-wide principal (org "*") acts when the body names no org.
    default_org: str = "default"
    expires_at: int | None = None

    def reaches_role(self, role: str) -> bool:
        return ROLE_RANK[self.role] >= ROLE_RANK[role]

    @property
    def actor(self) -> str:
        """Who acted, for audit rows and row actors: a token id, never a secret."""
        if self.single_user:
            return "single-user"
        return self.token_id or "install-admin"

    def has_scope(self, scope: str) -> bool:
        return self.single_user or self.role == "admin" or scope in self.scopes


def single_user(org: str) -> Principal:
    """The seeds' single-user server: the install's org, every role, every namespace."""
    return Principal(org=org, single_user=True)
