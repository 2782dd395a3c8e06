"""What a console session keeps of the token its person signed in with: never the token.

The token is proved whole once, at sign-in. After that the session (a JSON string in Redis,
``app.store.console_sessions``) keeps only what finds the principal again on every page:

* a minted token (``loom_<token_id>_<secret>``): its id. Each page resolves the principal by
  that id, so a revoked or expired token ends the session as the token itself would.
* the install's admin token (``LOOM_ADMIN_TOKEN``), which has no id: a keyed digest of it under
  ``LOOM_SECRET_KEY``, matched against the configured token on each page, so changing that
  setting ends every session signed in with the old one.
* no token (auth off, the install's single user): nothing but that.

So a copy of the data (an RDB file, a replica) holds no string that works as a token: an id
is no secret, and the digest cannot be sent as one.
"""

from __future__ import annotations

import hmac
from typing import Any

from app.errors import AuthInvalid
from app.keyed import keyed_digest
from app.principal import Principal
from app.store.tokens import TokenStore

_ADMIN_PURPOSE = b"loom.console.admin-token.v1"

TOKEN = "token"  # a minted token: its id
ADMIN = "admin"  # the install's admin token: its keyed digest
NONE = "none"  # signed in without a token (auth off)


def sign_in(services: Any, token: str) -> tuple[Principal, dict[str, str]]:
    """Authenticate ``token`` ('' for none) and answer its principal and what the session
    keeps of it. Raises the LoomError ``authenticate`` raises for a token that is refused."""
    principal = services.authenticate({"Authorization": f"Bearer {token}"} if token else {})
    if not token:
        return principal, {"kind": NONE}
    if principal.token_id:
        return principal, {"kind": TOKEN, "token_id": principal.token_id}
    return principal, {"kind": ADMIN, "digest": _admin_digest(services, token)}


def principal_of(services: Any, credential: dict[str, Any]) -> Principal:
    """The principal a session's credential stands for now. AuthInvalid (or AuthRequired,
    for no token with auth on) when it no longer stands for one."""
    kind = credential.get("kind")
    if kind == NONE:
        return services.authenticate({})  # type: ignore[no-any-return]
    if kind == TOKEN:
        principal: Principal | None = services.store(TokenStore).principal_by_id(
            str(credential.get("token_id") or ""), services.settings.default_org)
        if principal is None:
            raise AuthInvalid("unknown, revoked or expired token")
        return principal
    if kind == ADMIN:
        admin = services.settings.admin_token
        if admin and hmac.compare_digest(
                _admin_digest(services, admin), str(credential.get("digest") or "")):
            return services.authenticate(  # type: ignore[no-any-return]
                {"Authorization": f"Bearer {admin}"})
        raise AuthInvalid("the install's admin token changed since sign-in")
    raise AuthInvalid("this session holds no sign-in")


def _admin_digest(services: Any, token: str) -> str:
    return keyed_digest(services.settings.secret_key.encode("utf-8"), _ADMIN_PURPOSE, token)
