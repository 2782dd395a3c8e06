"""Field rules of seeds 003 and 004 and of profile.structured, through the Flask app."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.clock import FrozenClock
from tests.support.api import op_helpers

WHO = {"namespace": "support", "agent": "triage-bot"}
call, ok = op_helpers(WHO)
# A version whose nanoseconds round up through a float (….320269490 → .320270).
ODD_VERSION_NS = 1_764_584_240_320_269_490


def _exact_iso(ns: int) -> str:
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=ns // 1000)
    return moment.isoformat().replace("+00:00", "Z")


def test_working_memory_set_without_char_limit_gives_the_default_cap(client):
    ok(client, "working_memory.set", block_key="state", content="x", char_limit=100)
    written = ok(client, "working_memory.set", block_key="state", content="y")
    assert written["char_limit"] == 4096
    block = ok(client, "working_memory.get", block_key="state")
    assert block["char_limit"] == 4096 and block["content"] == "y"


def test_profile_set_without_char_limit_gives_the_default_cap(client):
    ok(client, "profile.set", label="persona", value="Terse.", char_limit=100)
    written = ok(client, "profile.set", label="persona", value="Terse again.")
    assert written["char_limit"] == 8192
    long = "x" * 500  # over the old cap of 100, well under 8192
    assert call(client, "profile.set", label="persona", value=long)[0] == 200


def test_updated_at_is_the_version_as_a_time_exactly(app_factory):
    clock = FrozenClock()
    clock._ns = ODD_VERSION_NS
    client = app_factory(clock=clock).test_client()
    written = ok(client, "working_memory.set", block_key="state", content="x")
    assert written["version"] == ODD_VERSION_NS
    block = ok(client, "working_memory.get", block_key="state")
    assert block["updated_at"] == _exact_iso(ODD_VERSION_NS) == "2025-12-01T10:17:20.320269Z"
    ok(client, "memory.set", key="k", value="v")
    row = ok(client, "memory.get", key="k")["memory"]
    assert row["updated_at"] == _exact_iso(row["version"])


@pytest.mark.parametrize("bad", ["two\nlines", "nul\x00byte", "tab\tkey"])
@pytest.mark.parametrize(
    ("op", "field", "body"),
    [
        ("working_memory.set", "block_key", {"content": "x"}),
        ("working_memory.append", "block_key", {"addition": "x"}),
        ("working_memory.get", "block_key", {}),
        ("profile.set", "label", {"value": "x"}),
        ("profile.append", "label", {"addition": "x"}),
    ],
)
def test_a_key_with_a_control_character_is_refused_naming_the_field(client, op, field, body, bad):
    status, out = call(client, op, **{field: bad}, **body)
    assert status == 422
    error = out["error"]
    assert error["code"] == "VALIDATION_ERROR" and field in error["fields"]


def test_render_refuses_block_keys_with_control_characters(client):
    status, out = call(client, "working_memory.render", block_keys=["ok", "bad\nkey"])
    assert status == 422
    assert "block_keys" in out["error"]["fields"]


def test_profile_structured_answers_properties_in_the_schema_order(client):
    properties = {
        "zone": {"type": "string", "description": "Time zone"},
        "alias": {"type": "string", "description": "Preferred name"},
        "middle": {"type": "integer", "description": "Some number"},
    }
    schema = {"type": "object", "properties": properties}
    assert call(client, "profile_schema.set", json_schema=schema)[0] == 200
    answer = client.post("/v1/profile.structured",
                         json={**WHO, "user_id": "u-1"}).get_data(as_text=True)
    positions = [answer.index(f'"{name}"') for name in properties]
    assert positions == sorted(positions)
    got = ok(client, "profile_schema.get")["json_schema"]
    assert list(got["properties"]) == list(properties)
