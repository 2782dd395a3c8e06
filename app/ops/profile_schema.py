"""profile_schema.set / get / clear: the shape a namespace's structured profiles take."""

from __future__ import annotations

from typing import Any, ClassVar

from marshmallow import fields

from app.profile_schema import (
    MAX_ANSWER_VALUES,
    MAX_OUTPUT_CAP_TOKENS,
    MAX_SCHEMA_BYTES,
    profile_schema_json_schema,
    schema_sha256,
    validate_profile_schema,
)
from app.registry import Call, op
from app.schemas.common import Answer, IdentityArgs
from app.schemas.rules import answer_fits, length_within, ordered, pattern_compiles
from app.store import keys
from app.store.idempotency import kept_reply
from app.store.profile_schema import ProfileSchemaStore, StoredSchema

SEED_EXAMPLE_SCHEMA = {
    "type": "object",
    "properties": {
        "preferred_name": {"type": "string", "description": "What the user asks to be called"},
        "timezone": {"type": "string", "description": "IANA time zone, e.g. Europe/Berlin"},
        "languages": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Languages they speak",
        },
    },
}


# Where a property's own keywords sit: on the property, or on an array property's items.
_KEYWORD_HOLDERS = (["properties", "*"], ["properties", "*", "items"])


class ProfileSchemaSetArgs(IdentityArgs):
    # What a profile schema's JSON Schema cannot state, as the OpenAPI document states it.
    OPENAPI_RULES: ClassVar[dict[str, Any]] = {"x-loom-rules": [
        length_within("json_schema", None, MAX_SCHEMA_BYTES, "json_bytes"),
        *(pattern_compiles("json_schema", [*holder, "pattern"]) for holder in _KEYWORD_HOLDERS),
        *(ordered("json_schema", holder, low, high) for holder in _KEYWORD_HOLDERS
          for low, high in (("minLength", "maxLength"), ("minimum", "maximum"))),
        answer_fits("json_schema", MAX_ANSWER_VALUES, MAX_OUTPUT_CAP_TOKENS)]}

    json_schema = fields.Dict(
        required=True,
        metadata={**profile_schema_json_schema(),
                  "description": "A JSON Schema object with 1 to 64 properties."},
    )


class ProfileSchemaArgs(IdentityArgs):
    pass


class ProfileSchemaClearArgs(ProfileSchemaArgs):
    """The clear's own schema: a write names one agent, a read may name '*' (the OpenAPI
    document says so per schema)."""


class ProfileSchemaAnswer(Answer):
    namespace = fields.String()
    json_schema = fields.Dict(allow_none=True)
    schema_sha256 = fields.String()
    set_by = fields.String()
    set_at = fields.String(allow_none=True)


class ProfileSchemaCleared(Answer):
    namespace = fields.String()
    cleared = fields.Boolean()
    schema_sha256 = fields.String(metadata={"description": "The hash of the schema removed."})


def _namespace_slot(call: Call) -> str:
    """Where a schema write's Idempotency-Key record lives: the namespace's slot."""
    return keys.namespace_tag(call.identity.org, call.identity.namespace)


def _set_answer(call: Call, set_at: int) -> dict[str, Any]:
    doc = call.args["json_schema"]
    stored = StoredSchema(doc, schema_sha256(doc), call.principal.actor, set_at)
    return {"namespace": call.identity.namespace, **stored.as_answer()}


def _cleared_answer(call: Call, old_sha: str | None) -> dict[str, Any]:
    return {"namespace": call.identity.namespace, "cleared": old_sha is not None,
            "schema_sha256": old_sha or ""}


@op("profile_schema.set", role="admin", kind="idempotent", listed=False,
    raises=("SCHEMA_INVALID",),
    args=ProfileSchemaSetArgs, answer=ProfileSchemaAnswer, needs_agent=False,
    keyed_in=_namespace_slot, replay=lambda call, kept: _set_answer(call, kept_reply(kept)[1]),
    example={"namespace": "support", "json_schema": SEED_EXAMPLE_SCHEMA})
def profile_schema_set(call: Call) -> dict[str, Any]:
    """Set the namespace's structured-profile schema (audited); it replaces the old one."""
    doc = call.args["json_schema"]
    validate_profile_schema(doc)
    ident = call.identity
    _old_sha, new = call.services.store(ProfileSchemaStore).set(
        ident.org, ident.namespace, doc, call.principal.actor, held=call.held_key
    )
    return _set_answer(call, new.set_at)


@op("profile_schema.get", role="viewer", kind="read", listed=False,
    args=ProfileSchemaArgs, answer=ProfileSchemaAnswer, needs_agent=False,
    example={"namespace": "support"})
def profile_schema_get(call: Call) -> dict[str, Any]:
    """The namespace's schema, its schema_sha256, who set it and when."""
    ident = call.identity
    stored = call.services.store(ProfileSchemaStore).get(ident.org, ident.namespace)
    if stored is None:
        return {"namespace": ident.namespace, "json_schema": None, "schema_sha256": "",
                "set_by": "", "set_at": None}
    return {"namespace": ident.namespace, **stored.as_answer()}


@op("profile_schema.clear", role="admin", kind="idempotent", listed=False,
    args=ProfileSchemaClearArgs, answer=ProfileSchemaCleared, needs_agent=False,
    keyed_in=_namespace_slot, replay=lambda call, kept: _cleared_answer(call, kept_reply(kept)),
    example={"namespace": "support"})
def profile_schema_clear(call: Call) -> dict[str, Any]:
    """Remove the schema (audited); built profiles stay as memory rows."""
    ident = call.identity
    old_sha = call.services.store(ProfileSchemaStore).clear(
        ident.org, ident.namespace, call.principal.actor, held=call.held_key)
    return _cleared_answer(call, old_sha)
