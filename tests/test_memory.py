"""memory.* through the Flask app against a real redis-server, and the source digest it keeps.

The digest tests check the scripts' incremental digest against one computed from scratch
(``source_digest_of``) over the rows the rule says are sources, after every kind of change.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from app.clock import FrozenClock
from app.errors import MemoryPinned
from app.services import Services
from app.store import keys
from app.store.memory import (
    DELETE_VERSION_TRACE,
    ZERO_DIGEST,
    Content,
    Location,
    MemoryStore,
    VersionMoved,
    canonical_json,
    source_digest_of,
)
from tests.auth_support import ADMIN_TOKEN, auth_app, bearer, mint
from tests.support.api import op_helpers

NS = {"namespace": "support", "agent": "triage-bot", "user_id": "u-42"}
call, ok = op_helpers(NS, prefix="memory.")


def sha(value):
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def store_of(app) -> MemoryStore:
    services: Services = app.extensions["loom"]
    return services.store(MemoryStore)


def org_of(app) -> str:
    return app.extensions["loom"].settings.default_org


# --- memory.set --------------------------------------------------------------------------------


def test_set_answers_and_stores_every_field(client):
    out = ok(client, "set", key="currency", value="Prefers EUR.", memory_type="preference",
             confidence=0.75, tags=["billing", "billing", "attribute:x"], label="high",
             valid_at="2026-01-02T03:04:05Z", valid_to="2027-01-01T00:00:00+00:00",
             duplicate_of="mem_0000000000000000", provenance="derived",
             source_trace="import:crm")
    assert out["created"] is True and out["key"] == "currency"
    assert out["memory_id"].startswith("mem_") and len(out["memory_id"]) == 20
    assert out["version_text"] == str(out["version"]) and out["version"] > 10**18
    assert out["content_sha256"] == sha("Prefers EUR.")
    assert out["value_length"] == len('"Prefers EUR."')
    assert out["char_limit"] is None and out["memory_type"] == "preference"
    row = ok(client, "get", key="currency")["memory"]
    assert row["value"] == "Prefers EUR."
    assert row["confidence"] == 0.75
    assert row["tags"] == ["billing", "attribute:x"]  # duplicates dropped, order kept
    assert row["label"] == "high" and row["provenance"] == "derived"
    assert row["valid_at"] == "2026-01-02T03:04:05Z"
    assert row["valid_to"] == "2027-01-01T00:00:00Z"
    assert row["duplicate_of"] == "mem_0000000000000000"
    assert row["source_trace"] == "import:crm"
    assert row["actor"] == "triage-bot" and row["written_by"] == "triage-bot"
    assert (row["agent"], row["user_id"], row["session_id"]) == ("triage-bot", "u-42", "-")
    assert row["pinned"] is False and row["locked"] is False and row["deleted"] is False
    assert row["created_at"] == row["updated_at"]


def test_defaults_of_a_row(client):
    ok(client, "set", key="k", value={"b": 1, "a": "é"})
    row = ok(client, "get", key="k")["memory"]
    assert row["memory_type"] == "semantic" and row["confidence"] == 1.0
    assert row["tags"] == [] and row["label"] == "normal" and row["provenance"] == "stated"
    assert row["valid_at"] is None and row["valid_to"] is None and row["duplicate_of"] == ""
    # canonical JSON: compact, sorted keys, non-ASCII kept
    assert row["value_length"] == len('{"a":"é","b":1}')
    assert row["content_sha256"] == hashlib.sha256('{"a":"é","b":1}'.encode()).hexdigest()


def test_every_write_is_a_new_increasing_version(client):
    first = ok(client, "set", key="k", value="one")
    second = ok(client, "set", key="k", value="two")
    assert second["created"] is False and second["memory_id"] == first["memory_id"]
    assert second["version"] > first["version"]
    history = ok(client, "history", key="k")["versions"]
    assert [v["value"] for v in history] == ["two", "one"]
    assert [v["version"] for v in history] == [second["version"], first["version"]]


def test_versions_stay_increasing_when_the_clock_stands_still(app_factory):
    client = app_factory(clock=FrozenClock()).test_client()
    versions = [ok(client, "set", key="k", value=i)["version"] for i in range(5)]
    assert versions == sorted(versions) and len(set(versions)) == 5
    assert versions[-1] - versions[0] == 4


@pytest.mark.parametrize(
    "field,value",
    [
        ("key", ""),
        ("key", "k" * 513),
        ("key", "a\nb"),
        ("key", 5),
        ("value", None),
        ("confidence", 1.5),
        ("confidence", -0.1),
        ("confidence", "0.5"),
        ("confidence", True),
        ("label", "secret"),
        ("provenance", "guessed"),
        ("memory_type", "Semantic"),
        ("memory_type", ""),
        ("tags", ["x"] * 65),
        ("tags", [""]),
        ("tags", "forget"),
        ("valid_at", "yesterday"),
        ("valid_at", "1969-12-31T23:59:59Z"),
        ("char_limit", 0),
        ("char_limit", 65537),
        ("char_limit", "10"),
        ("source_trace", DELETE_VERSION_TRACE + "123"),
        ("source_trace", "x" * 4097),
    ],
)
def test_bad_fields_are_422_naming_the_field_and_write_nothing(client, field, value):
    body = {"key": "k", "value": "v", field: value}
    status, out = call(client, "set", **body)
    assert status == 422, out
    assert out["error"]["code"] == "VALIDATION_ERROR"
    assert field in out["error"]["fields"]
    assert ok(client, "get", key="k")["found"] is False


def test_value_and_key_are_required(client):
    status, out = call(client, "set")
    assert status == 422 and {"key", "value"} <= set(out["error"]["fields"])


def test_valid_to_must_follow_valid_at(client):
    status, out = call(client, "set", key="k", value="v", valid_at="2026-01-02T00:00:00Z",
                       valid_to="2026-01-01T00:00:00Z")
    assert status == 422 and "valid_to" in out["error"]["fields"]


def test_a_naive_time_is_read_as_utc(client):
    ok(client, "set", key="k", value="v", valid_at="2026-05-01T10:00:00")
    assert ok(client, "get", key="k")["memory"]["valid_at"] == "2026-05-01T10:00:00Z"
    ok(client, "set", key="k", value="v", valid_at="2026-05-01T12:00:00+02:00")
    assert ok(client, "get", key="k")["memory"]["valid_at"] == "2026-05-01T10:00:00Z"


def test_char_limit_on_memory_rows(client):
    status, out = call(client, "set", key="k", value="x" * 9, char_limit=10)
    assert status == 422 and out["error"]["code"] == "CHAR_LIMIT_EXCEEDED"
    assert (out["error"]["value_length"], out["error"]["char_limit"]) == (11, 10)
    assert ok(client, "set", key="k", value="x" * 8, char_limit=10)["char_limit"] == 10
    # Left out, the row keeps its cap.
    status, out = call(client, "set", key="k", value="x" * 9)
    assert status == 422 and out["error"]["char_limit"] == 10
    assert ok(client, "get", key="k")["memory"]["value"] == "x" * 8


def test_a_row_without_a_cap_is_held_to_the_largest(client):
    assert call(client, "set", key="k", value="x" * 65534)[0] == 200
    status, out = call(client, "set", key="k", value="x" * 65535)
    assert status == 422 and out["error"]["char_limit"] == 65536
    assert out["error"]["value_length"] == 65537


def test_a_profile_row_through_memory_set_gets_the_profile_cap(client):
    out = ok(client, "set", key="persona", value="Terse.", memory_type="profile")
    assert out["char_limit"] == 8192


def test_if_match_sha256_on_memory_set(client):
    first = ok(client, "set", key="k", value="one")
    status, out = call(client, "set", key="k", value="two", if_match_sha256="0" * 64)
    assert status == 409 and out["error"]["code"] == "HASH_MISMATCH"
    assert out["error"]["content_sha256"] == first["content_sha256"]
    ok(client, "set", key="k", value="two", if_match_sha256=first["content_sha256"])
    assert ok(client, "get", key="k")["memory"]["value"] == "two"


def test_unknown_fields_are_named(client):
    assert ok(client, "set", key="k", value=1, colour="blue")["ignored_args"] == ["colour"]


def test_a_write_names_one_agent(client):
    status, out = call(client, "set", key="k", value=1, agent="*")
    assert status == 422 and "agent" in out["error"]["fields"]


# --- memory.get --------------------------------------------------------------------------------


def test_get_by_key_and_by_memory_id_from_another_identity(client):
    written = ok(client, "set", key="k", value="v", session_id="s-1")
    assert ok(client, "get", key="k")["found"] is False  # a row under another session_id
    by_key = ok(client, "get", key="k", session_id="s-1")
    assert by_key["found"] is True and by_key["memory"]["memory_id"] == written["memory_id"]
    by_id = ok(client, "get", memory_id=written["memory_id"], agent="dashboard", user_id="-")
    assert by_id["memory"]["session_id"] == "s-1" and by_id["memory"]["value"] == "v"


def test_get_missing_or_of_another_type_is_not_found(client):
    assert ok(client, "get", key="nothing") == {"found": False, "memory": None,
                                                "ignored_args": []}
    ok(client, "set", key="k", value="v")
    assert ok(client, "get", key="k", memory_type="profile")["found"] is False
    assert ok(client, "get", key="k", memory_type="semantic")["found"] is True
    assert ok(client, "get", memory_id="mem_ffffffffffffffff")["found"] is False


@pytest.mark.parametrize("body", [{}, {"key": "k", "memory_id": "mem_0000000000000000"}])
def test_get_needs_exactly_one_name(client, body):
    status, out = call(client, "get", **body)
    assert status == 422 and "key" in out["error"]["fields"]


def test_get_with_any_agent_finds_the_latest_row_of_that_key(client):
    ok(client, "set", key="persona", value="old", agent="console")
    ok(client, "set", key="persona", value="new", agent="other-bot")
    ok(client, "set", key="persona", value="elsewhere", agent="third", session_id="s-9")
    out = ok(client, "get", key="persona", agent="*")
    assert out["memory"]["value"] == "new" and out["memory"]["agent"] == "other-bot"


# --- memory.list -------------------------------------------------------------------------------


def test_list_filters_and_pages(client):
    for i in range(7):
        ok(client, "set", key=f"fact:{i}", value=i, memory_type="semantic")
    ok(client, "set", key="fact:pref", value="p", memory_type="preference")
    ok(client, "set", key="other", value="o")
    ok(client, "set", key="fact:mine", value="m", agent="another-bot", memory_type="decision")
    ok(client, "set", key="fact:someone", value="s", user_id="u-7")

    seen, cursor, pages = [], None, 0
    while True:
        body = {"key_prefix": "fact:", "memory_type": "semantic", "limit": 3}
        if cursor:
            body["cursor"] = cursor
        out = ok(client, "list", **body)
        pages += 1
        seen += [row["key"] for row in out["memories"]]
        assert out["count"] == len(out["memories"])
        cursor = out["next_cursor"]
        if not cursor:
            break
    assert seen == [f"fact:{i}" for i in range(7)] and pages == 3
    keys_all = [r["key"] for r in ok(client, "list", limit=100)["memories"]]
    assert keys_all == sorted(keys_all)
    assert "fact:mine" in keys_all and "fact:someone" not in keys_all  # every agent, one user
    mine = ok(client, "list", scope="this_agent", limit=100)["memories"]
    assert "fact:mine" not in [r["key"] for r in mine]
    prefs = ok(client, "list", memory_type="preference")["memories"]
    assert [r["key"] for r in prefs] == ["fact:pref"]


def test_list_hides_deleted_rows_unless_asked(client):
    ok(client, "set", key="a", value=1)
    ok(client, "set", key="b", value=2)
    ok(client, "delete", key="a")
    assert [r["key"] for r in ok(client, "list")["memories"]] == ["b"]
    rows = ok(client, "list", include_deleted=True)["memories"]
    assert [(r["key"], r["deleted"]) for r in rows] == [("a", True), ("b", False)]


def test_list_skips_long_runs_of_filtered_rows(client):
    for i in range(120):
        ok(client, "set", key=f"e{i:03d}", value=i, memory_type="episodic")
    ok(client, "set", key="z", value="last", memory_type="decision")
    out = ok(client, "list", memory_type="decision", limit=1)
    assert [r["key"] for r in out["memories"]] == ["z"] and out["next_cursor"] == ""


def test_a_bad_cursor_is_422(client):
    for cursor in ("!!!", "////"):
        status, out = call(client, "list", cursor=cursor)
        assert status == 422 and "cursor" in out["error"]["fields"]


# --- memory.history ----------------------------------------------------------------------------


def test_history_pages_newest_first(client):
    versions = [ok(client, "set", key="k", value=i)["version"] for i in range(5)]
    first = ok(client, "history", key="k", limit=2)
    assert [v["version"] for v in first["versions"]] == versions[::-1][:2]
    second = ok(client, "history", key="k", limit=2, cursor=first["next_cursor"])
    third = ok(client, "history", key="k", limit=2, cursor=second["next_cursor"])
    assert [v["value"] for v in second["versions"] + third["versions"]] == [2, 1, 0]
    assert third["next_cursor"] == ""


def test_history_of_a_missing_row_is_404(client):
    status, out = call(client, "history", key="nothing")
    assert status == 404 and out["error"]["code"] == "MEMORY_NOT_FOUND"


# --- delete and delete_version -----------------------------------------------------------------


def test_delete_writes_a_tombstone_and_a_later_set_revives_the_row(client):
    written = ok(client, "set", key="k", value="v")
    out = ok(client, "delete", key="k", source_trace="user asked")
    assert out["deleted"] is True and out["memory_id"] == written["memory_id"]
    assert ok(client, "get", key="k")["found"] is False
    tomb = ok(client, "history", key="k")["versions"][0]
    assert tomb["deleted"] is True and tomb["value"] is None and tomb["content_sha256"] == ""
    assert tomb["source_trace"] == "user asked"
    assert ok(client, "delete", key="k")["deleted"] is False  # already deleted: no new version
    assert len(ok(client, "history", key="k")["versions"]) == 2
    revived = ok(client, "set", key="k", value="back")
    assert revived["memory_id"] == written["memory_id"] and revived["created"] is False
    assert ok(client, "get", key="k")["memory"]["value"] == "back"


def test_delete_of_nothing(client):
    assert ok(client, "delete", key="nothing")["deleted"] is False
    status, out = call(client, "delete", memory_id="mem_ffffffffffffffff")
    assert status == 404 and out["error"]["code"] == "MEMORY_NOT_FOUND"


def test_delete_with_a_type_leaves_a_row_of_another_type(client):
    ok(client, "set", key="persona", value="a fact", memory_type="semantic")
    assert ok(client, "delete", key="persona", memory_type="profile")["deleted"] is False
    assert ok(client, "get", key="persona")["found"] is True


def test_delete_version_of_the_current_version_reverts(client):
    one = ok(client, "set", key="k", value="one")
    two = ok(client, "set", key="k", value="two")
    out = ok(client, "delete_version", key="k", version=two["version"])
    assert out["removed_version"] == two["version"]
    assert out["removed_version_text"] == two["version_text"]
    assert out["version"] > two["version"] and out["content_sha256"] == one["content_sha256"]
    row = ok(client, "get", key="k")["memory"]
    assert row["value"] == "one"
    assert row["source_trace"] == f"{DELETE_VERSION_TRACE}{two['version']}"
    versions = [v["version"] for v in ok(client, "history", key="k")["versions"]]
    assert versions == [out["version"], one["version"]]


def test_delete_version_of_an_older_version_by_its_text(client):
    one = ok(client, "set", key="k", value="one")
    ok(client, "set", key="k", value="two")
    out = ok(client, "delete_version", key="k", version_text=one["version_text"])
    assert ok(client, "get", key="k")["memory"]["value"] == "two"
    history = ok(client, "history", key="k")["versions"]
    assert one["version"] not in [v["version"] for v in history]
    assert history[0]["version"] == out["version"]
    assert history[0]["source_trace"].startswith(DELETE_VERSION_TRACE)


def test_delete_version_of_the_only_version_leaves_a_tombstone(client):
    one = ok(client, "set", key="k", value="one")
    out = ok(client, "delete_version", key="k", version=one["version"])
    assert out["deleted"] is True
    assert ok(client, "get", key="k")["found"] is False
    history = ok(client, "history", key="k")["versions"]
    assert len(history) == 1 and history[0]["deleted"] and history[0]["value"] is None


def test_delete_version_errors(client):
    one = ok(client, "set", key="k", value="one")
    status, out = call(client, "delete_version", key="k", version=one["version"] + 999)
    assert status == 404 and out["error"]["code"] == "MEMORY_NOT_FOUND"
    for body in ({}, {"version": 5, "version_text": "6"}, {"version_text": "01"},
                 {"version_text": "12a"}, {"version": "5"}):
        status, out = call(client, "delete_version", key="k", **body)
        assert status == 422, body
    status, _ = call(client, "delete_version", key="nothing", version=1)
    assert status == 404
    assert ok(client, "get", key="k")["memory"]["version"] == one["version"]


# --- lock, unlock, pin, unpin, redact -----------------------------------------------------------


def test_a_locked_row_refuses_every_write_but_unlock(client):
    written = ok(client, "set", key="k", value="v")
    locked = ok(client, "lock", key="k")
    assert locked["locked"] is True and locked["changed"] is True
    assert locked["version"] > written["version"]
    row = ok(client, "get", key="k")["memory"]
    assert row["content_sha256"] == written["content_sha256"] and row["locked"] is True
    refused = [
        ("set", {"value": "w"}),
        ("delete", {}),
        ("delete_version", {"version": written["version"]}),
        ("pin", {}),
        ("unpin", {}),
        ("redact", {}),
        ("lock", {}),
    ]
    for op_name, extra in refused:
        status, out = call(client, op_name, key="k", **extra)
        assert status == 409 and out["error"]["code"] == "MEMORY_LOCKED", op_name
    assert ok(client, "get", key="k")["memory"]["version"] == locked["version"]
    unlocked = ok(client, "unlock", key="k")
    assert unlocked["locked"] is False and unlocked["version"] > locked["version"]
    assert ok(client, "unlock", key="k")["changed"] is False
    ok(client, "set", key="k", value="w")
    history = ok(client, "history", key="k")["versions"]
    assert [(v["value"], v["locked"]) for v in history] == [
        ("w", False), ("v", False), ("v", True), ("v", False)
    ]


def test_lock_of_a_missing_row_is_404(client):
    status, out = call(client, "lock", key="nothing")
    assert status == 404 and out["error"]["code"] == "MEMORY_NOT_FOUND"


def test_pin_and_unpin_write_versions_and_callers_still_write(client, app):
    ok(client, "set", key="k", value="v")
    pinned = ok(client, "pin", key="k")
    assert pinned["pinned"] is True and pinned["changed"] is True
    assert ok(client, "pin", key="k")["changed"] is False
    ok(client, "set", key="k", value="caller edit")
    row = ok(client, "get", key="k")["memory"]
    assert row["pinned"] is True and row["value"] == "caller edit"
    # A worker's write to a pinned row is refused.
    location = Location(org_of(app), "support", "u-42", "triage-bot", "-", "k")
    with pytest.raises(MemoryPinned):
        store_of(app).set(location, Content(value="rebuilt"), written_by="worker",
                          refuse_pinned=True)
    assert ok(client, "unpin", key="k")["pinned"] is False
    store_of(app).set(location, Content(value="rebuilt"), written_by="worker",
                      refuse_pinned=True)
    assert ok(client, "get", key="k")["memory"]["value"] == "rebuilt"


def test_a_write_over_a_version_that_moved_is_a_lost_swap_not_an_error(client, app):
    first = ok(client, "set", key="k", value="v")
    ok(client, "set", key="k", value="w")
    location = Location(org_of(app), "support", "u-42", "triage-bot", "-", "k")
    with pytest.raises(VersionMoved):
        store_of(app).set(location, Content(value="x"), written_by="worker",
                          expected_version=str(first["version"]))
    with pytest.raises(VersionMoved):
        store_of(app).set(location, Content(value="x"), written_by="worker", expected_version="-")
    assert ok(client, "get", key="k")["memory"]["value"] == "w"


def test_redact_scrubs_every_version(client, redis_client):
    ok(client, "set", key="k", value="secret one")
    ok(client, "set", key="k", value="secret two")
    ok(client, "lock", key="k")
    ok(client, "unlock", key="k")
    out = ok(client, "redact", key="k")
    assert out == {"memory_id": out["memory_id"], "key": "k", "redacted": True,
                   "versions_redacted": 4, "ignored_args": []}
    history = ok(client, "history", key="k")["versions"]
    assert len(history) == 4
    assert all(v["value"] is None and v["redacted"] and v["content_sha256"] == ""
               for v in history)
    row = ok(client, "get", key="k")["memory"]
    assert row["redacted"] is True and row["value"] is None
    every_value = "".join(
        json.dumps(redis_client.hgetall(k), ensure_ascii=False)
        for k in redis_client.keys("*") if redis_client.type(k) == "hash"
    )
    assert "secret" not in every_value and "Zm9v" not in every_value


def test_writes_by_memory_id(client):
    written = ok(client, "set", key="k", value="v", user_id="u-7")
    mid = written["memory_id"]
    assert ok(client, "lock", memory_id=mid, user_id="-")["locked"] is True
    assert ok(client, "unlock", memory_id=mid)["locked"] is False
    assert ok(client, "delete", memory_id=mid)["deleted"] is True
    assert ok(client, "history", memory_id=mid)["versions"][0]["deleted"] is True


def test_an_erasure_in_progress_refuses_writes(client, app, redis_client):
    redis_client.set(keys.user_erasing(org_of(app), "support", "u-42"), "1")
    status, out = call(client, "set", key="k", value="v")
    assert status == 409 and out["error"]["code"] == "USER_BEING_ERASED"
    assert ok(client, "get", key="k")["found"] is False
    assert call(client, "set", key="k", value="v", user_id="u-7")[0] == 200


# --- roles and read scopes (auth on) -----------------------------------------------------------


@pytest.fixture
def auth_client(app_factory):
    return auth_app(app_factory).test_client()


def test_roles_of_the_memory_ops(auth_client):
    writer = mint(auth_client, namespace="support", role="writer")
    viewer = mint(auth_client, namespace="support", role="viewer")
    admin = mint(auth_client, namespace="support", role="admin")
    written = ok_token(auth_client, writer, "set", key="k", value="v")
    assert call(auth_client, "set", bearer(viewer), key="k", value="w")[0] == 403
    assert call(auth_client, "get", bearer(viewer), key="k")[0] == 200
    for op_name in ("lock", "unlock", "pin", "unpin", "delete"):
        assert call(auth_client, op_name, bearer(viewer), key="k")[0] == 403, op_name
    ok_token(auth_client, writer, "set", key="k", value="w")
    for op_name, extra in (("redact", {}), ("delete_version", {"version": written["version"]})):
        status, out = call(auth_client, op_name, bearer(writer), key="k", **extra)
        assert status == 403 and out["error"]["code"] == "AUTH_INSUFFICIENT", op_name
        assert call(auth_client, op_name, bearer(admin), key="k", **extra)[0] == 200, op_name


def ok_token(client, token, op_name, **body):
    status, out = call(client, op_name, bearer(token), **body)
    assert status == 200, out
    return out


def test_read_scopes_bound_reads_by_memory_id(auth_client):
    theirs = ok_token(auth_client, ADMIN_TOKEN, "set", key="k", value="v", user_id="u-7")
    ns_level = ok_token(auth_client, ADMIN_TOKEN, "set", key="n", value="v", user_id="-")
    own_user = mint(auth_client, namespace="support", role="viewer", read_scope="own_user")
    out = ok_token(auth_client, own_user, "get", memory_id=theirs["memory_id"])
    assert out["found"] is False
    assert ok_token(auth_client, own_user, "get", memory_id=ns_level["memory_id"])["found"]
    assert ok_token(auth_client, own_user, "get", memory_id=theirs["memory_id"],
                    user_id="u-7")["found"]
    status, out = call(auth_client, "get", bearer(own_user), key="k", read_scope="namespace")
    assert status == 403 and out["error"]["code"] == "AUTH_INSUFFICIENT"
    # A token pinned to a user reads as own_user even when its ceiling is the namespace.
    pinned = mint(auth_client, namespace="support", role="admin", read_user_id="u-9")
    assert ok_token(auth_client, pinned, "get", memory_id=theirs["memory_id"],
                    user_id="-")["found"] is False
    status, _ = call(auth_client, "lock", bearer(pinned), memory_id=theirs["memory_id"],
                     user_id="-")
    assert status == 404
    status, _ = call(auth_client, "get", bearer(pinned), key="k", read_scope="namespace",
                     user_id="-")
    assert status == 403


def test_own_session_lists_only_the_session_and_namespace_rows(client):
    ok(client, "set", key="a", value=1, session_id="s-1")
    ok(client, "set", key="b", value=2, session_id="s-2")
    ok(client, "set", key="c", value=3)
    rows = ok(client, "list", session_id="s-1", read_scope="own_session")["memories"]
    assert [r["key"] for r in rows] == ["a"]
    rows = ok(client, "list", read_scope="own_user")["memories"]
    assert [r["key"] for r in rows] == ["a", "b", "c"]


# --- the sources and their digest ---------------------------------------------------------------


def _expected_sources(app, user="u-42", now=None):
    """The sources recomputed from the rows themselves, by the seed's rule."""
    store = store_of(app)
    now = now if now is not None else app.extensions["loom"].clock.now_ns()
    entries = {}
    after = None
    while True:
        batch, more = store.scan_rows(org_of(app), "support", user, after=after)
        for member, row in batch:
            after = member
            if row is not None and row.is_source(now):
                # valid_at, else the row's last change (a recall's version leaves it)
                date = row.valid_at if row.valid_at is not None else row.updated_at
                entries[row.memory_id] = f"{row.content_sha256}:{row.confidence!r}:{date}"
        if not more:
            return entries


