"""The published schemas of the documents with rules of their own (object types, profile
schemas) state every rule their validators enforce that JSON Schema can state.

Each refusal of the validators' own rule tests is refused by the schema the OpenAPI document
serves too, except the few listed here as no JSON Schema's (and those the schema accepts, so
the list stays exact); and on documents mutated at random the schema never refuses what the
validator takes. The validators stay the authority: their rule names and paths are unchanged
(tests/test_object_types.py, tests/test_profile_schema.py).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.errors import SchemaRuleViolation
from app.json_patterns import PY_SPACE
from app.object_types import parse_days, validate_object_types
from app.ops.namespace_config import EXAMPLE_TYPE
from app.ops.profile_schema import SEED_EXAMPLE_SCHEMA
from app.profile_schema import validate_profile_schema
from tests.conftest import make_app
from tests.test_object_types import RULE_VIOLATIONS, SEED_TYPE
from tests.test_profile_schema import REFUSALS, prop, schema

# What the object-types schema cannot state: a member's value unique across the list, a key
# naming a member elsewhere, two values compared.
TYPES_UNSTATED = {"type_name_duplicate", "retention_unknown_field",
                  "retention_field_exceeds_state"}


def _profile_unstated(violation: SchemaRuleViolation) -> bool:
    """What the profile schema's schema cannot state: sizes of the canonical JSON and of a
    full answer, a pattern that compiles, two bounds compared, a number JSON cannot carry."""
    field = ", ".join(violation.details.get("fields") or {})
    return (violation.rule in {"too_large", "too_many_values", "output_cap"}
            or (violation.rule == "malformed" and (field.endswith(".pattern")
                                                   or "not plain JSON" in violation.message))
            or violation.message.endswith(("minLength is above maxLength",
                                           "minimum is above maximum")))


def _as_json_schema(node: Any) -> Any:
    """OpenAPI 3.0's ``nullable`` as JSON Schema, as schemathesis reads it: null allowed too,
    unless an enum leaves it out."""
    if isinstance(node, list):
        return [_as_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _as_json_schema(value) for key, value in node.items() if key != "nullable"}
    if node.get("nullable") is True and None in out.get("enum", [None]):
        return {"anyOf": [out, {"type": "null"}]}
    return out


def _published(document: dict[str, Any], path: str, name: str) -> jsonschema.Validator:
    body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    component = body["schema"]["$ref"].rsplit("/", 1)[1]
    field = document["components"]["schemas"][component]["properties"][name]
    published = _as_json_schema(field)
    jsonschema.Draft202012Validator.check_schema(published)
    return jsonschema.Draft202012Validator(published)


@pytest.fixture(scope="module")
def document(data_plane_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # Once for the module: serving the document reads and writes nothing.
    app = make_app(data_plane_url, tmp_path_factory.mktemp("document"))
    return app.test_client().get("/openapi.json").get_json()


@pytest.fixture(scope="module")
def types_schema(document) -> jsonschema.Validator:
    return _published(document, "/v1/object_types.set", "types")


@pytest.fixture(scope="module")
def profile_schema(document) -> jsonschema.Validator:
    return _published(document, "/v1/profile_schema.set", "json_schema")


def _refusal(validate: Callable[[Any], Any], doc: Any) -> SchemaRuleViolation | None:
    try:
        validate(doc)
    except SchemaRuleViolation as violation:
        return violation
    return None


# --- the validators' own refusals -------------------------------------------------------------


@pytest.mark.parametrize(("types", "rule", "field"), RULE_VIOLATIONS)
def test_the_object_types_schema_refuses_what_the_validator_does(types_schema, types: Any,
                                                                 rule: str, field: str) -> None:
    violation = _refusal(validate_object_types, types)
    assert violation is not None and violation.rule == rule
    max_bytes = field.endswith(".max_bytes") and isinstance(
        types[0]["agent_state"]["max_bytes"], float)
    if rule in TYPES_UNSTATED or max_bytes:  # JSON Schema's integer counts 100.0 in
        assert types_schema.is_valid(types), "stated now: take it off the unstated list"
    else:
        assert not types_schema.is_valid(types), (rule, field)


@pytest.mark.parametrize(("rule", "doc", "field"), REFUSALS)
def test_the_profile_schema_schema_refuses_what_the_validator_does(profile_schema, rule: str,
                                                                   doc: Any, field: Any) -> None:
    violation = _refusal(validate_profile_schema, doc)
    assert violation is not None and violation.rule == rule
    if _profile_unstated(violation):
        assert profile_schema.is_valid(doc), "stated now: take it off the unstated list"
    else:
        assert not profile_schema.is_valid(doc), (rule, field)


VALID_TYPES: list[Any] = [
    [],
    [EXAMPLE_TYPE, SEED_TYPE],
    [{"type": "crm_contact", "ownership": "customer", "description": None, "retention": None,
      "fields": {"email": {"type": "string", "pii": True, "sensitivity": "high",
                           "values": None, "description": "where to write"},
                 "tier": {"type": "enum", "values": ["a", "b"], "pii": False},
                 "state": {"type": "integer"}}}],
    [{"type": "t", "ownership": "agent",
      "agent_state": {"scope": "subject", "max_bytes": 65536, "write": "cas",
                      "over_cap": "keep_previous"},
      "fields": {"state": {"type": "object"}, "n": {"type": "number"}},
      "retention": {"state": " 0180d\t", "n": 180}}],
]

VALID_PROFILE_SCHEMAS: list[Any] = [
    SEED_EXAMPLE_SCHEMA,
    {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "urn:x#",
     "$comment": "c", "title": "P", "description": "", "type": "object",
     "additionalProperties": False,
     "properties": {
         "name": prop("string", title="Name", enum=["a"], pattern="^a$", minLength=0,
                      maxLength=1),
         "age": prop("integer", minimum=0, maximum=1.5),
         "vip": prop("boolean", title="VIP", description=" x "),
         "tags": prop("array", maxItems=50, items={"type": "number", "minimum": -1,
                                                    "description": "", "title": "t"}),
         "flags": prop("array", maxItems=0, items={"type": "boolean"}),
     }},
    schema(**{f"p{i}": prop("boolean") for i in range(64)}),
]


@pytest.mark.parametrize("types", VALID_TYPES)
def test_a_registry_the_validator_takes_the_schema_takes(types_schema, types: Any) -> None:
    validate_object_types(types)
    assert types_schema.is_valid(types), list(types_schema.iter_errors(types))


@pytest.mark.parametrize("doc", VALID_PROFILE_SCHEMAS)
def test_a_profile_schema_the_validator_takes_the_schema_takes(profile_schema, doc: Any) -> None:
    validate_profile_schema(doc)
    assert profile_schema.is_valid(doc), list(profile_schema.iter_errors(doc))


def test_retention_days_are_stated_as_parse_days_reads_them(document) -> None:
    types = _published(document, "/v1/object_types.set", "types").schema
    days_schema = jsonschema.Draft202012Validator(
        types["items"]["properties"]["retention"]["anyOf"][0]["properties"]["state"])
    texts = {str(n) for n in range(0, 10_000, 7)} | {f"{n:0{width}d}" for n in range(200)
                                                     for width in (1, 2, 3, 4, 5)}
    spaces = ["", " ", "\t", "\x1c", "\u3000", "\ufeff", "\n", "x"]
    for text in sorted(texts):
        for space in spaces:
            value = f"{space}{text}d{space}"
            days = parse_days(value)
            assert days_schema.is_valid(value) is (days is not None and 1 <= days <= 180), value
    for value in (0, 1, 180, 181, True, 30.5, None, [30]):
        days = parse_days(value)
        assert days_schema.is_valid(value) is (days is not None and 1 <= days <= 180), value
    # every character str.strip() trims is in the pattern's class
    assert all(days_schema.is_valid(f"{chr(c)}30d") for c in range(0x3001) if chr(c).isspace())
    assert PY_SPACE


# --- documents mutated at random --------------------------------------------------------------

_VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 2.5, 50, 51, 181, 65537, "", " ", "\u3000", "x", "Bad", "30d",
    " 7d ", "0d", "string", "text", "enum", "number", "integer", "boolean", "array", "object",
    "agent", "customer", "conversation", "both", "cas", "keep_previous", "high", "(", "^a$",
    [], ["a"], ["a", "a"], [1], {}, {"type": "string"}, {"type": "string", "description": "d"},
    {"type": "text"}, {"scope": "task"},
]
_KEYS = [
    "type", "description", "title", "enum", "pattern", "minLength", "maxLength", "minimum",
    "maximum", "items", "maxItems", "minItems", "properties", "additionalProperties",
    "required", "format", "$id", "$schema", "$defs", "ownership", "fields", "agent_state",
    "retention", "pii", "values", "sensitivity", "scope", "max_bytes", "write", "over_cap",
    "state", "cart_note", "offer", "Bad", "colour",
]


# Values near each key's edges, so that many mutated documents stay valid.
_NEAR: dict[str, list[Any]] = {
    "type": ["string", "number", "integer", "boolean", "array", "object", "enum", "text",
             "t2", "Bad"],
    "description": ["d", "", " ", "\u3000x", None, "x" * 2049],
    "title": ["t", ""], "pattern": ["^a$", "(", "a|b"], "$id": ["urn:x", "urn:x#", "a#b"],
    "minLength": [0, 3, -1], "maxLength": [0, 3, 2.5], "minimum": [-1.5, 0, 3],
    "maximum": [0, 3, 1e300], "maxItems": [0, 50, 51], "enum": [["a"], ["a", "a"], [], [1]],
    "items": [{"type": "string"}, {"type": "integer", "minimum": 0}, {"type": "object"}],
    "additionalProperties": [False, True], "ownership": ["agent", "customer", "org", "user"],
    "pii": [True, False, None], "sensitivity": ["normal", "high", "low"],
    "values": [None, ["a"], ["a", "b"], [], ["a", "a"]],
    "scope": ["conversation", "task", "object", "subject", "user"],
    "max_bytes": [1, 65536, 0, 65537], "write": ["cas", "merge_by_key", "both", "append"],
    "over_cap": ["keep_previous", "drop"], "state": ["30d", 30, "180d", " 1d", 0, "181d"],
    "cart_note": ["7d", 7, "31d", 0], "offer": [{"type": "string"}, "1d"],
}


def _containers(node: Any) -> list[Any]:
    found = [node] if isinstance(node, dict | list) else []
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
    for child in children:
        found.extend(_containers(child))
    return found


@st.composite
def _mutated(draw: st.DrawFn, seeds: list[Any]) -> Any:
    doc = copy.deepcopy(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 2))):
        containers = _containers(doc)
        if not containers:
            return doc
        target = draw(st.sampled_from(containers))
        # A value from the pool, or a part of the document moved elsewhere.
        value = copy.deepcopy(draw(st.sampled_from(_VALUES + containers[:8])))
        if isinstance(target, dict):
            key = draw(st.sampled_from(sorted(target) or _KEYS) if draw(st.booleans())
                       else st.sampled_from(_KEYS))
            if key in target and draw(st.integers(0, 3)) == 0:
                del target[key]
            else:
                near = _NEAR.get(key)
                if near and draw(st.integers(0, 3)):
                    value = copy.deepcopy(draw(st.sampled_from(near)))
                target[key] = value
        elif target and draw(st.booleans()):
            target[draw(st.integers(0, len(target) - 1))] = value
        else:
            target.append(value)
    return doc


def _agrees(schema_ok: bool, violation: SchemaRuleViolation | None,
            unstated: Callable[[SchemaRuleViolation], bool]) -> None:
    if violation is None:  # never refused by the document when the validator takes it
        assert schema_ok
    elif schema_ok:  # taken by the document only where no JSON Schema can say
        assert unstated(violation), (violation.rule, violation.message)


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(types=_mutated(VALID_TYPES[1:]))
def test_mutated_registries_agree(types_schema, types: Any) -> None:
    violation = _refusal(validate_object_types, types)
    floats = '.0,' in json.dumps(types) or '.0}' in json.dumps(types)
    _agrees(types_schema.is_valid(types), violation,
            lambda v: v.rule in TYPES_UNSTATED or floats)


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(doc=_mutated(VALID_PROFILE_SCHEMAS[:2]))
def test_mutated_profile_schemas_agree(profile_schema, doc: Any) -> None:
    assert not any(isinstance(v, float) and not math.isfinite(v) for v in _VALUES)
    _agrees(profile_schema.is_valid(doc), _refusal(validate_profile_schema, doc),
            _profile_unstated)


def test_building_the_sdk_manifest_leaves_the_served_document_as_it_was(
        document, data_plane_url: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    # The manifest says nulls in OpenAPI 3.1's words; rewriting the fields' nested schemas in
    # place once changed every document served after it in the same process.
    from app.sdk_manifest import build_manifest

    build_manifest()
    again = make_app(data_plane_url, tmp_path_factory.mktemp("document-again"))
    assert again.test_client().get("/openapi.json").get_json() == document
