"""working_memory.* through the Flask app against a real redis-server (seed 004)."""

from __future__ import annotations

import re

import pytest

from tests.support.api import op_helpers

NS = {"namespace": "support", "agent": "triage-bot"}
call, _ = op_helpers(NS, prefix="working_memory.")


def test_set_defaults_and_answer_fields(client):
    status, out = call(client, "set", content="cursor: ticket 4812")
    assert status == 200
    assert out["block_key"] == "scratchpad"
    assert out["char_limit"] == 4096
    assert out["value_length"] == len("cursor: ticket 4812")
    assert out["fill_ratio"] == round(19 / 4096, 3)
    assert isinstance(out["version"], int) and out["version"] > 1_700_000_000 * 10**9
    assert out["ignored_args"] == []


def test_unknown_fields_are_served_and_named(client):
    status, out = call(client, "set", content="x", colour="blue", extra=1)
    assert status == 200
    assert sorted(out["ignored_args"]) == ["colour", "extra"]


def test_get_found_and_missing(client):
    call(client, "set", content="hello", block_key="state", char_limit=10)
    status, out = call(client, "get", block_key="state")
    assert status == 200
    assert out["found"] is True
    assert out["content"] == "hello"
    assert out["char_limit"] == 10
    assert out["fill_ratio"] == 0.5
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", out["updated_at"])
    assert out["version_text"] == str(out["version"])  # exact above 2^53, where JSON is not
    status, out = call(client, "get", block_key="nothing")
    assert status == 200
    assert out == {
        "found": False,
        "block_key": "nothing",
        "content": "",
        "char_limit": 4096,
        "version": 0,
        "version_text": "0",
        "updated_at": None,
        "fill_ratio": 0.0,
        "ignored_args": [],
    }


def test_empty_content_stores_an_empty_block(client):
    status, out = call(client, "set")
    assert status == 200 and out["value_length"] == 0
    assert call(client, "get")[1]["found"] is True


def test_set_over_the_limit_is_refused_and_changes_nothing(client):
    call(client, "set", content="keep me", char_limit=10)
    status, out = call(client, "set", content="x" * 11, char_limit=10)
    assert status == 422
    assert out["error"]["code"] == "WORKING_MEMORY_LIMIT_EXCEEDED"
    assert out["error"]["value_length"] == 11
    assert out["error"]["char_limit"] == 10
    assert call(client, "get")[1]["content"] == "keep me"


def test_default_limit_counts_characters_not_bytes(client):
    status, _ = call(client, "set", content="é" * 4096)
    assert status == 200
    status, out = call(client, "set", content="é" * 4097)
    assert status == 422 and out["error"]["value_length"] == 4097


def test_set_without_char_limit_gives_the_default_cap(client):
    call(client, "set", content="a", char_limit=16384)
    status, out = call(client, "set", content="b" * 5000)
    assert status == 422 and out["error"]["char_limit"] == 4096
    status, out = call(client, "set", content="c", char_limit=100)
    assert out["char_limit"] == 100


@pytest.mark.parametrize(
    "value", [0, -1, 16385, "5", 5.5, True, [4]]
)
def test_char_limit_bounds_and_types(client, value):
    status, out = call(client, "set", content="x", char_limit=value)
    assert status == 422
    assert out["error"]["code"] == "VALIDATION_ERROR"
    assert "char_limit" in out["error"]["fields"]


def test_char_limit_largest_is_accepted(client):
    status, out = call(client, "set", content="x" * 16384, char_limit=16384)
    assert status == 200 and out["fill_ratio"] == 1.0


def test_block_key_length(client):
    assert call(client, "set", block_key="k" * 80)[0] == 200
    for bad in ("k" * 81, "", 7):
        status, out = call(client, "set", block_key=bad)
        assert status == 422 and "block_key" in out["error"]["fields"]


@pytest.mark.parametrize("field,value", [("content", 5), ("content", ["a"]), ("user_id", 3)])
def test_wrong_types_are_422_naming_the_field(client, field, value):
    status, out = call(client, "set", **{field: value})
    assert status == 422 and field in out["error"]["fields"]


def test_append_creates_then_appends_with_separator(client):
    status, out = call(client, "append", addition="step 1", block_key="log")
    assert status == 200 and out["char_limit"] == 4096 and out["value_length"] == 6
    call(client, "append", addition="step 2", block_key="log")
    call(client, "append", addition="step 3", block_key="log", separator=" | ")
    assert call(client, "get", block_key="log")[1]["content"] == "step 1\nstep 2 | step 3"


