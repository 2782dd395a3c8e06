"""The namespace's object-types document, and the check of an agent state against its type.

Seed 002 gives an agent's working state a declared schema: a type with ``ownership: agent`` in
the namespace's object-types registry (body ``{"types": [...]}``). Loom does not interpret what
the state means, but it knows each field's type, whether it is PII, its sensitivity and its
retention, so it can mask, expire, export and erase field by field.

This module is pure (no Redis, no Flask):

- ``validate_object_types`` turns the declared list into frozen ``ObjectType`` values with every
  default filled, or raises ``SchemaRuleViolation`` naming the rule and the path of the offending
  member (``types[0].agent_state.max_bytes``);
- ``state_type_for`` picks the type that gives an agent's state its schema;
- ``check_declared`` lists the undeclared top-level fields of a state body (the write is then
  refused with ``not_declared_field``), and ``check_values`` raises a 422 ``ValidationFailed``
  naming every declared field whose value has the wrong JSON type.

Ownership: ``agent`` types carry an ``agent_state`` section and give agent state its schema.
``customer`` and ``org`` types are accepted as plain declared types (the registry is shared with
other object kinds), validated the same way, and may not carry ``agent_state``; Loom keeps them
but never writes state against them. Any other ownership is refused, so a typo cannot turn an
agent's type into one that silently refuses every write.

Unknown keys are refused at every level (type, field, agent_state, retention) rather than
ignored: a typo such as ``"pi": true`` would otherwise leave a PII field unmasked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from app.errors import SchemaRuleViolation, ValidationFailed
from app.json_patterns import PY_SPACE
from app.scope_ids import SCOPE_KINDS

TYPE_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")
FIELD_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")

MAX_TYPES = 128
MAX_FIELDS = 256
MAX_ENUM_VALUES = 256
MAX_ENUM_VALUE_LENGTH = 256
MAX_DESCRIPTION_LENGTH = 2048

OWNERSHIPS = ("agent", "customer", "org")
FIELD_TYPES = ("string", "text", "enum", "number", "integer", "boolean", "array", "object")
# Masking rewrites strings; it cannot mask a number, a boolean or a closed enum value without
# breaking the field's type, so ``pii: true`` is only allowed where masking is possible.
MASKABLE_FIELD_TYPES = frozenset({"string", "text", "array", "object"})
SENSITIVITIES = ("normal", "high")
WRITE_MODES = {
    "cas": frozenset({"cas"}),
    "merge_by_key": frozenset({"merge_by_key"}),
    "both": frozenset({"cas", "merge_by_key"}),
}
OVER_CAP_POLICIES = ("keep_previous",)

DEFAULT_MAX_BYTES = 16_384
MAX_MAX_BYTES = 65_536
DEFAULT_RETENTION_DAYS = 30
MAX_RETENTION_DAYS = 180

# The marker a merge_by_key write uses to remove a field.
DELETE_MARKER = {"$delete": True}

_TYPE_KEYS = frozenset({"type", "ownership", "fields", "agent_state", "retention", "description"})
_FIELD_KEYS = frozenset({"type", "pii", "sensitivity", "values", "description"})
_AGENT_STATE_KEYS = frozenset({"scope", "max_bytes", "write", "over_cap"})
_DAYS_RE = re.compile(r"([0-9]{1,4})d")


@dataclass(frozen=True)
class FieldSpec:
    """One declared field, defaults filled."""

    name: str
    type: str
    pii: bool = False
    sensitivity: str = "normal"
    values: tuple[str, ...] | None = None
    description: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "pii": self.pii, "sensitivity": self.sensitivity}
        if self.values is not None:
            out["values"] = list(self.values)
        if self.description is not None:
            out["description"] = self.description
        return out


@dataclass(frozen=True)
class AgentStateSpec:
    """The ``agent_state`` section of an agent-owned type, defaults filled."""

    scope: str
    max_bytes: int = DEFAULT_MAX_BYTES
    modes: frozenset[str] = WRITE_MODES["both"]
    over_cap: str = "keep_previous"

    @property
    def write(self) -> str:
        """The declared ``write`` member, read back from the modes."""
        return next(name for name, modes in WRITE_MODES.items() if modes == self.modes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "max_bytes": self.max_bytes,
            "write": self.write,
            "over_cap": self.over_cap,
        }


@dataclass(frozen=True)
class ObjectType:
    """One validated object type. ``name`` is the document's ``type`` member."""

    name: str
    ownership: str
    fields: Mapping[str, FieldSpec] = field(default_factory=lambda: MappingProxyType({}))
    agent_state: AgentStateSpec | None = None
    retention_days: int = DEFAULT_RETENTION_DAYS
    # The fields the retention section names (at most the state's days); the others live as
    # long as the state: use ``retention_for``.
    field_retention_days: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    description: str | None = None

    def retention_for(self, field_name: str) -> int:
        """Days a field is kept after its own last write."""
        return self.field_retention_days.get(field_name, self.retention_days)

    @property
    def pii_fields(self) -> frozenset[str]:
        return frozenset(n for n, f in self.fields.items() if f.pii)

    def to_dict(self) -> dict[str, Any]:
        """The normalized document form (what Loom stores and answers with)."""
        out: dict[str, Any] = {
            "type": self.name,
            "ownership": self.ownership,
            "fields": {n: f.to_dict() for n, f in self.fields.items()},
        }
        if self.agent_state is not None:
            out["agent_state"] = self.agent_state.to_dict()
        retention: dict[str, Any] = {"state": f"{self.retention_days}d"}
        retention.update({n: f"{d}d" for n, d in self.field_retention_days.items()})
        out["retention"] = retention
        if self.description is not None:
            out["description"] = self.description
        return out


