"""What the OpenAPI document says beyond marshmallow's own conversion, so that it is exact.

apispec turns each schema's fields into JSON Schema; three things it cannot see are added here:

- a field's own validators that have a JSON Schema form (``no_control_characters`` becomes a
  ``pattern``), through ``field_properties``, registered on flask-smorest's converter;
- a rule over several fields of one schema (``key`` or ``memory_id``, exactly one), written as
  the schema's ``OPENAPI_RULES`` (and, for a rule only a token can meet otherwise,
  ``OPENAPI_RULES_WITHOUT_TOKEN``: auth off) and merged by ``LoomMarshmallowPlugin``; a rule
  JSON Schema cannot state at all is in ``x-loom-rules`` (``app.schemas.rules``);
- what this install requires of each op's identity (and that a write names one agent, not
  ``*``): with auth off nothing can fill
  ``namespace``, ``agent`` or ``user_id``, so each op that needs one lists it as required
  (with auth on the caller's token may fill it, and the description says so). A body is
  required exactly when its schema requires a field (an empty body reads as ``{}``).

Both schema additions are made by ``LoomMarshmallowPlugin.schema_helper``, apispec's hook for
a plugin's part of a schema component, as the component is built; the request body's
``required`` is written into the operation before it is given to ``spec.path``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from apispec.ext.marshmallow import MarshmallowPlugin
from apispec.ext.marshmallow.common import resolve_schema_instance
from flask_smorest import Api
from marshmallow import Schema, fields

from app.registry import Op
from app.schemas.common import (
    CONTROL_FREE_PATTERN,
    IdentityArgs,
    Moment,
    no_control_characters,
    null_means_absent,
)

# Every JSON value but null, in OpenAPI 3.0's words (it has no "null" type to negate).
ANY_VALUE_BUT_NULL = [{"type": kind} for kind in
                      ("string", "number", "boolean", "array", "object")]


def field_properties(self: Any, field: fields.Field, **kwargs: Any) -> dict[str, Any]:
    """JSON Schema for the validators apispec does not convert, and for an any-value field
    that refuses null (a schema with no type allows null)."""
    if no_control_characters in field.validators and "pattern" not in field.metadata:
        return {"pattern": CONTROL_FREE_PATTERN}
    if (type(field) is fields.Raw and not field.allow_none and not field.dump_only
            and not {"type", "anyOf", "oneOf"} & set(field.metadata)):
        return {"anyOf": ANY_VALUE_BUT_NULL}
    return {}


def state_null_as_absent(component: dict[str, Any], keys: frozenset[str], *,
                         json_schema_nulls: bool = False) -> dict[str, Any]:
    """Let each property in ``keys`` be null too: the API reads that null as the property left
    out (``app.schemas.common.null_means_absent``). OpenAPI 3.0 says it with ``nullable``,
    3.1 (JSON Schema) with a ``"null"`` type; an enum lists null as well."""
    for key in keys:
        prop = component.get("properties", {}).get(key)
        if prop is None:
            continue
        if "$ref" in prop or "allOf" in prop or "type" not in prop:
            continue  # nested schemas and any-value fields: top-level plain fields only
        if json_schema_nulls:
            kinds = prop["type"] if isinstance(prop["type"], list) else [prop["type"]]
            if "null" not in kinds:
                prop["type"] = [*kinds, "null"]
        else:
            prop["nullable"] = True
        if "enum" in prop and None not in prop["enum"]:
            prop["enum"] = [*prop["enum"], None]
    return component


def nulls_as_json_schema(node: Any) -> None:
    """``nullable`` said as JSON Schema, in place, at every level of a property's schema: a
    ``"null"`` type beside its type. A document's schema (object types, features) is written
    once, in OpenAPI 3.0's words; an enum keeps null only where it lists it, as in 3.0."""
    if isinstance(node, list):
        for item in node:
            nulls_as_json_schema(item)
        return
    if not isinstance(node, dict):
        return
    if node.get("nullable") is True:
        del node["nullable"]
        kinds = node.get("type")
        if isinstance(kinds, str):
            node["type"] = [kinds, "null"]
    for child in node.values():
        nulls_as_json_schema(child)


def identity_required(op: Op) -> tuple[str, ...]:
    """The identity fields a call must name when no token fills them (auth off)."""
    return tuple(
        name for name, needed in (
            ("namespace", op.needs_namespace), ("agent", op.needs_agent),
            ("user_id", op.needs_user is True),
        ) if needed
    )


# A pattern rather than a "not": schemathesis's coverage phase reads patterns exactly and has
# taken a value a "not" bars for a valid one. Both keep no_control_characters.
_A_USER = {"pattern": r"^(?!-$)[^\x00-\x1f\x7f]*$"}  # '-' is no user
_ONE_AGENT = {"pattern": r"^(?!\*$)[^\x00-\x1f\x7f]*$"}  # '*' (every agent) is for reads


@dataclass
class InputRules:
    """What the document adds to one input schema, from the ops that take it."""

    write: bool
    # Identity fields that no token can fill here (auth off), in the order the ops name them.
    identity: list[str] = dataclasses.field(default_factory=list)
    # A field that stands in for user_id (an op's ``needs_user`` name), with auth off.
    user_stand_in: str | None = None
    # No token fills anything: the schema's ``OPENAPI_RULES_WITHOUT_TOKEN`` hold too.
    without_token: bool = False


