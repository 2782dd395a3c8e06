"""The profile schema rules, the output-cap estimate, the schema hash and answer validation."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest

from app.errors import SchemaRuleViolation
from app.profile_schema import (
    MAX_SCHEMA_BYTES,
    answer_value_count,
    canonical_json,
    max_tokens_for,
    null_profile,
    output_cap_estimate,
    schema_sha256,
    validate_answer,
    validate_profile_schema,
)

# The seed's example, verbatim.
SEED_SCHEMA: dict[str, Any] = {
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


def schema(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


def prop(kind: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "description": f"a {kind}", **extra}


def refused(doc: Any) -> SchemaRuleViolation:
    with pytest.raises(SchemaRuleViolation) as caught:
        validate_profile_schema(doc)
    return caught.value


# --- accepted --------------------------------------------------------------------------------


def test_seed_example_is_accepted() -> None:
    validate_profile_schema(SEED_SCHEMA)


def test_titles_at_every_level_additional_properties_false_and_identifiers_are_accepted() -> None:
    doc = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Profile",
        "description": "What the bot knows",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "name": prop(
                "string", title="Name", enum=["a", "b"], pattern="^[a-z]$", minLength=1, maxLength=1
            ),
            "age": prop("integer", title="Age", minimum=0, maximum=150),
            "score": prop("number", minimum=-1.5, maximum=1.5),
            "vip": prop("boolean", title="VIP"),
            "tags": prop(
                "array",
                title="Tags",
                maxItems=50,
                items={"type": "string", "title": "Tag", "maxLength": 10},
            ),
        },
    }
    validate_profile_schema(doc)


def test_limits_are_inclusive() -> None:
    validate_profile_schema(schema(**{f"p{i}": prop("boolean") for i in range(64)}))
    # 5 arrays of 50 plus 6 scalars: exactly 256 values.
    at_cap = {f"a{i}": prop("array", items={"type": "integer"}, maxItems=50) for i in range(5)}
    at_cap.update({f"s{i}": prop("boolean") for i in range(6)})
    assert answer_value_count(schema(**at_cap)) == 256
    validate_profile_schema(schema(**at_cap))


def test_size_limit_is_16_kib_of_canonical_json_inclusive() -> None:
    doc = schema(note=prop("string", maxLength=10))
    base = len(canonical_json(doc).encode())
    doc["properties"]["note"]["description"] += "x" * (MAX_SCHEMA_BYTES - base)
    assert len(canonical_json(doc).encode()) == MAX_SCHEMA_BYTES
    validate_profile_schema(doc)
    doc["properties"]["note"]["description"] += "x"
    assert refused(doc).rule == "too_large"


def test_size_counts_utf8_bytes_not_characters() -> None:
    doc = schema(note=prop("string", maxLength=10))
    doc["properties"]["note"]["description"] = "é" * 8200  # 8,200 characters, 16,400 bytes
    assert refused(doc).rule == "too_large"


def test_output_cap_boundary() -> None:
    # key "a": ceil((1 + 4) / 2) = 3 tokens; the value ceil(maxLength / 2).
    validate_profile_schema(schema(a=prop("string", maxLength=32762)))  # 3 + 16381 = 16384
    violation = refused(schema(a=prop("string", maxLength=32764)))  # 3 + 16382 = 16385
    assert violation.rule == "output_cap"
    assert "16385" in violation.message


# --- refused, one rule each ------------------------------------------------------------------

LONG = "x" * (MAX_SCHEMA_BYTES + 1)

REFUSALS: list[tuple[str, Any, str | None]] = [
    ("not_object", [], None),
    ("not_object", "schema", None),
    ("not_object", None, None),
    ("not_object", {"type": "array", "items": {"type": "string"}}, "type"),
    ("not_object", {"properties": {"a": prop("string")}}, "type"),
    ("not_object", {"type": "object"}, "properties"),
    ("too_large", schema(a=prop("string", description=LONG)), None),
    ("malformed", schema(a={"type": "text", "description": "d"}), "properties.a.type"),
    ("malformed", schema(a=prop("string", pattern="(")), "properties.a.pattern"),
    ("malformed", schema(a=prop("string", minLength=-1)), "properties.a.minLength"),
    (
        "malformed",
        schema(a=prop("array", items={"type": "string"}, maxItems=1.5)),
        "properties.a.maxItems",
    ),
    ("malformed", schema(a={"type": "string", "description": 7}), "properties.a.description"),
    ("malformed", {"type": "object", "properties": []}, "properties"),
    ("malformed", schema(a=prop("number", maximum=math.nan)), None),
    ("property_count", schema(), "properties"),
    ("property_count", schema(**{f"p{i}": prop("boolean") for i in range(65)}), "properties"),
    ("property_type", schema(a=prop("object")), "properties.a.type"),
    ("property_type", schema(a=prop("null")), "properties.a.type"),
    (
        "property_type",
        schema(a={"type": ["string", "null"], "description": "d"}),
        "properties.a.type",
    ),
    ("property_type", schema(a={"description": "untyped"}), "properties.a.type"),
    ("property_type", schema(a=True), "properties.a"),
    ("array_items", schema(a=prop("array")), "properties.a.items"),
    ("array_items", schema(a=prop("array", items={"type": "object"})), "properties.a.items.type"),
    (
        "array_items",
        schema(a=prop("array", items={"type": "array", "items": {"type": "string"}})),
        "properties.a.items.type",
    ),
    ("array_items", schema(a=prop("array", items={"enum": ["x"]})), "properties.a.items.type"),
    (
        "max_items",
        schema(a=prop("array", items={"type": "string"}, maxItems=51)),
        "properties.a.maxItems",
    ),
    ("missing_description", schema(a={"type": "string"}), "properties.a.description"),
    ("missing_description", schema(a=prop("string", description="")), "properties.a.description"),
    ("missing_description", schema(a=prop("string", description="  ")), "properties.a.description"),
    ("required_forbidden", {**schema(a=prop("string")), "required": ["a"]}, "required"),
    ("required_forbidden", {**schema(a=prop("string")), "required": []}, "required"),
    (
        "additional_properties",
        {**schema(a=prop("string")), "additionalProperties": True},
        "additionalProperties",
    ),
    (
        "additional_properties",
        {**schema(a=prop("string")), "additionalProperties": {}},
        "additionalProperties",
    ),
    (
        "additional_properties",
        {**schema(a=prop("string")), "additionalProperties": {"type": "string"}},
        "additionalProperties",
    ),
    (
        "unsupported_keyword",
        {**schema(a=prop("string")), "patternProperties": {}},
        "patternProperties",
    ),
    ("unsupported_keyword", {**schema(a=prop("string")), "$defs": {}}, "$defs"),
    ("unsupported_keyword", schema(a=prop("boolean", enum=[True])), "properties.a.enum"),
    (
        "unsupported_keyword",
        schema(a=prop("array", items={"type": "string"}, minItems=1)),
        "properties.a.minItems",
    ),
    ("string_constraint", schema(a=prop("string", format="email")), "properties.a.format"),
    ("string_constraint", schema(a=prop("string", default="x")), "properties.a.default"),
    ("string_constraint", schema(a=prop("string", required=["x"])), "properties.a.required"),
    ("string_constraint", schema(a=prop("string", enum=[1, 2])), "properties.a.enum"),
    ("string_constraint", schema(a=prop("string", enum=[])), "properties.a.enum"),
    (
        "string_constraint",
        schema(a=prop("string", minLength=5, maxLength=2)),
        "properties.a.minLength",
    ),
    (
        "string_constraint",
        schema(a=prop("array", items={"type": "string", "format": "uri"})),
        "properties.a.items.format",
    ),
    ("number_constraint", schema(a=prop("number", multipleOf=2)), "properties.a.multipleOf"),
    (
        "number_constraint",
        schema(a=prop("integer", exclusiveMinimum=0)),
        "properties.a.exclusiveMinimum",
    ),
    ("number_constraint", schema(a=prop("number", minimum=5, maximum=1)), "properties.a.minimum"),
    (
        "number_constraint",
        schema(a=prop("array", items={"type": "integer", "maxLength": 3})),
        "properties.a.items.maxLength",
    ),
    (
        "too_many_values",
        schema(
            **{f"a{i}": prop("array", items={"type": "integer"}, maxItems=50) for i in range(6)}
        ),
        "properties",
    ),
    # An array without maxItems counts as 50 values: six of them are 300.
    (
        "too_many_values",
        schema(**{f"a{i}": prop("array", items={"type": "boolean"}) for i in range(6)}),
        "properties",
    ),
    ("output_cap", schema(a=prop("string", maxLength=40000)), "properties"),
    (
        "output_cap",
        schema(a=prop("array", maxItems=50, items={"type": "string", "maxLength": 700})),
        "properties",
    ),
]


@pytest.mark.parametrize(
    ("rule", "doc", "field"),
    REFUSALS,
    ids=[f"{rule}-{i}" for i, (rule, _, _) in enumerate(REFUSALS)],
)
def test_each_rule_is_refused_by_name(rule: str, doc: Any, field: str | None) -> None:
    violation = refused(doc)
    assert violation.rule == rule, violation.message
    assert violation.code == "SCHEMA_INVALID"
    assert violation.status == 422
    assert violation.to_dict()["rule"] == rule
    if field is not None:
        assert list(violation.details["fields"]) == [field]
        assert field in violation.message


def test_every_documented_rule_is_exercised() -> None:
    rules = {rule for rule, _, _ in REFUSALS}
    assert rules == {
        "not_object",
        "too_large",
        "malformed",
        "property_count",
        "property_type",
        "array_items",
        "max_items",
        "missing_description",
        "required_forbidden",
        "additional_properties",
        "unsupported_keyword",
        "string_constraint",
        "number_constraint",
        "too_many_values",
        "output_cap",
    }


def test_validation_does_not_change_the_document() -> None:
    doc = copy.deepcopy(SEED_SCHEMA)
    validate_profile_schema(doc)
    assert doc == SEED_SCHEMA


def test_message_names_the_property() -> None:
    violation = refused(schema(home_city={"type": "string"}))
    assert "home_city" in violation.message
    assert list(violation.details["fields"]) == ["properties.home_city.description"]


# --- output-cap estimate ---------------------------------------------------------------------


def test_estimate_by_hand_for_a_small_schema() -> None:
    doc = schema(
        name=prop("string", maxLength=21),  # key 4, value 11
        tier=prop("string", enum=["free", "enterprise"]),  # key 4, value 5
        age=prop("integer"),  # key 4, value 12
        vip=prop("boolean"),  # key 4, value 12
        notes=prop("string"),  # key 5, value 48
        tags=prop("array", maxItems=3, items={"type": "string", "maxLength": 6}),  # 4, 3 * 3
        ratio=prop("number"),  # key 5, value 12
    )
    # keys: ceil((len + 4) / 2) -> name 4, tier 4, age 4 (7/2), vip 4, notes 5 (9/2), tags 4,
    # ratio 5 = 30; values: 11 + 5 + 12 + 12 + 48 + 9 + 12 = 109.
    assert output_cap_estimate(doc) == 139
    assert max_tokens_for(doc) == 32 + 139
    assert max_tokens_for(doc, base=64) == 64 + 139


def test_estimate_of_the_seed_example() -> None:
    # keys: preferred_name ceil(18/2)=9, timezone 12/2=6, languages ceil(13/2)=7 -> 22;
    # values: two free strings 48 + 48, and an array without maxItems: 50 strings of 48.
    assert output_cap_estimate(SEED_SCHEMA) == 22 + 96 + 50 * 48
    assert max_tokens_for(SEED_SCHEMA) == 32 + 2518


def test_estimate_takes_the_smaller_of_max_length_and_longest_enum() -> None:
    both = schema(a=prop("string", enum=["abcdefgh"], maxLength=100))
    assert output_cap_estimate(both) == 3 + 4
    both = schema(a=prop("string", enum=["abcdefgh"], maxLength=3))
    assert output_cap_estimate(both) == 3 + 2


def test_estimate_of_empty_arrays_and_zero_lengths() -> None:
    assert output_cap_estimate(schema(a=prop("array", maxItems=0, items={"type": "number"}))) == 3
    assert output_cap_estimate(schema(a=prop("string", maxLength=0))) == 3
    assert output_cap_estimate(schema(a=prop("string", maxLength=1))) == 3 + 1


def test_max_tokens_base_is_llm_max_tokens() -> None:
    from app.model.chat import LLM_MAX_TOKENS

    assert max_tokens_for(schema(a=prop("boolean"))) == LLM_MAX_TOKENS + 3 + 12


# --- schema hash -----------------------------------------------------------------------------


def test_sha_ignores_titles_at_every_level() -> None:
    titled = copy.deepcopy(SEED_SCHEMA)
    titled["title"] = "Profile"
    titled["properties"]["timezone"]["title"] = "Time zone"
    titled["properties"]["languages"]["items"]["title"] = "Language"
    assert schema_sha256(titled) == schema_sha256(SEED_SCHEMA)


def test_sha_ignores_property_and_keyword_order() -> None:
    reordered = {
        "properties": {
            "languages": {
                "description": "Languages they speak",
                "items": {"type": "string"},
                "type": "array",
            },
            "timezone": {"description": "IANA time zone, e.g. Europe/Berlin", "type": "string"},
            "preferred_name": {"description": "What the user asks to be called", "type": "string"},
        },
        "type": "object",
    }
    assert schema_sha256(reordered) == schema_sha256(SEED_SCHEMA)


def test_sha_is_over_the_properties_only() -> None:
    with_extras = {**SEED_SCHEMA, "description": "x", "additionalProperties": False}
    assert schema_sha256(with_extras) == schema_sha256(SEED_SCHEMA)
    expected_text = json.dumps(SEED_SCHEMA["properties"], sort_keys=True, separators=(",", ":"))
    import hashlib

    assert schema_sha256(SEED_SCHEMA) == hashlib.sha256(expected_text.encode()).hexdigest()


def test_sha_changes_with_what_the_model_reads() -> None:
    changed = copy.deepcopy(SEED_SCHEMA)
    changed["properties"]["timezone"]["description"] = "Where they live"
    assert schema_sha256(changed) != schema_sha256(SEED_SCHEMA)
    constrained = copy.deepcopy(SEED_SCHEMA)
    constrained["properties"]["languages"]["maxItems"] = 5
    assert schema_sha256(constrained) != schema_sha256(SEED_SCHEMA)


def test_a_property_named_title_is_data_not_a_title() -> None:
    with_title = copy.deepcopy(SEED_SCHEMA)
    with_title["properties"]["title"] = prop("string")
    validate_profile_schema(with_title)
    assert schema_sha256(with_title) != schema_sha256(SEED_SCHEMA)
    assert "title" in null_profile(with_title)


# --- answers ---------------------------------------------------------------------------------

ANSWER_SCHEMA = schema(
    name=prop("string", minLength=2, maxLength=5),
    tier=prop("string", enum=["free", "pro"]),
    code=prop("string", pattern="[0-9]{3}"),
    age=prop("integer", minimum=0, maximum=150),
    score=prop("number", minimum=-1, maximum=1),
    big=prop("integer"),
    ratio=prop("number"),
    vip=prop("boolean"),
    tags=prop("array", maxItems=2, items={"type": "string", "enum": ["a", "b"]}),
    counts=prop("array", items={"type": "integer"}),
)

GOOD_ANSWER: dict[str, Any] = {
    "name": "Sam",
    "tier": "pro",
    "code": "id-123",
    "age": 40,
    "score": 0.5,
    "big": 2**53,
    "ratio": 1e300,
    "vip": False,
    "tags": ["a", "b"],
    "counts": [1, 2, 3],
}


def test_a_good_answer_is_kept_whole_in_schema_order() -> None:
    validate_profile_schema(ANSWER_SCHEMA)
    out = validate_answer(ANSWER_SCHEMA, dict(reversed(list(GOOD_ANSWER.items()))))
    assert out == GOOD_ANSWER
    assert list(out) == list(ANSWER_SCHEMA["properties"])


BAD_VALUES: list[tuple[str, Any]] = [
    ("name", 42),  # wrong type
    ("name", "S"),  # under minLength
    ("name", "Samantha"),  # over maxLength
    ("tier", "gold"),  # outside enum
    ("tier", "PRO"),
    ("code", "abc"),  # pattern
    ("age", -1),  # under minimum
    ("age", 151),  # over maximum
    ("age", 3.5),  # not an integer
    ("age", "40"),  # a string of digits is still a string
    ("age", True),  # bool where a number is expected
    ("score", False),
    ("score", 2),
    ("ratio", math.nan),  # not finite
    ("ratio", math.inf),
    ("ratio", -math.inf),
    ("ratio", 2**53 + 1),  # an integer past 2^53 is refused under number too
    ("big", 2**53 + 1),  # integer past 2^53
    ("big", -(2**53) - 1),
    ("big", 1e300),  # integral float past 2^53
    ("vip", "true"),
    ("vip", 1),
    ("tags", "a"),  # not a list
    ("tags", ["a", "c"]),  # one bad item drops the whole array
    ("tags", ["a", "b", "a"]),  # over maxItems
    ("tags", ["a", None]),
    ("counts", [1] * 51),  # no maxItems: held to 50
    ("counts", [1, True]),
    ("counts", [1, 2**60]),
    ("counts", {"a": 1}),
]


@pytest.mark.parametrize(("name", "value"), BAD_VALUES)
def test_a_bad_value_becomes_null_and_only_that_one(name: str, value: Any) -> None:
    out = validate_answer(ANSWER_SCHEMA, {**GOOD_ANSWER, name: value})
    assert out[name] is None
    assert {k: v for k, v in out.items() if k != name} == {
        k: v for k, v in GOOD_ANSWER.items() if k != name
    }


def test_undeclared_keys_are_dropped_and_missing_ones_are_null() -> None:
    out = validate_answer(ANSWER_SCHEMA, {"name": "Sam", "password": "x", "extra": {"a": 1}})
    assert set(out) == set(ANSWER_SCHEMA["properties"])
    assert out["name"] == "Sam"
    assert all(v is None for k, v in out.items() if k != "name")


def test_integral_floats_are_integers() -> None:
    out = validate_answer(ANSWER_SCHEMA, {"age": 40.0, "counts": [1.0, 2]})
    assert out["age"] == 40 and isinstance(out["age"], int)
    assert out["counts"] == [1, 2] and all(isinstance(v, int) for v in out["counts"])


def test_edges_are_inside() -> None:
    out = validate_answer(
        ANSWER_SCHEMA,
        {"name": "Sa", "age": 150, "score": -1, "big": -(2**53), "tags": [], "counts": [0] * 50},
    )
    assert out["name"] == "Sa"
    assert out["age"] == 150
    assert out["score"] == -1
    assert out["big"] == -(2**53)
    assert out["tags"] == []
    assert out["counts"] == [0] * 50


def test_string_lengths_count_characters() -> None:
    assert validate_answer(ANSWER_SCHEMA, {"name": "Zoë🙂"})["name"] == "Zoë🙂"


@pytest.mark.parametrize("answer", [None, [], "text", 3, ["name", "Sam"]])
def test_an_answer_that_is_not_an_object_is_all_null(answer: Any) -> None:
    assert validate_answer(ANSWER_SCHEMA, answer) == null_profile(ANSWER_SCHEMA)


def test_null_profile_has_every_property() -> None:
    assert null_profile(SEED_SCHEMA) == {
        "preferred_name": None,
        "timezone": None,
        "languages": None,
    }