# --- validation ----------------------------------------------------------------------------------


def validate_object_types(types: Any, path: str = "types") -> tuple[ObjectType, ...]:
    """Validate the ``types`` list of an object-types document and normalize it.

    Raises ``SchemaRuleViolation(rule, message, field=<path>)`` on the first broken rule.
    """
    if not isinstance(types, list):
        raise SchemaRuleViolation("types_not_list", "types must be a list", field=path)
    if len(types) > MAX_TYPES:
        raise SchemaRuleViolation(
            "types_too_many", f"at most {MAX_TYPES} types, got {len(types)}", field=path
        )
    out: list[ObjectType] = []
    seen: set[str] = set()
    for i, raw in enumerate(types):
        here = f"{path}[{i}]"
        object_type = _validate_type(raw, here)
        if object_type.name in seen:
            raise SchemaRuleViolation(
                "type_name_duplicate",
                f"type '{object_type.name}' is declared twice",
                field=f"{here}.type",
            )
        seen.add(object_type.name)
        out.append(object_type)
    return tuple(out)


def _reject_unknown_keys(
    raw: Mapping[str, Any], allowed: frozenset[str], rule: str, here: str
) -> None:
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise SchemaRuleViolation(
            rule, f"unknown key(s): {', '.join(unknown)}", field=f"{here}.{unknown[0]}"
        )


def _description(raw: Mapping[str, Any], here: str) -> str | None:
    value = raw.get("description")
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_DESCRIPTION_LENGTH:
        raise SchemaRuleViolation(
            "description_invalid",
            f"description must be a string of at most {MAX_DESCRIPTION_LENGTH} characters",
            field=f"{here}.description",
        )
    return value


def _validate_type(raw: Any, here: str) -> ObjectType:
    if not isinstance(raw, Mapping):
        raise SchemaRuleViolation("type_not_object", "a type must be an object", field=here)
    _reject_unknown_keys(raw, _TYPE_KEYS, "type_unknown_key", here)

    name = raw.get("type")
    if not isinstance(name, str) or not TYPE_NAME_RE.fullmatch(name):
        raise SchemaRuleViolation(
            "type_name_invalid", "type must match [a-z][a-z0-9_]{0,63}", field=f"{here}.type"
        )

    ownership = raw.get("ownership")
    if ownership not in OWNERSHIPS:
        raise SchemaRuleViolation(
            "ownership_invalid",
            f"ownership must be one of {', '.join(OWNERSHIPS)}",
            field=f"{here}.ownership",
        )

    fields = _validate_fields(raw.get("fields", {}), f"{here}.fields")

    agent_state: AgentStateSpec | None = None
    if ownership == "agent":
        if raw.get("agent_state") is None:
            raise SchemaRuleViolation(
                "agent_state_required",
                "a type with ownership agent needs an agent_state section",
                field=f"{here}.agent_state",
            )
        agent_state = _validate_agent_state(raw["agent_state"], f"{here}.agent_state")
    elif "agent_state" in raw:
        raise SchemaRuleViolation(
            "agent_state_not_allowed",
            "only a type with ownership agent may carry agent_state",
            field=f"{here}.agent_state",
        )

    retention_days, field_retention = _validate_retention(
        raw.get("retention"), fields, f"{here}.retention"
    )
    return ObjectType(
        name=name,
        ownership=ownership,
        fields=MappingProxyType(fields),
        agent_state=agent_state,
        retention_days=retention_days,
        field_retention_days=MappingProxyType(field_retention),
        description=_description(raw, here),
    )


