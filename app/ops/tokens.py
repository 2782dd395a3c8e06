"""token.create / token.revoke / token.list: admin ops that mint and retire API tokens.

They are not MCP tools: credentials are minted from code, the console or the CLI, never by a
model.

A new token never reaches above the token that minted it: its role, org, namespace, read
scope, pinned user, bound session, agent, scopes and expiry are each the same as or narrower
than the creator's. ``token.list`` and ``token.revoke`` see only the tokens a caller could
have minted: inside its org, namespace, pinned user, session and agent.
"""

from __future__ import annotations

from datetime import UTC
from typing import Any, ClassVar

from marshmallow import fields, validate

from app.auth import ANY, READ_SCOPE_RANK, READ_SCOPES, Principal
from app.errors import AuthInsufficient, TokenNotFound, ValidationFailed
from app.principal import ROLE_RANK
from app.registry import Call, op
from app.schemas.common import Answer, IdentityArgs, IdentityText
from app.schemas.rules import future
from app.store import keys
from app.store.idempotency import kept_reply
from app.store.tokens import TokenRow, TokenStore

KNOWN_SCOPES = ("agent_state",)


class TokenCreateArgs(IdentityArgs):
    # token_create's clock check, as the OpenAPI document states it (app.schemas.rules).
    OPENAPI_RULES: ClassVar[dict[str, Any]] = {"x-loom-rules": [future("expires_at")]}
    # A session-bound token is pinned to a user: with no token to take it from, the body
    # names it (claims_for).
    OPENAPI_RULES_WITHOUT_TOKEN: ClassVar[dict[str, Any]] = {"anyOf": [
        {"properties": {"session_id": {"enum": ["-", None]}}},
        {"required": ["read_user_id"], "properties": {"read_user_id": {"type": "string"}}},
    ]}

    namespace = IdentityText(
        load_default=None,
        metadata={"description": "The namespace the token reaches, or '*' for every one."},
    )
    role = fields.String(required=True, validate=validate.OneOf(list(ROLE_RANK)))
    read_scope = fields.String(load_default=None, validate=validate.OneOf(READ_SCOPES))
    read_user_id = IdentityText(
        load_default=None, metadata={"description": "Pin the token to one end user."}
    )
    scopes = fields.List(
        fields.String(validate=validate.OneOf(KNOWN_SCOPES)), load_default=list
    )
    label = fields.String(load_default="", validate=validate.Length(max=200))
    expires_at = fields.AwareDateTime(
        load_default=None, default_timezone=UTC,
        metadata={"description": "When the token stops working (ISO 8601)."},
    )


class TokenIdArgs(IdentityArgs):
    token_id = fields.String(required=True, validate=validate.Length(min=1, max=64))


class TokenListArgs(IdentityArgs):
    pass


class TokenClaims(Answer):
    token_id = fields.String()
    org = fields.String()
    namespace = fields.String()
    role = fields.String()
    read_scope = fields.String()
    read_user_id = fields.String(allow_none=True)
    session_id = fields.String(allow_none=True)
    agent = fields.String(allow_none=True)
    scopes = fields.List(fields.String())
    label = fields.String()
    expires_at = fields.Integer(allow_none=True)
    created_at = fields.Integer()
    created_by = fields.String()
    revoked = fields.Boolean()
    revoked_at = fields.Integer(allow_none=True)


class TokenCreated(TokenClaims):
    token = fields.String(metadata={"description": "The secret, shown once."})


class TokenRevoked(Answer):
    token_id = fields.String()
    revoked = fields.Boolean()


class TokenList(Answer):
    tokens = fields.List(fields.Nested(TokenClaims))


def _narrower(claim: str, wanted: Any, ceiling: Any) -> Any:
    """A claim the creator fixes is inherited; naming another value is a 403."""
    if ceiling is None:
        return wanted
    if wanted not in (None, ceiling):
        raise AuthInsufficient(f"{claim} {wanted!r} is beyond this token's reach", field=claim)
    return ceiling