def input_rules(ops: Iterable[Op], auth_on: bool) -> dict[type[Schema], InputRules]:
    """Each body schema's rules; a schema shared by a read and a write is refused (only a
    read may name agent '*', and the component says which one it is)."""
    rules: dict[type[Schema], InputRules] = {}
    for op in ops:
        if op.http_method == "GET":
            continue
        write = op.kind != "read"
        found = rules.setdefault(op.args, InputRules(write=write, without_token=not auth_on))
        if found.write != write:
            raise ValueError(f"{op.args.__name__} is the input of a read and of a write: give "
                             f"{op.name} a schema of its own (only a read may name agent '*')")
        if auth_on:
            continue
        for name in identity_required(op):
            if name not in found.identity:
                found.identity.append(name)
        if isinstance(op.needs_user, str):
            found.user_stand_in = op.needs_user
    return rules


def _one_agent_writes(component: dict[str, Any]) -> None:
    """A write names one agent, unless it names a row by memory_id (app.auth)."""
    if "agent" not in component["properties"]:
        return
    if "memory_id" not in component["properties"]:
        component["properties"]["agent"].update(_ONE_AGENT)
        return
    for branch in component.get("oneOf", ()):
        if "memory_id" not in branch["required"]:
            branch["properties"]["agent"] = _ONE_AGENT


def _apply_input_rules(component: dict[str, Any], rules: InputRules) -> None:
    required = list(component.get("required", []))
    if rules.write:
        _one_agent_writes(component)
    for name in rules.identity:
        prop = component["properties"][name]
        prop.pop("nullable", None)
        prop.pop("default", None)
        if name == "user_id":
            prop.update(_A_USER)
        if name not in required:
            required.append(name)
    if rules.user_stand_in:
        # A user_id, or the field that stands in for it; null is either left out.
        component["anyOf"] = [
            {"required": ["user_id"], "properties": {"user_id": {"type": "string", **_A_USER}}},
            {"required": [rules.user_stand_in],
             "properties": {rules.user_stand_in: {"type": "string"}}},
        ]
    if required:
        component["required"] = required


class LoomMarshmallowPlugin(MarshmallowPlugin):
    """apispec's plugin, adding each schema's ``OPENAPI_RULES`` (rules over several fields)
    and, for an op's input schema, its ``InputRules``."""

    def __init__(self, inputs: dict[type[Schema], InputRules] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.inputs = inputs or {}

    def init_spec(self, spec: Any) -> None:
        super().init_spec(spec)
        # A moment is the text of its own pattern: RFC 3339's date-time format needs an offset,
        # which a moment may leave out (then UTC). Mapped by every Loom plugin, the served
        # document's and the SDK manifest's alike: apispec keeps the mapping per field class,
        # so a mapping made by one plugin only would reach the other by the order they ran in.
        self.map_to_openapi_type(Moment, "string", None)

    # MarshmallowPlugin's own signature, which apispec's BasePlugin does not declare.
    def schema_helper(  # type: ignore[override]
        self, name: Any, _: Any, schema: Any = None, **kwargs: Any
    ) -> Any:
        converted = super().schema_helper(name, _, schema=schema, **kwargs)
        if schema is None or converted is None:
            return converted
        schema_class = type(resolve_schema_instance(schema))
        rules = getattr(schema_class, "OPENAPI_RULES", None)
        if rules:
            converted.update(copy.deepcopy(rules))  # _apply_input_rules edits its own copy
        version = self.openapi_version
        json_schema_nulls = version is not None and (version.major, version.minor) >= (3, 1)
        if json_schema_nulls:  # a document's nested schemas (OPENAPI 3.0 words in metadata)
            properties = converted.get("properties", {})
            for name, prop in properties.items():
                # A copy: apispec hands a field's metadata over as it is, nested dicts and all,
                # and rewriting those in place changed every document built after this one.
                properties[name] = prop = copy.deepcopy(prop)
                nulls_as_json_schema(prop)
        if issubclass(schema_class, IdentityArgs):  # an op's input: null reads as left out
            state_null_as_absent(converted, null_means_absent(schema_class),
                                 json_schema_nulls=json_schema_nulls)
        inputs = self.inputs.get(schema_class)
        if inputs is not None:  # after: an identity no token fills is required, never null
            _apply_input_rules(converted, inputs)
            unfilled = getattr(schema_class, "OPENAPI_RULES_WITHOUT_TOKEN", None)
            if inputs.without_token and unfilled:
                converted.update(copy.deepcopy(unfilled))
        return converted


def body_required(op: Op, auth_on: bool) -> bool:
    """Whether the op's request body is required: its component requires a field or holds a
    rule that does (an empty body reads as ``{}``)."""
    if any(declared.required for declared in op.args().load_fields.values()):
        return True
    if not auth_on and (identity_required(op) or isinstance(op.needs_user, str)):
        return True
    rules = getattr(op.args, "OPENAPI_RULES", None) or {}
    return bool(rules.get("required")) or "oneOf" in rules or "anyOf" in rules


def get_parameters(api: Api, op: Op, in_path: set[str], auth_on: bool) -> list[dict[str, Any]]:
    """A GET op's inputs as parameters: its path segments, every other field in the query,
    each with its field's constraints (a query value is always a string)."""
    converter = api.ma_plugin.converter
    needed = () if auth_on else identity_required(op)
    parameters = []
    for name, field in op.args().load_fields.items():
        key = field.data_key or name
        schema = converter.field2property(field)
        description = schema.pop("description", "")
        if schema.pop("nullable", None) and schema.get("default", "") is None:
            del schema["default"]  # a query string has no null
        required = key in in_path or field.required or key in needed
        if required:
            schema.pop("default", None)
        parameters.append({
            "name": key,
            "in": "path" if key in in_path else "query",
            "required": required,
            "schema": schema,
            "description": description,
        })
    return parameters