def test_append_requires_addition(client):
    status, out = call(client, "append")
    assert status == 422 and "addition" in out["error"]["fields"]


def test_append_past_the_limit_is_refused_and_changes_nothing(client):
    call(client, "set", content="12345", char_limit=8)
    status, out = call(client, "append", addition="67")  # 5 + 1 + 2 = 8: fits
    assert status == 200 and out["fill_ratio"] == 1.0
    status, out = call(client, "append", addition="x")
    assert status == 422
    assert out["error"] == {
        "code": "WORKING_MEMORY_LIMIT_EXCEEDED",
        "message": out["error"]["message"],
        "value_length": 10,
        "char_limit": 8,
    }
    assert call(client, "get")[1]["content"] == "12345\n67"


def test_append_to_a_new_block_over_the_default_cap_is_refused(client):
    status, out = call(client, "append", addition="x" * 4097)
    assert status == 422 and out["error"]["char_limit"] == 4096
    assert call(client, "get")[1]["found"] is False


def test_replace_every_occurrence(client):
    call(client, "set", content="a-b-a-b-a")
    status, out = call(client, "replace", old="a", new="xyz")
    assert status == 200 and out["value_length"] == len("xyz-b-xyz-b-xyz")
    assert call(client, "get")[1]["content"] == "xyz-b-xyz-b-xyz"


def test_replace_with_default_new_deletes(client):
    call(client, "set", content="lease: held; lease: held")
    call(client, "replace", old="lease: ")
    assert call(client, "get")[1]["content"] == "held; held"


def test_replace_non_ascii(client):
    call(client, "set", content="Grüße, Grüße und ünd")
    status, out = call(client, "replace", old="ü", new="ue")
    assert status == 200
    assert call(client, "get")[1]["content"] == "Grueße, Grueße und uend"
    assert out["value_length"] == len("Grueße, Grueße und uend")


def test_replace_absent_text_and_missing_block(client):
    call(client, "set", content="hello")
    status, out = call(client, "replace", old="bye", new="x")
    assert status == 422 and out["error"]["code"] == "SUBSTRING_NOT_FOUND"
    status, out = call(client, "replace", old="x", new="y", block_key="missing")
    assert status == 404 and out["error"]["code"] == "WORKING_MEMORY_BLOCK_NOT_FOUND"
    status, out = call(client, "replace", old="", new="y")
    assert status == 422 and "old" in out["error"]["fields"]


def test_replace_past_the_limit_is_refused(client):
    call(client, "set", content="aaaa", char_limit=6)
    status, out = call(client, "replace", old="a", new="bb")
    assert status == 422 and out["error"]["value_length"] == 8
    assert call(client, "get")[1]["content"] == "aaaa"


def test_delete(client):
    call(client, "set", content="x", block_key="gone")
    status, out = call(client, "delete", block_key="gone")
    assert (status, out["deleted"], out["block_key"]) == (200, True, "gone")
    assert call(client, "get", block_key="gone")[1]["found"] is False
    status, out = call(client, "delete", block_key="gone")
    assert (status, out["deleted"]) == (200, False)


def test_render_xml_and_markdown_in_block_key_order(client):
    call(client, "set", content="cursor: ticket 4812", block_key="state", run_id="run-7")
    call(client, "set", content="note", block_key="alpha", run_id="run-7")
    status, out = call(client, "render", run_id="run-7")
    assert status == 200
    assert out["rendered"] == (
        '<working-memory block="alpha">note</working-memory>\n'
        '<working-memory block="state">cursor: ticket 4812</working-memory>'
    )
    assert [b["block_key"] for b in out["blocks"]] == ["alpha", "state"]
    assert out["block_count"] == 2 and out["total_chars"] == 4 + 19
    assert {"char_limit", "version", "content", "fill_ratio"} <= set(out["blocks"][0])
    _, out = call(client, "render", run_id="run-7", format="markdown")
    assert out["rendered"] == "## alpha\nnote\n\n## state\ncursor: ticket 4812"