def claims_for(call: Call) -> dict[str, Any]:
    creator, args = call.principal, call.args
    if ROLE_RANK[args["role"]] > ROLE_RANK[creator.role]:
        raise AuthInsufficient("a token cannot mint a role above its own", field="role")
    namespace = args.get("namespace") or creator.namespace
    read_scope = args["read_scope"] or creator.read_scope
    if READ_SCOPE_RANK[read_scope] > READ_SCOPE_RANK[creator.read_scope]:
        raise AuthInsufficient("read_scope is broader than this token's", field="read_scope")
    scopes = sorted(set(args["scopes"]))
    for scope in scopes:
        if not creator.has_scope(scope):
            raise AuthInsufficient(f"this token does not hold the {scope} scope", field="scopes")
    expires_at = None
    if args["expires_at"] is not None:
        expires_at = int(args["expires_at"].timestamp() * 1e9)
        if expires_at <= call.services.clock.now_ns():
            raise ValidationFailed({"expires_at": ["must be in the future"]})
    if creator.expires_at is not None and (expires_at is None or expires_at > creator.expires_at):
        expires_at = creator.expires_at
    session_id = call.identity.session_id if call.identity.session_id != "-" else None
    read_user_id = _narrower("read_user_id", args["read_user_id"], creator.read_user_id)
    if session_id is not None and read_user_id is None:
        raise ValidationFailed({"read_user_id": [
            "a token bound to a session is pinned to that session's user: give read_user_id"]})
    return {
        "org": call.identity.org,
        "namespace": namespace,
        "role": args["role"],
        "read_scope": read_scope,
        "read_user_id": read_user_id,
        "session_id": _narrower("session_id", session_id, creator.session_id),
        "agent": _narrower("agent", args.get("agent"), creator.agent),
        "scopes": scopes,
        "label": args["label"],
        "expires_at": expires_at,
    }


def _in_reach(principal: Principal, claims: dict[str, Any]) -> bool:
    """Whether ``principal`` may see and revoke a token of ``claims``: one inside its org and
    namespace, and inside its pinned user, bound session and bound agent when it has them (a
    token it could have minted), so a pinned admin cannot list or revoke its neighbours'."""
    if principal.org not in (ANY, claims["org"]) and not principal.single_user:
        return False
    if principal.namespace not in (ANY, claims["namespace"]):
        return False
    bindings = (("read_user_id", principal.read_user_id), ("session_id", principal.session_id),
                ("agent", principal.agent))
    return all(bound is None or claims.get(claim) == bound for claim, bound in bindings)


def _created(call: Call, secret: str, row: TokenRow) -> dict[str, Any]:
    return {"token": secret, **row.as_answer()}


def _recreated(call: Call, kept: str) -> dict[str, Any]:
    """A keyed create's answer again: the same token, from the id and nonce its record kept."""
    store = call.services.store(TokenStore)
    return _created(call, *store.recreate(claims_for(call), call.principal.actor,
                                          kept_reply(kept)))


@op("token.create", role="admin", kind="write", listed=False,
    args=TokenCreateArgs, answer=TokenCreated, needs_agent=False, needs_namespace=False, mcp=False,
    keyed_in=lambda call: keys.org_tag(call.identity.org), replay=_recreated,
    example={"namespace": "support", "role": "writer", "label": "triage service"})
def token_create(call: Call) -> dict[str, Any]:
    """Mint a token; its secret is answered once and only its keyed hash is kept."""
    claims = claims_for(call)
    secret, row = call.services.store(TokenStore).create(claims, call.principal.actor,
                                                         held=call.held_key)
    return _created(call, secret, row)


@op("token.revoke", role="admin", kind="idempotent", listed=False,
    raises=("TOKEN_NOT_FOUND",),
    args=TokenIdArgs, answer=TokenRevoked, needs_agent=False, needs_namespace=False, mcp=False,
    keyed_in=lambda call: keys.token_tag(call.args["token_id"]),
    replay=lambda call, _kept: {"token_id": call.args["token_id"], "revoked": True},
    example={"token_id": "0123456789abcdef"})
def token_revoke(call: Call) -> dict[str, Any]:
    """Revoke a token; it fails on its next use."""
    store = call.services.store(TokenStore)
    row = store.get(call.args["token_id"])
    if row is None or row.claims["org"] != call.identity.org or not _in_reach(
        call.principal, row.claims
    ):
        raise TokenNotFound("no such token in this org", token_id=call.args["token_id"])
    store.revoke(row.token_id, held=call.held_key)
    return {"token_id": row.token_id, "revoked": True}


@op("token.list", role="admin", kind="read", listed=False,
    args=TokenListArgs, answer=TokenList, needs_agent=False, needs_namespace=False, mcp=False,
    example={})
def token_list(call: Call) -> dict[str, Any]:
    """List the org's tokens (claims and state, never secrets or hashes)."""
    rows = call.services.store(TokenStore).list(call.identity.org)
    visible = [row for row in rows if _in_reach(call.principal, row.claims)]
    return {"tokens": [row.as_answer() for row in visible]}