def _digest(app, user="u-42"):
    return store_of(app).source_digest(org_of(app), "support", user)


def _assert_digest_matches_rows(app, user="u-42"):
    store = store_of(app)
    expected = _expected_sources(app, user)
    assert store.source_entries(org_of(app), "support", user) == expected
    digest = _digest(app, user)
    assert digest.digest == source_digest_of(expected)
    assert digest.count == len(expected)
    return digest


def test_an_empty_user_has_the_zero_digest(app):
    digest = _digest(app)
    assert (digest.digest, digest.count, digest.changed_at) == (ZERO_DIGEST, 0, None)


def test_sources_follow_the_rule(client, app):
    ok(client, "set", key="s", value="semantic fact")
    ok(client, "set", key="p", value="pref", memory_type="preference")
    ok(client, "set", key="d", value="decision", memory_type="decision")
    excluded = [
        {"memory_type": "episodic"},
        {"memory_type": "profile"},
        {"label": "high"},
        {"duplicate_of": "mem_0000000000000000"},
        {"tags": ["about:other"]},
        {"tags": ["attribute:religion"]},
        {"tags": ["forget"]},
        {"valid_to": "2001-01-01T00:00:00Z", "valid_at": "2000-01-01T00:00:00Z"},
    ]
    for i, extra in enumerate(excluded):
        ok(client, "set", key=f"x{i}", value="no", **extra)
    digest = _assert_digest_matches_rows(app)
    assert digest.count == 3


