"""The object-types document: every rule, the defaults, the schema choice, and value checks."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from app.errors import SchemaRuleViolation, ValidationFailed
from app.object_types import (
    DEFAULT_MAX_BYTES,
    DEFAULT_RETENTION_DAYS,
    MAX_FIELDS,
    MAX_TYPES,
    ObjectType,
    check_declared,
    check_values,
    is_delete_marker,
    parse_days,
    state_type_for,
    validate_object_types,
)

SEED_TYPE: dict[str, Any] = {
    "type": "shopping_agent_state",
    "ownership": "agent",
    "fields": {
        "step": {"type": "enum"},
        "offer": {"type": "string"},
        "cart_note": {"type": "text", "pii": True},
    },
    "agent_state": {"scope": "conversation", "max_bytes": 16384, "write": "both"},
    "retention": {"state": "30d", "cart_note": "7d"},
}


def _one(raw: dict[str, Any]) -> ObjectType:
    return validate_object_types([raw])[0]


def _with(**changes: Any) -> dict[str, Any]:
    raw = copy.deepcopy(SEED_TYPE)
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    return raw


def _violation(types: Any) -> SchemaRuleViolation:
    with pytest.raises(SchemaRuleViolation) as info:
        validate_object_types(types)
    assert info.value.status == 422
    assert info.value.code == "SCHEMA_INVALID"
    return info.value


# --- the seed's example and defaults -----------------------------------------------------------


def test_seed_example_validates_and_normalizes() -> None:
    t = _one(SEED_TYPE)
    assert t.name == "shopping_agent_state"
    assert t.ownership == "agent"
    assert set(t.fields) == {"step", "offer", "cart_note"}
    assert t.fields["cart_note"].pii is True
    assert t.fields["offer"].pii is False
    assert t.fields["offer"].sensitivity == "normal"
    assert t.fields["step"].values is None
    assert t.agent_state is not None
    assert t.agent_state.scope == "conversation"
    assert t.agent_state.max_bytes == 16384
    assert t.agent_state.modes == frozenset({"cas", "merge_by_key"})
    assert t.agent_state.over_cap == "keep_previous"
    assert t.retention_days == 30
    assert dict(t.field_retention_days) == {"cart_note": 7}
    assert t.retention_for("cart_note") == 7
    assert t.retention_for("offer") == 30
    assert t.pii_fields == frozenset({"cart_note"})


def test_defaults_filled() -> None:
    t = _one(
        {
            "type": "bot",
            "ownership": "agent",
            "fields": {"x": {"type": "string"}},
            "agent_state": {"scope": "task"},
        }
    )
    assert t.agent_state is not None
    assert t.agent_state.max_bytes == DEFAULT_MAX_BYTES == 16384
    assert t.agent_state.modes == frozenset({"cas", "merge_by_key"})
    assert t.agent_state.write == "both"
    assert t.agent_state.over_cap == "keep_previous"
    assert t.retention_days == DEFAULT_RETENTION_DAYS == 30
    assert dict(t.field_retention_days) == {}


def test_fields_default_to_empty() -> None:
    t = _one({"type": "bot", "ownership": "agent", "agent_state": {"scope": "task"}})
    assert dict(t.fields) == {}


def test_to_dict_round_trips() -> None:
    t = _one(SEED_TYPE)
    doc = t.to_dict()
    assert doc["retention"] == {"state": "30d", "cart_note": "7d"}
    assert doc["agent_state"] == {
        "scope": "conversation",
        "max_bytes": 16384,
        "write": "both",
        "over_cap": "keep_previous",
    }
    assert doc["fields"]["cart_note"] == {"type": "text", "pii": True, "sensitivity": "normal"}
    assert validate_object_types([doc])[0] == t


def test_normalized_types_are_read_only() -> None:
    t = _one(SEED_TYPE)
    with pytest.raises(TypeError):
        t.fields["new"] = t.fields["offer"]  # type: ignore[index]
    with pytest.raises(AttributeError):
        t.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    "write, modes",
    [
        ("cas", {"cas"}),
        ("merge_by_key", {"merge_by_key"}),
        ("both", {"cas", "merge_by_key"}),
    ],
)
def test_write_modes(write: str, modes: set[str]) -> None:
    t = _one(_with(agent_state={"scope": "conversation", "write": write}))
    assert t.agent_state is not None
    assert t.agent_state.modes == frozenset(modes)
    assert t.agent_state.write == write


@pytest.mark.parametrize("scope", ["conversation", "task", "object", "subject"])
def test_every_scope_kind(scope: str) -> None:
    t = _one(_with(agent_state={"scope": scope}))
    assert t.agent_state is not None and t.agent_state.scope == scope


@pytest.mark.parametrize("max_bytes", [1, 16384, 65536])
def test_max_bytes_bounds_inclusive(max_bytes: int) -> None:
    t = _one(_with(agent_state={"scope": "task", "max_bytes": max_bytes}))
    assert t.agent_state is not None and t.agent_state.max_bytes == max_bytes


@pytest.mark.parametrize("ownership", ["customer", "org"])
def test_other_ownerships_are_plain_types(ownership: str) -> None:
    t = _one(
        {
            "type": "customer_profile",
            "ownership": ownership,
            "fields": {"email": {"type": "string", "pii": True, "sensitivity": "high"}},
            "retention": {"state": 90, "email": "10d"},
        }
    )
    assert t.agent_state is None
    assert t.ownership == ownership
    assert t.fields["email"].sensitivity == "high"
    assert t.retention_days == 90
    assert t.retention_for("email") == 10
    assert "agent_state" not in t.to_dict()


def test_every_field_type_and_enum_values() -> None:
    fields = {
        "s": {"type": "string"},
        "t": {"type": "text"},
        "e": {"type": "enum", "values": ["a", "b"]},
        "n": {"type": "number"},
        "i": {"type": "integer"},
        "b": {"type": "boolean"},
        "arr": {"type": "array", "pii": True},
        "obj": {"type": "object", "pii": True, "description": "free form"},
    }
    t = _one(_with(fields=fields, retention=None))
    assert {n: f.type for n, f in t.fields.items()} == {n: f["type"] for n, f in fields.items()}
    assert t.fields["e"].values == ("a", "b")
    assert t.fields["obj"].description == "free form"


def test_retention_forms() -> None:
    assert _one(_with(retention={"state": 180})).retention_days == 180
    assert _one(_with(retention={"state": "1d"})).retention_days == 1
    t = _one(_with(retention={"state": "10d", "offer": 10, "cart_note": "1d"}))
    assert dict(t.field_retention_days) == {"offer": 10, "cart_note": 1}
    assert _one(_with(retention={})).retention_days == 30
    assert _one(_with(retention={"cart_note": "30d"})).retention_for("cart_note") == 30


@pytest.mark.parametrize(
    "value, days",
    [("30d", 30), (7, 7), (" 5d ", 5), ("30", None), ("3w", None), (True, None), (2.0, None)],
)
def test_parse_days(value: Any, days: int | None) -> None:
    assert parse_days(value) == days


def test_several_types_and_limits_inclusive() -> None:
    types = [{"type": f"t{i}", "ownership": "org", "fields": {}} for i in range(MAX_TYPES)]
    assert len(validate_object_types(types)) == MAX_TYPES
    fields = {f"f{i}": {"type": "string"} for i in range(MAX_FIELDS)}
    assert len(_one(_with(fields=fields, retention=None)).fields) == MAX_FIELDS
    long_name = "a" + "b" * 63
    assert _one(_with(type=long_name)).name == long_name
    assert long_name in _one(_with(fields={long_name: {"type": "text"}}, retention=None)).fields


def test_empty_document() -> None:
    assert validate_object_types([]) == ()


# --- every rule ----------------------------------------------------------------------------------


def _field(**spec: Any) -> dict[str, Any]:
    return _with(fields={"f": spec}, retention=None)


# Each refused document with the rule and the path the refusal names (tests/test_document_
# schemas.py holds the published JSON Schema to the same list).
RULE_VIOLATIONS: list[tuple[Any, str, str]] = [
        ({"types": []}, "types_not_list", "types"),
        ([{"type": f"t{i}", "ownership": "org"} for i in range(MAX_TYPES + 1)],
         "types_too_many", "types"),
        (["x"], "type_not_object", "types[0]"),
        ([_with(colour="red")], "type_unknown_key", "types[0].colour"),
        ([_with(type=None)], "type_name_invalid", "types[0].type"),
        ([_with(type="Bad")], "type_name_invalid", "types[0].type"),
        ([_with(type="1abc")], "type_name_invalid", "types[0].type"),
        ([_with(type="a" * 65)], "type_name_invalid", "types[0].type"),
        ([SEED_TYPE, SEED_TYPE], "type_name_duplicate", "types[1].type"),
        ([_with(ownership=None)], "ownership_invalid", "types[0].ownership"),
        ([_with(ownership="agents")], "ownership_invalid", "types[0].ownership"),
        ([_with(description=5)], "description_invalid", "types[0].description"),
        ([_with(fields=[])], "fields_not_object", "types[0].fields"),
        ([_with(fields={f"f{i}": {"type": "text"} for i in range(MAX_FIELDS + 1)},
                retention=None)], "fields_too_many", "types[0].fields"),
        ([_with(fields={"Bad": {"type": "text"}}, retention=None)], "field_name_invalid",
         "types[0].fields.Bad"),
        ([_with(fields={"a" * 65: {"type": "text"}}, retention=None)], "field_name_invalid",
         "types[0].fields." + "a" * 65),
        ([_with(fields={"f": "text"}, retention=None)], "field_not_object", "types[0].fields.f"),
        ([_field(type="text", pi=True)], "field_unknown_key", "types[0].fields.f.pi"),
        ([_field()], "field_type_invalid", "types[0].fields.f.type"),
        ([_field(type="date")], "field_type_invalid", "types[0].fields.f.type"),
        ([_field(type="text", pii="yes")], "field_pii_invalid", "types[0].fields.f.pii"),
        ([_field(type="number", pii=True)], "field_pii_type", "types[0].fields.f.pii"),
        ([_field(type="enum", pii=True)], "field_pii_type", "types[0].fields.f.pii"),
        ([_field(type="boolean", pii=True)], "field_pii_type", "types[0].fields.f.pii"),
        ([_field(type="integer", pii=True)], "field_pii_type", "types[0].fields.f.pii"),
        ([_field(type="text", sensitivity="secret")], "field_sensitivity_invalid",
         "types[0].fields.f.sensitivity"),
        ([_field(type="string", values=["a"])], "field_values_not_allowed",
         "types[0].fields.f.values"),
        ([_field(type="enum", values="a")], "field_values_invalid", "types[0].fields.f.values"),
        ([_field(type="enum", values=[])], "field_values_invalid", "types[0].fields.f.values"),
        ([_field(type="enum", values=["a", 3])], "field_values_invalid",
         "types[0].fields.f.values[1]"),
        ([_field(type="enum", values=["a", ""])], "field_values_invalid",
         "types[0].fields.f.values[1]"),
        ([_field(type="enum", values=["a", "a"])], "field_values_duplicate",
         "types[0].fields.f.values"),
        ([_field(type="text", description=["x"])], "description_invalid",
         "types[0].fields.f.description"),
        ([_with(agent_state=None)], "agent_state_required", "types[0].agent_state"),
        ([_with(ownership="customer")], "agent_state_not_allowed", "types[0].agent_state"),
        ([_with(agent_state="conversation")], "agent_state_not_object", "types[0].agent_state"),
        ([_with(agent_state={"scope": "task", "cap": 5})], "agent_state_unknown_key",
         "types[0].agent_state.cap"),
        ([_with(agent_state={})], "agent_state_scope_invalid", "types[0].agent_state.scope"),
        ([_with(agent_state={"scope": "user"})], "agent_state_scope_invalid",
         "types[0].agent_state.scope"),
        ([_with(agent_state={"scope": "task", "max_bytes": 0})], "agent_state_max_bytes_invalid",
         "types[0].agent_state.max_bytes"),
        ([_with(agent_state={"scope": "task", "max_bytes": 65537})],
         "agent_state_max_bytes_invalid", "types[0].agent_state.max_bytes"),
        ([_with(agent_state={"scope": "task", "max_bytes": "100"})],
         "agent_state_max_bytes_invalid", "types[0].agent_state.max_bytes"),
        ([_with(agent_state={"scope": "task", "max_bytes": True})],
         "agent_state_max_bytes_invalid", "types[0].agent_state.max_bytes"),
        ([_with(agent_state={"scope": "task", "max_bytes": 100.0})],
         "agent_state_max_bytes_invalid", "types[0].agent_state.max_bytes"),
        ([_with(agent_state={"scope": "task", "write": "append"})], "agent_state_write_invalid",
         "types[0].agent_state.write"),
        ([_with(agent_state={"scope": "task", "write": ["cas"]})], "agent_state_write_invalid",
         "types[0].agent_state.write"),
        ([_with(agent_state={"scope": "task", "over_cap": "truncate"})],
         "agent_state_over_cap_invalid", "types[0].agent_state.over_cap"),
        ([_with(retention="30d")], "retention_not_object", "types[0].retention"),
        ([_with(retention={"state": 0})], "retention_state_invalid", "types[0].retention.state"),
        ([_with(retention={"state": 181})], "retention_state_invalid",
         "types[0].retention.state"),
        ([_with(retention={"state": "181d"})], "retention_state_invalid",
         "types[0].retention.state"),
        ([_with(retention={"state": "30 days"})], "retention_state_invalid",
         "types[0].retention.state"),
        ([_with(retention={"state": True})], "retention_state_invalid",
         "types[0].retention.state"),
        ([_with(retention={"state": "30d", "nope": "1d"})], "retention_unknown_field",
         "types[0].retention.nope"),
        ([_with(retention={"state": "30d", "cart_note": "0d"})], "retention_field_invalid",
         "types[0].retention.cart_note"),
        ([_with(retention={"state": "30d", "cart_note": "soon"})], "retention_field_invalid",
         "types[0].retention.cart_note"),
        ([_with(retention={"state": "7d", "cart_note": "8d"})], "retention_field_exceeds_state",
         "types[0].retention.cart_note"),
        ([_with(retention={"cart_note": 31})], "retention_field_exceeds_state",
         "types[0].retention.cart_note"),
]  # fmt: skip


@pytest.mark.parametrize("types, rule, field", RULE_VIOLATIONS)
def test_rule_violations(types: Any, rule: str, field: str) -> None:
    err = _violation(types)
    assert err.rule == rule
    assert list(err.details["fields"]) == [field]
    assert err.to_dict()["rule"] == rule


def test_path_prefix() -> None:
    with pytest.raises(SchemaRuleViolation) as info:
        validate_object_types([{"type": "x", "ownership": "nobody"}], path="body.types")
    assert list(info.value.details["fields"]) == ["body.types[0].ownership"]


def test_error_names_the_right_index() -> None:
    good = _with(type="good")
    bad = _with(agent_state={"scope": "task", "max_bytes": 10**6})
    err = _violation([good, bad])
    assert list(err.details["fields"]) == ["types[1].agent_state.max_bytes"]


# --- state_type_for ------------------------------------------------------------------------------


def _agent_type(name: str) -> dict[str, Any]:
    return {"type": name, "ownership": "agent", "agent_state": {"scope": "task"}}


def _plain_type(name: str) -> dict[str, Any]:
    return {"type": name, "ownership": "customer"}


def test_state_type_named_exactly_like_the_agent() -> None:
    types = validate_object_types([_agent_type("planner"), _agent_type("planner_state")])
    t = state_type_for(types, "planner")
    assert t is not None and t.name == "planner"


def test_state_type_named_agent_state() -> None:
    types = validate_object_types([_agent_type("other"), _agent_type("shopping_agent_state")])
    t = state_type_for(types, "shopping_agent")
    assert t is not None and t.name == "shopping_agent_state"


def test_state_type_for_normalized_agent_name() -> None:
    types = validate_object_types([_agent_type("other"), _agent_type("shop_bot_state")])
    t = state_type_for(types, "Shop-Bot")
    assert t is not None and t.name == "shop_bot_state"


def test_only_agent_type_is_used_when_none_is_named_like_the_agent() -> None:
    types = validate_object_types([_plain_type("customer"), _agent_type("anything")])
    t = state_type_for(types, "planner")
    assert t is not None and t.name == "anything"


def test_no_type_when_several_agent_types_and_none_named() -> None:
    types = validate_object_types([_agent_type("a"), _agent_type("b")])
    assert state_type_for(types, "planner") is None


def test_no_type_when_no_agent_types() -> None:
    assert state_type_for(validate_object_types([_plain_type("planner")]), "planner") is None
    assert state_type_for((), "planner") is None


def test_named_type_of_other_ownership_is_ignored() -> None:
    types = validate_object_types([_plain_type("planner"), _agent_type("only_one")])
    t = state_type_for(types, "planner")
    assert t is not None and t.name == "only_one"


# --- checking a state body -----------------------------------------------------------------------


def test_check_declared_lists_undeclared_in_body_order() -> None:
    t = _one(SEED_TYPE)
    assert check_declared(t, {"step": "a", "zeta": 1, "offer": "x", "alpha": 2}) == [
        "zeta",
        "alpha",
    ]
    assert check_declared(t, {"step": "a", "offer": None}) == []
    assert check_declared(t, {}) == []


def test_check_declared_without_a_type_refuses_everything() -> None:
    assert check_declared(None, {"step": "a", "x": 1}) == ["step", "x"]


TYPED = _one(
    _with(
        fields={
            "s": {"type": "string"},
            "t": {"type": "text"},
            "e": {"type": "enum", "values": ["sizes", "checkout"]},
            "open_enum": {"type": "enum"},
            "n": {"type": "number"},
            "i": {"type": "integer"},
            "b": {"type": "boolean"},
            "arr": {"type": "array"},
            "obj": {"type": "object"},
        },
        retention=None,
    )
)


@pytest.mark.parametrize(
    "name, value",
    [
        ("s", "x"),
        ("t", ""),
        ("e", "sizes"),
        ("open_enum", "anything"),
        ("n", 1),
        ("n", -2.5),
        ("i", 3),
        ("i", 3.0),
        ("b", False),
        ("arr", [1, "a"]),
        ("obj", {"k": [1]}),
        ("s", None),
        ("obj", None),
    ],
)
def test_check_values_accepts(name: str, value: Any) -> None:
    check_values(TYPED, {name: value})


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("s", 3, "must be a string"),
        ("t", ["x"], "must be a string"),
        ("e", "payment", "must be one of: sizes, checkout"),
        ("e", 1, "must be a string"),
        ("open_enum", True, "must be a string"),
        ("n", "1", "must be a number"),
        ("n", True, "must be a number"),
        ("n", float("nan"), "must be a finite number"),
        ("n", float("inf"), "must be a finite number"),
        ("i", 3.5, "must be an integer"),
        ("i", False, "must be an integer"),
        ("i", "3", "must be an integer"),
        ("b", 0, "must be a boolean"),
        ("b", "true", "must be a boolean"),
        ("arr", {"a": 1}, "must be an array"),
        ("arr", "a,b", "must be an array"),
        ("obj", [], "must be an object"),
        ("obj", "{}", "must be an object"),
    ],
)
def test_check_values_refuses_with_422_naming_the_field(
    name: str, value: Any, message: str
) -> None:
    with pytest.raises(ValidationFailed) as info:
        check_values(TYPED, {name: value})
    err = info.value
    assert err.status == 422
    assert err.code == "VALIDATION_ERROR"
    assert err.details["fields"] == {f"body.{name}": [message]}


def test_check_values_reports_every_bad_field_and_skips_undeclared() -> None:
    with pytest.raises(ValidationFailed) as info:
        check_values(TYPED, {"s": 1, "b": "no", "undeclared": object(), "i": 2}, path="state")
    assert info.value.details["fields"] == {
        "state.s": ["must be a string"],
        "state.b": ["must be a boolean"],
    }


def test_delete_marker_only_in_merge_writes() -> None:
    check_values(TYPED, {"s": {"$delete": True}, "i": {"$delete": True}}, allow_delete=True)
    with pytest.raises(ValidationFailed):
        check_values(TYPED, {"s": {"$delete": True}})
    # An object field can hold the marker's shape as a plain value in a cas write.
    check_values(TYPED, {"obj": {"$delete": True}})


@pytest.mark.parametrize(
    "value, expected",
    [
        ({"$delete": True}, True),
        ({"$delete": 1}, False),
        ({"$delete": False}, False),
        ({"$delete": True, "x": 1}, False),
        ("$delete", False),
        (None, False),
    ],
)
def test_is_delete_marker(value: Any, expected: bool) -> None:
    assert is_delete_marker(value) is expected
