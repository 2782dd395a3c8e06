"""profile_schema.set / get / clear through the app: rules refused by name, audited changes."""

from __future__ import annotations

import copy

import pytest

from app.ops.profile_schema import SEED_EXAMPLE_SCHEMA
from app.profile_schema import schema_sha256
from tests.support.api import op_helpers

NS = {"namespace": "support"}
call, _ = op_helpers(NS)


def test_set_get_clear_round_trip(client):
    status, out = call(client, "profile_schema.set", json_schema=SEED_EXAMPLE_SCHEMA)
    assert status == 200
    assert out["schema_sha256"] == schema_sha256(SEED_EXAMPLE_SCHEMA)
    assert out["set_by"] == "single-user" and out["set_at"].endswith("Z")
    status, got = call(client, "profile_schema.get")
    assert got["json_schema"] == SEED_EXAMPLE_SCHEMA
    assert got["schema_sha256"] == out["schema_sha256"]
    status, cleared = call(client, "profile_schema.clear")
    assert cleared["cleared"] is True and cleared["schema_sha256"] == out["schema_sha256"]
    status, got = call(client, "profile_schema.get")
    assert got["json_schema"] is None and got["schema_sha256"] == ""
    assert call(client, "profile_schema.clear")[1]["cleared"] is False


def test_titles_and_property_order_do_not_change_the_hash(client):
    first = call(client, "profile_schema.set", json_schema=SEED_EXAMPLE_SCHEMA)[1]
    reordered = copy.deepcopy(SEED_EXAMPLE_SCHEMA)
    reordered["title"] = "Profile"
    reordered["properties"] = dict(reversed(list(reordered["properties"].items())))
    reordered["properties"]["timezone"]["title"] = "TZ"
    second = call(client, "profile_schema.set", json_schema=reordered)[1]
    assert first["schema_sha256"] == second["schema_sha256"]


@pytest.mark.parametrize(
    "schema,rule",
    [
        ({"type": "array"}, "not_object"),
        ({"type": "object", "properties": {}}, "property_count"),
        ({"type": "object", "properties": {"a": {"type": "string"}}}, "missing_description"),
        ({"type": "object", "required": ["a"],
          "properties": {"a": {"type": "string", "description": "d"}}}, "required_forbidden"),
        ({"type": "object", "additionalProperties": True,
          "properties": {"a": {"type": "string", "description": "d"}}}, "additional_properties"),
        ({"type": "object",
          "properties": {"a": {"type": "object", "description": "d"}}}, "property_type"),
        ({"type": "object", "properties": {"a": {"type": "array", "description": "d",
                                                 "items": {"type": "string"},
                                                 "maxItems": 51}}}, "max_items"),
        ({"type": "object", "properties": {"a": {"type": "string", "description": "d",
                                                 "format": "email"}}}, "string_constraint"),
        ({"type": "object", "properties": {"a": {"type": "number", "description": "d",
                                                 "multipleOf": 2}}}, "number_constraint"),
        ({"type": "object", "properties": {
            f"p{i}": {"type": "array", "items": {"type": "string"}, "maxItems": 50,
                      "description": "d"} for i in range(6)}}, "too_many_values"),
        ({"type": "object", "properties": {
            f"p{i}": {"type": "string", "maxLength": 100000, "description": "d"}
            for i in range(3)}}, "output_cap"),
    ],
)
def test_each_rule_is_refused_with_its_name_and_nothing_is_stored(client, schema, rule):
    status, out = call(client, "profile_schema.set", json_schema=schema)
    assert status == 422
    assert out["error"]["code"] == "SCHEMA_INVALID"
    assert out["error"]["rule"] == rule
    assert call(client, "profile_schema.get")[1]["json_schema"] is None


def test_json_schema_must_be_an_object(client):
    status, out = call(client, "profile_schema.set", json_schema=["not", "a", "dict"])
    assert status == 422 and "json_schema" in out["error"]["fields"]


def test_set_and_clear_are_audited(client):
    first = call(client, "profile_schema.set", json_schema=SEED_EXAMPLE_SCHEMA)[1]
    changed = copy.deepcopy(SEED_EXAMPLE_SCHEMA)
    changed["properties"]["city"] = {"type": "string", "description": "Where they live"}
    second = call(client, "profile_schema.set", json_schema=changed)[1]
    call(client, "profile_schema.clear")
    status, audit = call(client, "audit.list")
    assert status == 200
    entries = [e for e in audit["entries"] if e["action"].startswith("profile_schema.")]
    assert [e["action"] for e in entries] == [
        "profile_schema.clear", "profile_schema.set", "profile_schema.set"
    ]
    newest_first = entries
    assert newest_first[2]["old_schema_sha256"] == ""
    assert newest_first[2]["new_schema_sha256"] == first["schema_sha256"]
    assert newest_first[1]["old_schema_sha256"] == first["schema_sha256"]
    assert newest_first[1]["new_schema_sha256"] == second["schema_sha256"]
    assert newest_first[0]["new_schema_sha256"] == ""
    assert all(e["actor"] == "single-user" for e in entries)