@pytest.mark.parametrize(
    "change",
    [
        {"value": "edited"},
        {"value": "fact"},  # a restatement: same content, newer date
        {"value": "fact", "confidence": 0.5},
        {"value": "fact", "valid_at": "2026-01-01T00:00:00Z"},
        {"value": "fact", "memory_type": "episodic"},
        {"value": "fact", "label": "high"},
        {"value": "fact", "tags": ["forget"]},
        {"value": "fact", "tags": ["attribute:health"]},
        {"value": "fact", "tags": ["about:other"]},
        {"value": "fact", "duplicate_of": "mem_0000000000000001"},
    ],
)
def test_every_change_to_a_source_moves_the_digest(client, app, change):
    ok(client, "set", key="f", value="fact", memory_type="preference")
    before = _digest(app)
    ok(client, "set", key="f", **{"memory_type": "preference", **change})
    after = _assert_digest_matches_rows(app)
    assert after.digest != before.digest
    assert after.changed_at > before.changed_at


def test_lock_unlock_delete_restore_and_delete_version_move_the_digest(client, app):
    one = ok(client, "set", key="f", value="fact", memory_type="decision")
    seen = [_digest(app).digest]
    for op_name, extra in (("lock", {}), ("unlock", {}), ("pin", {}), ("delete", {}),
                           ("set", {"value": "fact", "memory_type": "decision"}),
                           ("delete_version", {"version": one["version"]})):
        ok(client, op_name, key="f", **extra)
        seen.append(_assert_digest_matches_rows(app).digest)
    assert len(set(seen)) == len(seen)


