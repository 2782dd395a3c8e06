"""profile.structured: one user's structured profile and whether it is current (seed 003).

A read never calls a model: one round trip reads the schema, the profile row, the worker's
build record and the user's source digest, and the status follows from comparing them.
"""

from __future__ import annotations

from typing import Any

from marshmallow import fields, validate

from app.errors import AuthInsufficient, IdentityIncomplete
from app.registry import Call, op
from app.schemas.common import Answer, IdentityArgs
from app.store.activity import ActivityStore
from app.store.structured import StructuredStore


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


@op("profile.structured", role="viewer", kind="read", listed=False,
    args=ProfileStructuredArgs, answer=ProfileStructured,
    example={"namespace": "support", "agent": "chat", "user_id": "u-42"})
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
    snapshot = call.services.store(StructuredStore).snapshot(identity)
    answer = snapshot.read(call.services.clock.now_ns())
    answer["schema_sha256"] = snapshot.schema.sha if snapshot.schema is not None else ""
    call.services.store(ActivityStore).record(identity, call.client, call.op.name)
    return answer
