"""profile.structured: one user's structured profile and whether it is current (seed 003);
structured.blacklist: keep the worker from building one user's profile (audited).

A read never calls a model: one round trip reads the schema, the profile row, the worker's
build record and the user's source digest, and the status follows from comparing them.
"""

from __future__ import annotations

from typing import Any

from marshmallow import fields, validate

from app.clock import iso_from_ns
from app.errors import AuthInsufficient, IdentityIncomplete
from app.keyed import keyed_digest
from app.registry import Call, op
from app.schemas.common import Answer, IdentityArgs
from app.store import keys
from app.store.activity import ActivityStore
from app.store.idempotency import kept_reply
from app.store.structured import Snapshot, StructuredStore

# Versioned purpose of the user digest an audit entry names a blacklisted user by.
_AUDIT_USER_PURPOSE = b"loom.structured.blacklist.user.v1"


class ProfileStructuredArgs(IdentityArgs):
    read_scope = fields.String(
        load_default=None,
        validate=validate.OneOf(["namespace", "own_user"]),
        metadata={"description": "The token's read_scope is the ceiling; own_session is "
                                 "refused: a profile spans the user's sessions."},
    )


class ProfileStructured(Answer):
    status = fields.String(
        metadata={"enum": ["ready", "stale", "pending", "no_schema"]}
    )
    profile = fields.Dict()
    built_at = fields.String(allow_none=True)
    memory_id = fields.String()
    version = fields.Integer()
    version_text = fields.String()
    schema_sha256 = fields.String()
    next_pass_at = fields.String(
        allow_none=True,
        metadata={"description": "For a pending or stale profile: when the worker's first pass "
                                 "that may build it is due (the scheduler's next tick after "
                                 "the cooldown of a rebuild and any idle wait; a first build "
                                 "has no cooldown). A pass takes at most MAX_USERS_PER_PASS "
                                 "users, so a backlog can take more passes. Null when ready, "
                                 "under no_schema, or before any pass ran."})


@op("profile.structured", role="viewer", kind="read", listed=False,
    args=ProfileStructuredArgs, answer=ProfileStructured,
    needs_user=True, example={"namespace": "support", "agent": "chat", "user_id": "u-42"})
def profile_structured(call: Call) -> dict[str, Any]:
    """The user's structured profile and whether it is current."""
    principal, identity = call.principal, call.identity
    if principal.read_scope == "own_session" or principal.session_id is not None:
        # A token bounded to one session is refused: a profile spans the user's sessions.
        if call.args.get("session_id", "-") == "-":
            raise IdentityIncomplete(
                "a session-bound token must name its session_id, and is then refused",
                field="session_id",
            )
        raise AuthInsufficient(
            "a token bounded to one session cannot read a profile, which spans sessions",
            field="session_id",
        )
    if identity.user_id == "-":
        raise IdentityIncomplete("profile.structured reads one user: user_id is required",
                                 field="user_id")
    snapshot = call.services.store(StructuredStore).snapshot(identity, for_build=False)
    answer = snapshot.read(call.services.clock.now_ns())
    answer["schema_sha256"] = snapshot.schema.sha if snapshot.schema is not None else ""
    answer["next_pass_at"] = _next_pass_at(call, snapshot, answer["status"])
    call.services.store(ActivityStore).record(identity, call.client, call.op.name,
                                              by_console=call.by_console)
    return answer


def _next_pass_at(call: Call, snapshot: Snapshot, status: str) -> str | None:
    """When a pass may next build a pending or stale profile (the answer's ``next_pass_at``)."""
    if status not in ("pending", "stale"):
        return None
    settings = call.services.settings
    structured = call.services.store(StructuredStore)
    now_ns = call.services.clock.now_ns()
    ready_at = snapshot.rebuild_from(now_ns, settings.structured_profile_cooldown_seconds)
    stored, wakes = structured.pass_schedule()
    at = stored.next_tick(ready_at / 1e9, wakes, settings.structured_profile_interval_seconds)
    return iso_from_ns(int(at * 1e9)) if at is not None else None


class JsonBoolean(fields.Boolean):
    """true or false as JSON gives them: "yes", 1 or "false" is refused, never guessed at."""

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> Any:
        if not isinstance(value, bool):
            raise self.make_error("invalid")
        return value


class StructuredBlacklistArgs(IdentityArgs):
    blacklisted = JsonBoolean(
        required=True,
        metadata={"description": "true: the worker builds no profile for the user (a build is "
                                 "refused as a locked profile row refuses it); false: lift it."},
    )


class StructuredBlacklisted(Answer):
    user_id = fields.String()
    blacklisted = fields.Boolean()
    blacklisted_at = fields.String(
        allow_none=True, metadata={"description": "Since when; null when not blacklisted."})
    changed = fields.Boolean(metadata={"description": "false when it already was so."})
    user_digest = fields.String(
        metadata={"description": "The keyed hash the audit entry names the user by."})


@op("structured.blacklist", role="admin", kind="idempotent", listed=False,
    raises=("USER_BEING_ERASED",),
    args=StructuredBlacklistArgs, answer=StructuredBlacklisted, needs_agent=False,
    needs_user=True,
    example={"namespace": "support", "user_id": "u-42", "blacklisted": True},
    keyed_in=lambda call: keys.namespace_tag(call.identity.org, call.identity.namespace),
    replay=lambda call, kept: _blacklisted_answer(
        call, *StructuredStore.blacklisted_of(kept_reply(kept))))
def structured_blacklist(call: Call) -> dict[str, Any]:
    """Blacklist a user from structured-profile builds, or lift it (audited)."""
    identity = call.identity
    if identity.user_id == "-":
        raise IdentityIncomplete("structured.blacklist names one user: user_id is required",
                                 field="user_id")
    on = bool(call.args["blacklisted"])
    changed, since = call.services.store(StructuredStore).set_blacklisted(
        identity, on, call.principal.actor,
        {"blacklisted": on, "user_digest": _audit_digest(call)}, held=call.held_key)
    return _blacklisted_answer(call, changed, since)


def _audit_digest(call: Call) -> str:
    # The audit list outlives an erasure of the user: it names them by a keyed hash only.
    identity = call.identity
    return keyed_digest(call.services.settings.secret_key.encode("utf-8"),
                        _AUDIT_USER_PURPOSE, identity.org, identity.namespace, identity.user_id)


def _blacklisted_answer(call: Call, changed: bool, since: int | None) -> dict[str, Any]:
    on, user_digest = bool(call.args["blacklisted"]), _audit_digest(call)
    return {"user_id": call.identity.user_id, "blacklisted": on,
            "blacklisted_at": iso_from_ns(since) if since is not None else None,
            "changed": changed, "user_digest": user_digest}