def _validate_fields(raw: Any, here: str) -> dict[str, FieldSpec]:
    if not isinstance(raw, Mapping):
        raise SchemaRuleViolation("fields_not_object", "fields must be an object", field=here)
    if len(raw) > MAX_FIELDS:
        raise SchemaRuleViolation(
            "fields_too_many", f"at most {MAX_FIELDS} fields, got {len(raw)}", field=here
        )
    out: dict[str, FieldSpec] = {}
    for name, spec in raw.items():
        where = f"{here}.{name}"
        if not isinstance(name, str) or not FIELD_NAME_RE.fullmatch(name):
            raise SchemaRuleViolation(
                "field_name_invalid", "field names must match [a-z][a-z0-9_]{0,63}", field=where
            )
        out[name] = _validate_field(name, spec, where)
    return out


def _validate_field(name: str, spec: Any, where: str) -> FieldSpec:
    if not isinstance(spec, Mapping):
        raise SchemaRuleViolation("field_not_object", "a field must be an object", field=where)
    _reject_unknown_keys(spec, _FIELD_KEYS, "field_unknown_key", where)

    kind = spec.get("type")
    if kind not in FIELD_TYPES:
        raise SchemaRuleViolation(
            "field_type_invalid",
            f"field type must be one of {', '.join(FIELD_TYPES)}",
            field=f"{where}.type",
        )

    pii = spec.get("pii", False)
    if not isinstance(pii, bool):
        raise SchemaRuleViolation(
            "field_pii_invalid", "pii must be a boolean", field=f"{where}.pii"
        )
    if pii and kind not in MASKABLE_FIELD_TYPES:
        raise SchemaRuleViolation(
            "field_pii_type",
            f"a {kind} field cannot be masked; declare pii fields as string, text, array or object",
            field=f"{where}.pii",
        )

    sensitivity = spec.get("sensitivity", "normal")
    if sensitivity not in SENSITIVITIES:
        raise SchemaRuleViolation(
            "field_sensitivity_invalid",
            "sensitivity must be normal or high",
            field=f"{where}.sensitivity",
        )

    values: tuple[str, ...] | None = None
    if "values" in spec and spec["values"] is not None:
        if kind != "enum":
            raise SchemaRuleViolation(
                "field_values_not_allowed",
                "only an enum field may list values",
                field=f"{where}.values",
            )
        values = _validate_enum_values(spec["values"], f"{where}.values")

    return FieldSpec(
        name=name,
        type=kind,
        pii=pii,
        sensitivity=sensitivity,
        values=values,
        description=_description(spec, where),
    )