def test_deletion_lowers_the_count_and_marks_the_removal(client, app):
    ok(client, "set", key="a", value=1, memory_type="preference")
    ok(client, "set", key="b", value=2, memory_type="preference")
    before = _digest(app)
    assert before.count == 2 and before.removed_at is None
    deleted = ok(client, "delete", key="a")
    after = _assert_digest_matches_rows(app)
    assert after.count == 1 and after.removed_at == deleted["version"]
    ok(client, "set", key="b", value=3, memory_type="preference")
    assert _digest(app).removed_at == deleted["version"]  # an edit is not a removal


def test_a_valid_at_dates_the_entry_so_a_lock_keeps_the_digest(client, app):
    ok(client, "set", key="f", value="v", memory_type="preference",
       valid_at="2025-06-01T00:00:00Z")
    entries = store_of(app).source_entries(org_of(app), "support", "u-42")
    (entry,) = entries.values()
    assert entry.endswith(":1.0:1748736000000000000")
    before = _digest(app).digest
    ok(client, "lock", key="f")
    assert _digest(app).digest == before


def test_redact_takes_the_fact_out_of_the_sources(client, app):
    ok(client, "set", key="f", value="v", memory_type="semantic")
    assert _digest(app).count == 1
    ok(client, "redact", key="f")
    after = _assert_digest_matches_rows(app)
    assert after.count == 0 and after.removed_at is not None


