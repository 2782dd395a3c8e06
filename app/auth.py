"""Who is calling, and which identity an op may act as.

A ``Principal`` is what a token grants (or, with auth off, the install's single user).
``resolve_identity`` fills the identity fields a body leaves out from the principal and refuses
a body that names an org, namespace, agent, user or session outside the principal's reach.
Token storage and lookup live in ``app.store.tokens``; this module holds no Redis.
"""

from __future__ import annotations

from typing import Any

from app.errors import AuthInsufficient, IdentityIncomplete, ValidationFailed
from app.principal import ANY, Principal
from app.registry import Op
from app.store.identity import Identity

READ_SCOPES = ("namespace", "own_user", "own_session")
READ_SCOPE_RANK = {"own_session": 0, "own_user": 1, "namespace": 2}
def _fixed(field_name: str, given: Any, fixed: str | None, blank: Any) -> Any:
    """The body may repeat what the token fixes, or leave it out; naming another is a 403."""
    if fixed is None:
        return given
    if given not in (None, blank, fixed):
        raise AuthInsufficient(
            f"{field_name} {given!r} is outside this token's reach", field=field_name
        )
    return fixed


def resolve_identity(op: Op, principal: Principal, args: dict[str, Any]) -> Identity:
    if not principal.reaches_role(op.role):
        raise AuthInsufficient(
            f"{op.name} needs the {op.role} role; this token has {principal.role}",
            required_role=op.role,
        )
    if principal.single_user:
        # Auth off: every call acts in the install's org, whatever the body says (seed 000).
        org = principal.org
    elif principal.org == ANY:
        # The install's admin token reaches every org; it acts in the one the body names.
        org = args.get("org") or principal.default_org
    else:
        org = _fixed("org", args.get("org"), principal.org, None)
    # A field the token does not fix is the body's own: ``_fixed`` is called only for the
    # fixed ones, which with auth off is none of them (four calls a request spared).
    namespace = args.get("namespace")
    if principal.namespace != ANY:
        namespace = _fixed("namespace", namespace, principal.namespace, None)
    if principal.session_id and not principal.read_user_id:
        # A session id alone does not say whose session it is: naming another user's id with
        # it would read their data. Tokens are bound to a user when minted with a session.
        raise AuthInsufficient("this token is bound to a session but to no user; mint it "
                               "again with read_user_id", field="session_id")
    if op.org_wide and principal.namespace != ANY and not principal.single_user:
        raise AuthInsufficient(f"{op.name} acts on the whole org: it needs a token that "
                               "reaches every namespace", field="namespace")
    agent = args.get("agent")
    if principal.agent is not None:
        agent = _fixed("agent", agent, principal.agent, None)
    if agent == ANY and op.kind != "read" and not args.get("memory_id"):
        # '*' means every agent when reading; no write, block or token may be an agent '*'.
        raise ValidationFailed({"agent": ["a write names one agent, not '*'"]})
    user_id = args.get("user_id", "-")
    if principal.read_user_id is not None:
        user_id = _fixed("user_id", user_id, principal.read_user_id, "-")
    session_id = args.get("session_id", "-")
    if principal.session_id is not None:
        session_id = _fixed("session_id", session_id, principal.session_id, "-")
    if op.needs_namespace and not namespace:
        raise IdentityIncomplete("namespace is required", field="namespace")
    if op.needs_agent and not agent:
        raise IdentityIncomplete("agent is required", field="agent")
    return Identity(
        org=org,
        namespace=namespace or "-",
        agent=agent or "-",
        user_id=user_id or "-",
        session_id=session_id or "-",
        run_id=args.get("run_id") or "-",
    )


def effective_read_scope(principal: Principal, requested: str | None) -> str:
    """The read scope a read runs under: the token's ``read_scope`` is the ceiling.

    A request that names no scope reads at the ceiling; one that names a broader scope than
    the token allows is refused rather than quietly narrowed, so the caller learns why rows
    are missing.
    """
    if requested is None:
        return principal.read_scope
    if READ_SCOPE_RANK[requested] > READ_SCOPE_RANK[principal.read_scope]:
        raise AuthInsufficient(
            f"read_scope {requested!r} is broader than this token's {principal.read_scope!r}",
            field="read_scope",
        )
    return requested


def row_visible(read_scope: str, identity: Identity, row_user_id: str, row_session_id: str) -> bool:
    """Whether a row of (user, session) is inside a read at ``read_scope`` for ``identity``.

    ``own_user`` reads that user's rows and the namespace-level ones (user ``-``);
    ``own_session`` reads that session's rows and the namespace-level ones.
    """
    if read_scope == "namespace":
        return True
    if row_user_id == "-" and row_session_id == "-":
        return True
    if read_scope == "own_user":
        return row_user_id == identity.user_id
    return row_session_id == identity.session_id and row_user_id in ("-", identity.user_id)


def row_writable(principal: Principal, read_scope: str, identity: Identity,
                 row_user_id: str, row_session_id: str, row_agent: str) -> bool:
    """Whether a write may name a row of (user, session, agent) by its ``memory_id``.

    The reach of a write by key, which ``resolve_identity`` gives: a token pinned to a user
    writes only that user's rows, one bound to a session only that session's, one fixed to an
    agent only that agent's. So a namespace-level row (user ``-``), which every user reads, is
    no pinned token's to change. A write also never names a row its caller could not read.
    """
    if not row_visible(read_scope, identity, row_user_id, row_session_id):
        return False
    if principal.read_user_id is not None and row_user_id != principal.read_user_id:
        return False
    if principal.session_id is not None and row_session_id != principal.session_id:
        return False
    return principal.agent is None or row_agent == principal.agent