def _validate_enum_values(raw: Any, where: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw or len(raw) > MAX_ENUM_VALUES:
        raise SchemaRuleViolation(
            "field_values_invalid",
            f"values must be a list of 1 to {MAX_ENUM_VALUES} strings",
            field=where,
        )
    for i, value in enumerate(raw):
        if not isinstance(value, str) or not 1 <= len(value) <= MAX_ENUM_VALUE_LENGTH:
            raise SchemaRuleViolation(
                "field_values_invalid",
                f"each value must be a string of 1 to {MAX_ENUM_VALUE_LENGTH} characters",
                field=f"{where}[{i}]",
            )
    if len(set(raw)) != len(raw):
        raise SchemaRuleViolation("field_values_duplicate", "values must not repeat", field=where)
    return tuple(raw)


def _validate_agent_state(raw: Any, here: str) -> AgentStateSpec:
    if not isinstance(raw, Mapping):
        raise SchemaRuleViolation(
            "agent_state_not_object", "agent_state must be an object", field=here
        )
    _reject_unknown_keys(raw, _AGENT_STATE_KEYS, "agent_state_unknown_key", here)

    scope = raw.get("scope")
    if scope not in SCOPE_KINDS:
        raise SchemaRuleViolation(
            "agent_state_scope_invalid",
            f"scope must be one of {', '.join(SCOPE_KINDS)}",
            field=f"{here}.scope",
        )

    max_bytes = raw.get("max_bytes", DEFAULT_MAX_BYTES)
    if not _is_int(max_bytes) or not 1 <= max_bytes <= MAX_MAX_BYTES:
        raise SchemaRuleViolation(
            "agent_state_max_bytes_invalid",
            f"max_bytes must be an integer from 1 to {MAX_MAX_BYTES}",
            field=f"{here}.max_bytes",
        )

    write = raw.get("write", "both")
    if not isinstance(write, str) or write not in WRITE_MODES:
        raise SchemaRuleViolation(
            "agent_state_write_invalid",
            "write must be cas, merge_by_key or both",
            field=f"{here}.write",
        )

    over_cap = raw.get("over_cap", "keep_previous")
    if over_cap not in OVER_CAP_POLICIES:
        raise SchemaRuleViolation(
            "agent_state_over_cap_invalid",
            "over_cap must be keep_previous",
            field=f"{here}.over_cap",
        )

    return AgentStateSpec(
        scope=scope, max_bytes=int(max_bytes), modes=WRITE_MODES[write], over_cap=over_cap
    )


def _is_int(value: Any) -> bool:
    # bool is an int in Python; true must not read as max_bytes 1.
    return isinstance(value, int) and not isinstance(value, bool)


def parse_days(value: Any) -> int | None:
    """``"30d"`` or an integer number of days; ``None`` when the value is neither."""
    if _is_int(value):
        return value
    if isinstance(value, str):
        m = _DAYS_RE.fullmatch(value.strip())
        if m:
            return int(m.group(1))
    return None


def _validate_retention(
    raw: Any, fields: Mapping[str, FieldSpec], here: str
) -> tuple[int, dict[str, int]]:
    if raw is None:
        return DEFAULT_RETENTION_DAYS, {}
    if not isinstance(raw, Mapping):
        raise SchemaRuleViolation("retention_not_object", "retention must be an object", field=here)

    state_days = DEFAULT_RETENTION_DAYS
    if "state" in raw:
        days = parse_days(raw["state"])
        if days is None or not 1 <= days <= MAX_RETENTION_DAYS:
            raise SchemaRuleViolation(
                "retention_state_invalid",
                f'retention.state must be "<n>d" or an integer, from 1 to {MAX_RETENTION_DAYS}',
                field=f"{here}.state",
            )
        state_days = days

    per_field: dict[str, int] = {}
    for name, value in raw.items():
        if name == "state":
            continue
        where = f"{here}.{name}"
        if name not in fields:
            raise SchemaRuleViolation(
                "retention_unknown_field",
                f"retention names '{name}', which is not a declared field",
                field=where,
            )
        days = parse_days(value)
        if days is None or days < 1:
            raise SchemaRuleViolation(
                "retention_field_invalid",
                'a field retention must be "<n>d" or an integer, at least 1',
                field=where,
            )
        if days > state_days:
            raise SchemaRuleViolation(
                "retention_field_exceeds_state",
                f"field retention {days}d is longer than the state's {state_days}d",
                field=where,
            )
        per_field[name] = days
    return state_days, per_field


def retention_fits(raw_type: Any) -> bool:
    """Whether one type's retention names declared fields only, each kept at most as long as
    the state (``x-loom-rules``' ``retention_fits``; a type that is no object keeps it)."""
    declared = raw_type.get("fields") if isinstance(raw_type, Mapping) else None
    if not isinstance(raw_type, Mapping) or not isinstance(declared or {}, Mapping):
        return True
    try:
        _validate_retention(raw_type.get("retention"), declared or {}, "retention")
    except SchemaRuleViolation:
        return False
    return True


# --- the registry as JSON Schema -----------------------------------------------------------------

# Days from 1 to MAX_RETENTION_DAYS (180) as parse_days reads them: at most four digits,
# leading zeros allowed, trimmed as str.strip() trims. tests/test_object_types.py holds it to
# parse_days for every string of up to four digits.
_DAYS_1_TO_180 = r"(?:0{0,3}[1-9]|0{0,2}[1-9][0-9]|0?1[0-7][0-9]|0?180)"
_NAME_PATTERN = f"^{TYPE_NAME_RE.pattern}$"
assert TYPE_NAME_RE.pattern == FIELD_NAME_RE.pattern  # one pattern states both


def _days_schema() -> dict[str, Any]:
    """A retention: "<n>d" or an integer, 1 to MAX_RETENTION_DAYS. A field's may not pass the
    state's, so no field's is above it either; that it is at most the state's is the
    validator's (two values compared)."""
    return {"anyOf": [
        {"type": "integer", "minimum": 1, "maximum": MAX_RETENTION_DAYS},
        {"type": "string", "pattern": f"^[{PY_SPACE}]*{_DAYS_1_TO_180}d[{PY_SPACE}]*$"},
    ]}


def _description_schema() -> dict[str, Any]:
    return {"type": "string", "maxLength": MAX_DESCRIPTION_LENGTH, "nullable": True}


def types_json_schema() -> dict[str, Any]:
    """The ``types`` list as JSON Schema (OpenAPI 3.0 words, plus ``patternProperties`` for
    the names of fields): every rule of ``validate_object_types`` JSON Schema can state.

    What it cannot state stays the validator's: type names unique across the list, retention
    naming declared fields only, and a field's retention at most the state's."""
    field_schema = {
        "type": "object",
        "required": ["type"],
        "additionalProperties": False,
        "properties": {
            "type": {"type": "string", "enum": list(FIELD_TYPES)},
            "pii": {"type": "boolean"},
            "sensitivity": {"type": "string", "enum": list(SENSITIVITIES)},
            "values": {
                "type": "array", "minItems": 1, "maxItems": MAX_ENUM_VALUES, "uniqueItems": True,
                "items": {"type": "string", "minLength": 1, "maxLength": MAX_ENUM_VALUE_LENGTH},
                "nullable": True,
            },
            "description": _description_schema(),
        },
        "allOf": [
            # pii only where masking is possible
            {"anyOf": [{"properties": {"pii": {"enum": [False]}}},
                       {"properties": {"type": {"enum": sorted(MASKABLE_FIELD_TYPES)}}}]},
            # values only on an enum field (null is values left out)
            {"anyOf": [{"properties": {"type": {"enum": ["enum"]}}},
                       {"properties": {"values": {"enum": [None], "nullable": True}}}]},
        ],
    }
    agent_state = {
        "type": "object",
        "required": ["scope"],
        "additionalProperties": False,
        "properties": {
            "scope": {"type": "string", "enum": list(SCOPE_KINDS)},
            "max_bytes": {"type": "integer", "minimum": 1, "maximum": MAX_MAX_BYTES},
            "write": {"type": "string", "enum": list(WRITE_MODES)},
            "over_cap": {"type": "string", "enum": list(OVER_CAP_POLICIES)},
        },
    }
    days = _days_schema()
    without_agent_state: dict[str, Any] = {
        key: {} for key in sorted(_TYPE_KEYS - {"agent_state"})}
    type_schema = {
        "type": "object",
        "required": ["type", "ownership"],
        "additionalProperties": False,
        "properties": {
            "type": {"type": "string", "pattern": _NAME_PATTERN},
            "ownership": {"type": "string", "enum": list(OWNERSHIPS)},
            "fields": {
                "type": "object", "maxProperties": MAX_FIELDS,
                "patternProperties": {_NAME_PATTERN: field_schema},
                "additionalProperties": False,
            },
            "agent_state": agent_state,
            "retention": {
                "type": "object", "nullable": True,
                # "state", or a field's name (a declared one: the validator's)
                "properties": {"state": days},
                "patternProperties": {_NAME_PATTERN: days},
                "additionalProperties": False,
            },
            "description": _description_schema(),
        },
        # An agent type carries agent_state, any other type none (a key the branch does not
        # name is refused: no "not", which schemathesis's coverage phase reads loosely).
        "anyOf": [
            {"properties": {"ownership": {"enum": ["agent"]}}, "required": ["agent_state"]},
            {"properties": {**without_agent_state,
                            "ownership": {"enum": [o for o in OWNERSHIPS if o != "agent"]}},
             "additionalProperties": False},
        ],
    }
    return {"type": "array", "maxItems": MAX_TYPES, "items": type_schema}


# --- choosing the schema of an agent's state ---------------------------------------------------


def _normalized_agent(agent: str) -> str:
    return re.sub(r"[^a-z0-9_]", "_", agent.strip().lower())


def state_type_for(types: Iterable[ObjectType], agent: str) -> ObjectType | None:
    """The type that gives ``agent``'s state its schema, or ``None`` (every write refused).

    Seed 002: "the type named like the agent or, when the registry declares exactly one type of
    that ownership, that one". "Named like" is read as, in this order: the type called exactly
    ``agent``, then ``<agent>_state`` (the seed's own example type is its agent's name followed
    by ``_state``), then the same two with the agent name lower-cased and every character
    outside ``[a-z0-9_]`` turned into ``_`` (agent names may hold dashes or dots, type names
    may not). Only agent-owned types count.
    """
    agent_types = [t for t in types if t.ownership == "agent"]
    by_name = {t.name: t for t in agent_types}
    normalized = _normalized_agent(agent)
    for candidate in (agent, f"{agent}_state", normalized, f"{normalized}_state"):
        if candidate in by_name:
            return by_name[candidate]
    if len(agent_types) == 1:
        return agent_types[0]
    return None


# --- checking a state body against its type ----------------------------------------------------


def check_declared(object_type: ObjectType | None, body: Mapping[str, Any]) -> list[str]:
    """Top-level names of ``body`` the type does not declare, in the body's order.

    With no type at all (``state_type_for`` found none), every field is undeclared, as the seed
    says. A non-empty answer refuses the write with ``not_declared_field``.
    """
    declared = object_type.fields if object_type is not None else {}
    return [name for name in body if name not in declared]


def is_delete_marker(value: Any) -> bool:
    """``{"$delete": true}`` exactly: the merge_by_key way to remove a field."""
    return isinstance(value, dict) and value == DELETE_MARKER and value["$delete"] is True


def value_error(spec: FieldSpec, value: Any) -> str | None:
    """Why ``value`` does not fit the field's type, or ``None`` when it does.

    ``null`` fits every type: code writes ``None`` for "no offer any more" and expects to read it
    back; removing the field is ``{"$delete": true}``. An integer field accepts 3.0 (JSON does
    not tell 3 from 3.0), a number field refuses NaN and infinities (Python's JSON reader
    accepts them, JSON does not), and booleans are never numbers.
    """
    if value is None:
        return None
    kind = spec.type
    if kind in ("string", "text"):
        return None if isinstance(value, str) else "must be a string"
    if kind == "enum":
        if not isinstance(value, str):
            return "must be a string"
        if spec.values is not None and value not in spec.values:
            return f"must be one of: {', '.join(spec.values)}"
        return None
    if kind == "boolean":
        return None if isinstance(value, bool) else "must be a boolean"
    if kind == "integer":
        if _is_int(value) or (isinstance(value, float) and value.is_integer()):
            return None
        return "must be an integer"
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "must be a number"
        return None if math.isfinite(value) else "must be a finite number"
    if kind == "array":
        return None if isinstance(value, list) else "must be an array"
    if kind == "object":
        return None if isinstance(value, dict) else "must be an object"
    return f"has an unknown field type {kind}"  # pragma: no cover - validated types only


def check_values(
    object_type: ObjectType,
    body: Mapping[str, Any],
    *,
    allow_delete: bool = False,
    path: str = "body",
) -> None:
    """Raise ``ValidationFailed`` (422) naming every declared field whose value has the wrong type.

    A wrong value type is a malformed request, not a schema gap, so it is a 422 rather than a
    ``stored: false`` answer: the code that sent it has a bug to fix, and nothing is written.
    Undeclared fields are skipped (``check_declared`` reports them). With ``allow_delete``
    (merge_by_key writes), ``{"$delete": true}`` is accepted for any declared field.
    """
    errors: dict[str, list[str]] = {}
    for name, value in body.items():
        spec = object_type.fields.get(name)
        if spec is None:
            continue
        if allow_delete and is_delete_marker(value):
            continue
        problem = value_error(spec, value)
        if problem is not None:
            errors[f"{path}.{name}"] = [problem]
    if errors:
        raise ValidationFailed(errors)