def test_profile_writes_leave_the_digest_and_the_changed_index(client, app, redis_client):
    changed = keys.profile_changed_users(org_of(app), "support")
    ok(client, "set", key="persona", value="Terse.", memory_type="profile")
    ok(client, "set", key="e", value="episode", memory_type="episodic")
    assert _digest(app).changed_at is None
    assert redis_client.zscore(changed, "u-42") is None
    fact = ok(client, "set", key="f", value="v")
    assert abs(int(redis_client.zscore(changed, "u-42")) - fact["version"]) < 10**4


def test_changed_users_are_cleared_only_up_to_the_build(client, app):
    store = store_of(app)
    org = org_of(app)
    first = ok(client, "set", key="f", value=1)
    ok(client, "set", key="g", value=2, user_id="u-7")
    listed = dict(store.changed_users(org, "support"))
    assert set(listed) == {"u-42", "u-7"}
    assert store.clear_changed(org, "support", "u-42", first["version"] - 10**6) is False
    assert store.clear_changed(org, "support", "u-42", first["version"] + 10**6) is True
    assert [user for user, _ in store.changed_users(org, "support")] == ["u-7"]


def test_a_fact_past_its_valid_to_leaves_the_digest_when_swept(app_factory):
    clock = FrozenClock()
    app = app_factory(clock=clock)
    client = app.test_client()
    ok(client, "set", key="f", value="v", valid_to="2027-01-15T08:00:10Z")
    ok(client, "set", key="g", value="w")
    store = store_of(app)
    org = org_of(app)
    digest = store.source_digest(org, "support", "u-42")
    assert digest.count == 2 and not digest.expiry_due(clock.now_ns())
    clock.advance(30)
    assert store.source_digest(org, "support", "u-42").expiry_due(clock.now_ns())
    assert store.expire_sources(org, "support", "u-42") == 1
    after = store.source_digest(org, "support", "u-42")
    assert after.count == 1 and after.next_expiry is None
    assert after.digest == source_digest_of(_expected_sources(app, now=clock.now_ns()))
    assert store.expire_sources(org, "support", "u-42") == 0