def test_render_named_blocks_limit_and_bounds(client):
    for key in ("d", "c", "b", "a"):
        call(client, "set", content=key * 2, block_key=key)
    _, out = call(client, "render", block_keys=["d", "b", "zz"])
    assert [b["block_key"] for b in out["blocks"]] == ["b", "d"]
    _, out = call(client, "render", limit=3)
    assert [b["block_key"] for b in out["blocks"]] == ["a", "b", "c"]
    for bad in ({"limit": 0}, {"limit": 101}, {"block_keys": [str(i) for i in range(21)]},
                {"format": "html"}):
        status, out = call(client, "render", **bad)
        assert status == 422 and set(bad) <= set(out["error"]["fields"])
    assert call(client, "render", limit=100)[0] == 200


def test_render_empty_scope(client):
    _, out = call(client, "render")
    assert out["rendered"] == "" and out["block_count"] == 0 and out["total_chars"] == 0


def test_xml_attribute_is_escaped(client):
    call(client, "set", content="x", block_key='a"b<c')
    _, out = call(client, "render")
    assert out["rendered"] == '<working-memory block="a&quot;b&lt;c">x</working-memory>'


def test_scopes_are_separate(client):
    scopes = [
        {},
        {"run_id": "r1"},
        {"session_id": "s1"},
        {"session_id": "s1", "run_id": "r1"},
        {"user_id": "u1"},
        {"agent": "other-bot"},
        {"namespace": "other-ns"},
    ]
    for index, scope in enumerate(scopes):
        assert call(client, "set", content=f"scope-{index}", **scope)[0] == 200
    for index, scope in enumerate(scopes):
        assert call(client, "get", **scope)[1]["content"] == f"scope-{index}"
        assert call(client, "render", **scope)[1]["block_count"] == 1


def test_identity_fields_are_required(client):
    response = client.post("/v1/working_memory.set", json={"agent": "a"})
    assert response.status_code == 422
    assert response.get_json()["error"] == {
        "code": "IDENTITY_INCOMPLETE",
        "message": "namespace is required",
        "fields": {"namespace": ["namespace is required"]},
    }
    response = client.post("/v1/working_memory.set", json={"namespace": "n"})
    assert list(response.get_json()["error"]["fields"]) == ["agent"]


def test_identity_fields_refuse_control_characters_and_overlong(client):
    status, out = call(client, "set", user_id="a\nb")
    assert status == 422 and "user_id" in out["error"]["fields"]
    status, out = call(client, "set", namespace="n" * 257)
    assert status == 422 and "namespace" in out["error"]["fields"]


def test_auth_off_acts_in_the_install_org(client):
    call(client, "set", content="same", org="acme")
    assert call(client, "get", org="another-org")[1]["content"] == "same"


def test_blocks_have_no_ttl(client, redis_client):
    call(client, "set", content="x")
    keys = redis_client.keys("loom:wm:*")
    assert len(keys) == 1 and redis_client.ttl(keys[0]) == -1


def test_versions_strictly_increase_under_a_stopped_clock(app_factory, clock):
    app = app_factory(clock=clock)
    client = app.test_client()
    first = call(client, "set", content="a")[1]["version"]
    second = call(client, "append", addition="b")[1]["version"]
    third = call(client, "replace", old="a", new="c")[1]["version"]
    assert first == clock.now_ns()
    assert (second, third) == (first + 1, first + 2)
    clock.advance(1)
    assert call(client, "set", content="d")[1]["version"] == clock.now_ns()


def test_version_carry_across_the_nine_digit_boundary(app_factory, clock):
    clock._ns = 1_800_000_000_999_999_999
    client = app_factory(clock=clock).test_client()
    call(client, "set", content="a")
    assert call(client, "set", content="b")[1]["version"] == 1_800_000_001_000_000_000


def test_a_clock_that_goes_back_still_moves_versions_forward(app_factory, clock):
    client = app_factory(clock=clock).test_client()
    first = call(client, "set", content="a")[1]["version"]
    clock.advance(-5)
    assert call(client, "set", content="b")[1]["version"] == first + 1


def test_writes_are_refused_while_the_user_is_being_erased(client, redis_client):
    from app.store import keys

    marker = keys.user_erasing("default", "support", "u-9")
    redis_client.set(marker, "1")
    for op, body in (("set", {"content": "x"}), ("append", {"addition": "x"})):
        status, out = call(client, op, user_id="u-9", **body)
        assert (status, out["error"]["code"]) == (409, "USER_BEING_ERASED")
    assert call(client, "get", user_id="u-9")[1]["found"] is False
    assert call(client, "set", content="other user", user_id="u-10")[0] == 200
    redis_client.delete(marker)
    assert call(client, "set", content="x", user_id="u-9")[0] == 200
