"""The namespace's governance ops: features.set/get, object_types.set/get and audit.list.

All are admin ops on the whole namespace (no agent). A set replaces its whole document, is
validated first (422 ``SCHEMA_INVALID`` naming the broken rule and its path) and is audited in
the same transaction. They are not MCP tools: the security role sets these documents from code
or the console, never through a model.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, TypedDict

from marshmallow import fields, validate

from app.clock import iso_from_ns
from app.object_types import types_json_schema, validate_object_types
from app.pii import BUILTIN_MASKS, MAX_MASK_LENGTH, MAX_PATTERN_LENGTH, MAX_RULES
from app.registry import Call, op
from app.schemas.common import Answer, IdentityArgs, StrictInt
from app.schemas.rules import re2_pattern, retention_within_state, unique_by
from app.store import keys
from app.store.idempotency import kept_reply
from app.store.namespace_config import (
    AUDIT_DEFAULT_LIMIT,
    AUDIT_MAX_LIMIT,
    Features,
    NamespaceConfigStore,
    document_sha256,
    validate_features,
)

_NS = {"namespace": "shop"}
EXAMPLE_TYPE = {
    "type": "shop_guide_state",
    "ownership": "agent",
    "fields": {
        "step": {"type": "enum", "values": ["sizes", "offer", "checkout"]},
        "offer": {"type": "string"},
        "cart_note": {"type": "text", "pii": True},
    },
    "agent_state": {"scope": "conversation", "max_bytes": 16384, "write": "both"},
    "retention": {"state": "30d", "cart_note": "7d"},
}


class NamespaceArgs(IdentityArgs):
    """org and namespace only: these ops act on the whole namespace."""

    class Meta(IdentityArgs.Meta):
        exclude = ("agent", "user_id", "session_id", "run_id")


def _features_document() -> dict[str, Any]:
    """What ``validate_features`` and ``app.pii.validate_pii_rules`` check that JSON Schema
    can state: the known keys only, their types, a rule's keys, name, lengths and count. What
    it cannot (a pattern that compiles, names unique across rules) stays theirs."""
    reserved = "|".join(sorted(BUILTIN_MASKS))
    rule = {
        "type": "object",
        "required": ["name", "pattern"],
        "properties": {
            "name": {"type": "string", "pattern": rf"^(?!(?:{reserved})$)[a-z][a-z0-9_]{{0,31}}$"},
            "pattern": {"type": "string", "minLength": 1, "maxLength": MAX_PATTERN_LENGTH},
            "mask": {"type": "string", "minLength": 1, "maxLength": MAX_MASK_LENGTH,
                     "nullable": True},
        },
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {
            "agent_state": {"type": "boolean"},
            "pii_rules": {"type": "array", "maxItems": MAX_RULES, "items": rule,
                          "nullable": True},
        },
        "additionalProperties": False,
    }


class FeaturesSetArgs(NamespaceArgs):
    # What the features document's JSON Schema cannot state, as the OpenAPI document states it.
    OPENAPI_RULES: ClassVar[dict[str, Any]] = {"x-loom-rules": [
        unique_by("features", ["pii_rules"], "name"),
        re2_pattern("features", ["pii_rules", "*", "pattern"])]}

    features = fields.Raw(
        required=True,
        metadata={
            **_features_document(),
            "description": 'The whole features document: {"agent_state": true|false, '
            '"pii_rules": [{"name", "pattern", "mask"?}]}; a key left out takes its default '
            "(agent_state false, no rules)."
        },
    )


class ObjectTypesSetArgs(NamespaceArgs):
    # What the registry's JSON Schema cannot state, as the OpenAPI document states it.
    OPENAPI_RULES: ClassVar[dict[str, Any]] = {"x-loom-rules": [
        unique_by("types", [], "type"), retention_within_state("types", ["*"])]}

    types = fields.Raw(
        required=True,
        metadata={**types_json_schema(),
                  "description": "The whole object-types registry (a list of types)."},
    )


class AuditListArgs(NamespaceArgs):
    limit = StrictInt(
        load_default=AUDIT_DEFAULT_LIMIT,
        validate=validate.Range(min=1, max=AUDIT_MAX_LIMIT),
        metadata={"description": f"Newest entries to return (1 to {AUDIT_MAX_LIMIT})."},
    )


class FeaturesAnswer(Answer):
    features = fields.Dict()
    sha256 = fields.String(allow_none=True)
    updated_at = fields.String(allow_none=True)


class ObjectTypesAnswer(Answer):
    types = fields.List(fields.Dict())
    count = fields.Integer()
    sha256 = fields.String(allow_none=True)
    updated_at = fields.String(allow_none=True)


class AuditListAnswer(Answer):
    entries = fields.List(fields.Dict(), metadata={"description": "Newest first."})
    count = fields.Integer()


def _store(call: Call) -> NamespaceConfigStore:
    return call.services.store(NamespaceConfigStore)


def _iso(ns: int | None) -> str | None:
    return None if ns is None else iso_from_ns(ns)


class _AdminOp(TypedDict):
    role: Literal["admin"]
    needs_agent: bool
    mcp: bool


# Admin-only, namespace-wide, never an MCP tool: the same for every op of this module.
_ADMIN: _AdminOp = {"role": "admin", "needs_agent": False, "mcp": False}


def _features_answer(call: Call, sha: str, at: int) -> dict[str, Any]:
    features = validate_features(call.args["features"])
    return {"features": features.to_dict(), "sha256": sha, "updated_at": iso_from_ns(at)}


def _types_answer(call: Call, sha: str, at: int) -> dict[str, Any]:
    types = validate_object_types(call.args["types"])
    return {
        "types": [t.to_dict() for t in types],
        "count": len(types),
        "sha256": sha,
        "updated_at": iso_from_ns(at),
    }


def _namespace_slot(call: Call) -> str:
    """Where a namespace document's Idempotency-Key record lives: the namespace's slot."""
    return keys.namespace_tag(call.identity.org, call.identity.namespace)


@op("features.set", kind="idempotent", args=FeaturesSetArgs, answer=FeaturesAnswer,
    raises=("SCHEMA_INVALID",),
    keyed_in=_namespace_slot, replay=lambda call, kept: _features_answer(call, *kept_reply(kept)),
    example={**_NS, "features": {"agent_state": True, "pii_rules": [
        {"name": "order_ref", "pattern": "ORD-[0-9]{6}", "mask": "[order]"}]}},
    **_ADMIN)
def features_set(call: Call) -> dict[str, Any]:
    """Replace the namespace's features document (agent_state, pii_rules); audited."""
    identity = call.identity
    _features, sha, at = _store(call).set_features(
        identity.org, identity.namespace, call.args["features"],
        call.principal.actor, held=call.held_key,
    )
    return _features_answer(call, sha, at)