def test_source_rows_resolve_every_entry(client, app):
    ok(client, "set", key="a", value=1, memory_type="preference", session_id="s-1")
    ok(client, "set", key="b", value=2, memory_type="decision", agent="other")
    ok(client, "set", key="c", value=3, memory_type="episodic")
    rows = store_of(app).source_rows(org_of(app), "support", "u-42")
    assert sorted(row.key for row in rows) == ["a", "b"]


def test_a_moved_valid_to_moves_the_expiry_even_when_the_entry_stays(app_factory):
    clock = FrozenClock()
    app = app_factory(clock=clock)
    client = app.test_client()
    body = {"key": "f", "value": "v", "valid_at": "2027-01-01T00:00:00Z"}
    ok(client, "set", valid_to="2027-01-15T08:00:10Z", **body)
    store = store_of(app)
    before = store.source_digest(org_of(app), "support", "u-42")
    ok(client, "set", valid_to="2027-01-15T09:00:00Z", **body)
    after = store.source_digest(org_of(app), "support", "u-42")
    assert after.digest == before.digest  # same content, confidence and date
    assert after.next_expiry > before.next_expiry
    clock.advance(30)
    assert store.expire_sources(org_of(app), "support", "u-42") == 0
    assert store.source_digest(org_of(app), "support", "u-42").count == 1
    clock.advance(3600)
    assert store.expire_sources(org_of(app), "support", "u-42") == 1