@op("features.get", kind="read", args=NamespaceArgs, answer=FeaturesAnswer,
    example=_NS, **_ADMIN)
def features_get(call: Call) -> dict[str, Any]:
    """Read the namespace's features document (defaults when never set)."""
    config = _store(call).get(call.identity.org, call.identity.namespace)
    document = config.features_doc or Features().to_dict()
    return {
        "features": document,
        "sha256": document_sha256(config.features_doc) if config.features_doc else None,
        "updated_at": _iso(config.features_at),
    }


@op("object_types.set", kind="idempotent", args=ObjectTypesSetArgs, answer=ObjectTypesAnswer,
    raises=("SCHEMA_INVALID",),
    keyed_in=_namespace_slot, replay=lambda call, kept: _types_answer(call, *kept_reply(kept)),
    example={**_NS, "types": [EXAMPLE_TYPE]}, **_ADMIN)
def object_types_set(call: Call) -> dict[str, Any]:
    """Replace the namespace's object-types registry; audited."""
    identity = call.identity
    _types, sha, at = _store(call).set_object_types(
        identity.org, identity.namespace, call.args["types"],
        call.principal.actor, held=call.held_key,
    )
    return _types_answer(call, sha, at)


@op("object_types.get", kind="read", args=NamespaceArgs, answer=ObjectTypesAnswer,
    example=_NS, **_ADMIN)
def object_types_get(call: Call) -> dict[str, Any]:
    """Read the namespace's object-types registry, normalized (defaults filled)."""
    config = _store(call).get(call.identity.org, call.identity.namespace)
    document = config.types_doc or []
    return {
        "types": document,
        "count": len(document),
        "sha256": document_sha256(config.types_doc) if config.types_doc is not None else None,
        "updated_at": _iso(config.types_at),
    }


@op("audit.list", kind="read", args=AuditListArgs, answer=AuditListAnswer,
    example={**_NS, "limit": 20}, **_ADMIN)
def audit_list(call: Call) -> dict[str, Any]:
    """List the namespace's audit entries, newest first."""
    entries = _store(call).audit.entries(
        call.identity.org, call.identity.namespace, call.args["limit"]
    )
    return {"entries": entries, "count": len(entries)}
