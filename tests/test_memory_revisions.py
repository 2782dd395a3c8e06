"""memory.revert, restore, restate, reinforce, recall and backfill through the Flask app against
a real redis-server: what each writes, what memory.history shows, what each does to the
structured-profile source digest (seed 000, Staleness), the lexical recall index, and their
refusals. Their structured-worker effects (one rebuild after the cooldown, or none) are in
tests/test_structured_revisions.py; their concurrent writers in tests/test_memory_concurrency.py.
"""

from __future__ import annotations

import pytest

from app.clock import FrozenClock
from app.store import keys
from app.store.recall_terms import decode
from tests.test_memory import _assert_digest_matches_rows, _digest, call, ok, org_of, store_of
from tests.test_recall import index_matches_rows, posting, posting_v1


def _history(client, key="f"):
    return ok(client, "history", key=key)["versions"]


def _changed_at(app, redis_client, user="u-42"):
    return redis_client.zscore(keys.profile_changed_users(org_of(app), "support"), user)


def _row(client, key="f"):
    return ok(client, "get", key=key)["memory"]


# --- memory.revert -----------------------------------------------------------------------------


def test_revert_brings_a_stored_version_back_as_a_new_version(client, app):
    one = ok(client, "set", key="f", value="Prefers EUR invoices", memory_type="preference",
             confidence=0.75, tags=["billing"])
    ok(client, "set", key="f", value="Prefers USD invoices", memory_type="preference")
    before = _digest(app)
    out = ok(client, "revert", key="f", version_text=str(one["version"]))
    assert out["change"] == "revert" and out["from_version_text"] == str(one["version"])
    assert out["from_version"] == one["version"] and out["changed"] is True
    assert out["digest_moved"] is True and out["content_sha256"] == one["content_sha256"]
    row = _row(client)
    assert row["value"] == "Prefers EUR invoices" and row["confidence"] == 0.75
    assert row["tags"] == ["billing"] and row["version"] == out["version"]
    assert row["updated_at"] == out["updated_at"]  # a change of the fact, dated now
    history = _history(client)
    assert [v["change"] for v in history] == ["revert", "write", "write"]
    assert history[0]["version"] > history[1]["version"] > history[2]["version"]
    assert history[0]["from_version"] == one["version"] and history[1]["from_version"] is None
    after = _assert_digest_matches_rows(app)
    assert after.digest != before.digest and after.changed_at == out["version"]
    index_matches_rows(app, "support", "u-42")


def test_revert_to_the_current_content_still_moves_the_fact(client, app):
    one = ok(client, "set", key="f", value="v", memory_type="decision")
    before = _digest(app).digest
    out = ok(client, "revert", key="f", version=one["version"])
    assert out["digest_moved"] is True and _assert_digest_matches_rows(app).digest != before


def test_revert_of_a_deleted_row_brings_it_back(client, app):
    one = ok(client, "set", key="f", value="v", memory_type="preference")
    ok(client, "delete", key="f")
    assert _digest(app).count == 0
    out = ok(client, "revert", memory_id=one["memory_id"], version_text=str(one["version"]))
    assert out["memory_id"] == one["memory_id"]
    assert _row(client)["deleted"] is False and _assert_digest_matches_rows(app).count == 1


def test_revert_refusals(client):
    one = ok(client, "set", key="f", value="v")
    status, out = call(client, "revert", memory_id="mem_0000000000000000",
                       version_text=str(one["version"]))
    assert status == 404 and out["error"]["code"] == "MEMORY_NOT_FOUND"
    assert out["error"]["memory_id"] == "mem_0000000000000000"
    status, out = call(client, "revert", key="nope", version=one["version"])
    assert status == 404 and out["error"]["code"] == "MEMORY_NOT_FOUND"
    status, out = call(client, "revert", key="f", version=one["version"] + 1)
    assert status == 404 and out["error"]["code"] == "MEMORY_NOT_FOUND"
    assert out["error"]["version_text"] == str(one["version"] + 1)
    tombstone = ok(client, "delete", key="f")
    status, out = call(client, "revert", key="f", version=tombstone["version"])
    assert status == 422 and out["error"]["code"] == "VALIDATION_ERROR"
    assert "version" in out["error"]["fields"]
    for bad in ({}, {"version": 0}, {"version_text": "x1"},
                {"version": one["version"], "version_text": "1"}):
        status, out = call(client, "revert", key="f", **bad)
        assert status == 422 and out["error"]["code"] == "VALIDATION_ERROR", bad
    assert len(_history(client)) == 2  # nothing refused wrote a version


def test_revert_to_a_redacted_version_is_refused(client):
    one = ok(client, "set", key="f", value="secret")
    ok(client, "redact", key="f")
    status, out = call(client, "revert", key="f", version=one["version"])
    assert status == 422 and "version" in out["error"]["fields"]


def test_revert_keeps_the_rows_cap(client):
    one = ok(client, "set", key="f", value="x" * 50)
    ok(client, "set", key="f", value="short", char_limit=10)
    status, out = call(client, "revert", key="f", version=one["version"])
    assert status == 422 and out["error"]["code"] == "CHAR_LIMIT_EXCEEDED"


# --- memory.restore ----------------------------------------------------------------------------


def test_restore_brings_back_the_last_content_before_the_delete(client, app):
    ok(client, "set", key="f", value="first", memory_type="semantic")
    second = ok(client, "set", key="f", value="second", memory_type="semantic")
    ok(client, "delete", key="f")
    deleted = _digest(app)
    assert deleted.count == 0
    out = ok(client, "restore", key="f")
    assert out["change"] == "restore" and out["from_version"] == second["version"]
    assert out["digest_moved"] is True
    row = _row(client)
    assert row["value"] == "second" and row["deleted"] is False
    assert row["memory_id"] == second["memory_id"]
    assert [v["change"] for v in _history(client)] == ["restore", "delete", "write", "write"]
    restored = _assert_digest_matches_rows(app)
    assert restored.count == 1 and restored.digest != deleted.digest
    index_matches_rows(app, "support", "u-42")
    assert "second" in [h["value"] for h in ok(client, "search", query="second")["hits"]]


def test_restore_refusals(client):
    ok(client, "set", key="f", value="v")
    status, out = call(client, "restore", key="f")
    assert status == 409 and out["error"]["code"] == "MEMORY_NOT_DELETED"
    assert out["error"]["key"] == "f"
    status, out = call(client, "restore", key="nope")
    assert status == 404 and out["error"]["code"] == "MEMORY_NOT_FOUND"
    status, out = call(client, "restore", memory_id="mem_0000000000000000")
    assert status == 404 and out["error"]["code"] == "MEMORY_NOT_FOUND"
    # A deleted row whose versions were scrubbed has no content to bring back.
    ok(client, "delete", key="f")
    ok(client, "redact", key="f")
    status, out = call(client, "restore", key="f")
    assert status == 404 and out["error"]["code"] == "MEMORY_NOT_FOUND"


def test_a_locked_row_refuses_every_revision(client):
    one = ok(client, "set", key="f", value="v")
    ok(client, "lock", key="f")
    for op_name, extra in (("revert", {"version": one["version"]}), ("restore", {}),
                           ("restate", {}), ("reinforce", {}), ("recall", {}),
                           ("backfill", {})):
        status, out = call(client, op_name, key="f", **extra)
        assert status == 409 and out["error"]["code"] == "MEMORY_LOCKED", op_name


@pytest.mark.parametrize("op_name", ["restate", "reinforce", "recall", "backfill"])
def test_a_deleted_or_missing_row_is_not_found(client, op_name):
    ok(client, "set", key="f", value="v")
    ok(client, "delete", key="f")
    for name in ({"key": "f"}, {"key": "nope"}, {"memory_id": "mem_0000000000000000"}):
        status, out = call(client, op_name, **name)
        assert status == 404 and out["error"]["code"] == "MEMORY_NOT_FOUND", (op_name, name)


# --- memory.restate and memory.reinforce -------------------------------------------------------


def test_restate_dates_the_fact_now_and_moves_the_digest(client, app, redis_client):
    one = ok(client, "set", key="f", value="Call me Sam", memory_type="semantic")
    before = _digest(app)
    out = ok(client, "restate", key="f")
    assert out["change"] == "restate" and out["digest_moved"] is True
    assert out["version"] > one["version"] and out["content_sha256"] == one["content_sha256"]
    row = _row(client)
    assert row["updated_at"] == out["updated_at"] and row["created_at"] != row["updated_at"]
    after = _assert_digest_matches_rows(app)
    assert after.digest != before.digest and after.count == before.count
    assert abs(_changed_at(app, redis_client) - out["version"]) < 10**4  # a float score
    (entry,) = store_of(app).source_entries(org_of(app), "support", "u-42").values()
    assert entry.endswith(f":{out['version']}")  # the newest place among the facts


def test_a_valid_at_dates_the_fact_so_a_restatement_keeps_the_digest(client, app):
    # As a lock does (tests/test_memory.py): the fact became true at valid_at, said again or not.
    ok(client, "set", key="f", value="v", memory_type="preference",
       valid_at="2025-06-01T00:00:00Z")
    before = _digest(app).digest
    out = ok(client, "restate", key="f")
    assert out["digest_moved"] is False and _digest(app).digest == before


def test_reinforce_counts_and_only_raises_the_confidence(client, app):
    ok(client, "set", key="f", value="v", memory_type="decision", confidence=0.5)
    digests = [_digest(app).digest]
    out = ok(client, "reinforce", key="f", confidence=0.9)
    assert out["confidence"] == 0.9 and out["reinforce_count"] == 1
    assert out["change"] == "reinforce" and out["digest_moved"] is True
    digests.append(_assert_digest_matches_rows(app).digest)
    out = ok(client, "reinforce", key="f", confidence=0.3)
    assert out["confidence"] == 0.9 and out["reinforce_count"] == 2
    digests.append(_assert_digest_matches_rows(app).digest)  # moved: dated now
    out = ok(client, "reinforce", key="f")
    assert out["confidence"] == 0.9 and out["reinforce_count"] == 3
    digests.append(_assert_digest_matches_rows(app).digest)
    assert len(set(digests)) == 4
    row = _row(client)
    assert row["reinforce_count"] == 3 and row["confidence"] == 0.9
    assert [v["change"] for v in _history(client)][:3] == ["reinforce"] * 3
    for bad in (1.5, -0.1, "high", True):
        status, out = call(client, "reinforce", key="f", confidence=bad)
        assert status == 422 and "confidence" in out["error"]["fields"], bad


def test_an_edit_after_reinforcements_keeps_the_counts(client):
    ok(client, "set", key="f", value="v")
    ok(client, "reinforce", key="f")
    ok(client, "recall", key="f")
    ok(client, "set", key="f", value="w")
    row = _row(client)
    assert (row["reinforce_count"], row["recall_count"]) == (1, 1)


# --- memory.recall and memory.backfill ---------------------------------------------------------


def test_recall_counts_the_use_and_keeps_the_last_change(app_factory, redis_client):
    clock = FrozenClock()
    app = app_factory(clock=clock)
    client = app.test_client()
    one = ok(client, "set", key="f", value="Prefers EUR", memory_type="preference")
    listed = _changed_at(app, redis_client)
    before = _digest(app)
    clock.advance(30)
    out = ok(client, "recall", key="f")
    assert out["change"] == "recall" and out["digest_moved"] is False
    assert out["recall_count"] == 1 and out["version"] > one["version"]
    row = _row(client)
    assert row["updated_at"] == _history(client)[1]["updated_at"]  # the write's, not now
    assert row["recalled_at"] is not None and row["recalled_at"] != row["updated_at"]
    assert row["version"] == out["version"]
    ok(client, "recall", key="f")
    assert _row(client)["recall_count"] == 2
    after = _assert_digest_matches_rows(app)
    assert (after.digest, after.changed_at) == (before.digest, before.changed_at)
    assert _changed_at(app, redis_client) == listed  # no new change for the workers
    assert [v["change"] for v in _history(client)] == ["recall", "recall", "write"]
    # The row's last change dates it: an edit after the recalls moves it again.
    edited = ok(client, "set", key="f", value="Prefers USD", memory_type="preference")
    assert _row(client)["updated_at"] != row["updated_at"]
    assert _assert_digest_matches_rows(app).changed_at == edited["version"]


def _unindex(app, redis_client, memory_id, key="f"):
    """Leave a row as an older release wrote it: no recall terms, nothing in the index."""
    org = org_of(app)
    stored = redis_client.hget(keys.recall_docs(org, "support", "u-42"), memory_id)
    counts = decode(stored.decode() if isinstance(stored, bytes) else stored)
    size = sum(counts.values())
    # Its postings in either layout (the index writes the second; an older one the first).
    members = [made(t, tf, size, memory_id) for t, tf in counts.items()
               for made in (posting, posting_v1)]
    redis_client.zrem(keys.recall_postings(org, "support", "u-42"), *members)
    redis_client.hdel(keys.recall_docs(org, "support", "u-42"), memory_id)
    redis_client.hincrby(keys.recall_stats(org, "support", "u-42"), "docs", -1)
    redis_client.hincrby(keys.recall_stats(org, "support", "u-42"), "length", -size)
    redis_client.zrem(keys.recall_vectors_due(org, "support", "u-42"), memory_id)
    row_key = keys.memory_row(org, "support", "u-42", "triage-bot", "-", key)
    redis_client.hset(row_key, "recall_terms", "")


def test_backfill_indexes_an_unindexed_row_and_keeps_its_last_change(client, app, redis_client):
    one = ok(client, "set", key="f", value="Prefers EUR invoices", memory_type="preference")
    ok(client, "set", key="g", value="Ships to Lisbon")
    _unindex(app, redis_client, one["memory_id"])
    assert ok(client, "search", query="EUR invoices")["hits"] == []
    before = _digest(app)
    out = ok(client, "backfill", key="f")
    assert out["change"] == "backfill" and out["changed"] is True
    assert out["digest_moved"] is False and out["version"] > one["version"]
    assert [h["key"] for h in ok(client, "search", query="EUR invoices")["hits"]] == ["f"]
    index_matches_rows(app, "support", "u-42")
    due = keys.recall_vectors_due(org_of(app), "support", "u-42")
    assert redis_client.zscore(due, one["memory_id"]) is not None  # listed for a vector
    row = _row(client)
    assert row["updated_at"] == _history(client)[1]["updated_at"]
    after = _assert_digest_matches_rows(app)
    assert (after.digest, after.changed_at) == (before.digest, before.changed_at)
    # Current already: nothing to write, no version.
    again = ok(client, "backfill", key="f")
    assert again["changed"] is False and again["version"] == out["version"]
    assert [v["change"] for v in _history(client)] == ["backfill", "write"]


def test_backfill_of_a_row_kept_out_of_the_index_writes_nothing(client, app):
    ok(client, "set", key="f", value="v", tags=["forget"])
    ok(client, "set", key="p", value="Terse.", memory_type="profile")
    for key in ("f", "p"):
        out = ok(client, "backfill", key=key)
        assert out["changed"] is False, key
    index_matches_rows(app, "support", "u-42")


# --- every revision --------------------------------------------------------------------------


def test_revisions_by_memory_id_and_with_an_idempotency_key(client):
    one = ok(client, "set", key="f", value="v")
    headers = {"Idempotency-Key": "reinforce-1"}
    first = client.post("/v1/memory.reinforce", headers=headers,
                        json={"namespace": "support", "agent": "triage-bot", "user_id": "u-42",
                              "memory_id": one["memory_id"], "confidence": 0.5})
    again = client.post("/v1/memory.reinforce", headers=headers,
                        json={"namespace": "support", "agent": "triage-bot", "user_id": "u-42",
                              "memory_id": one["memory_id"], "confidence": 0.5})
    assert first.status_code == again.status_code == 200
    assert first.get_json() == again.get_json()
    assert _row(client)["reinforce_count"] == 1  # the repeat applied nothing


def test_a_writer_of_another_agent_cannot_revise_by_memory_id(client):
    one = ok(client, "set", key="f", value="v")
    status, out = call(client, "recall", memory_id=one["memory_id"], agent="other-bot")
    # Auth off: no token fixes the agent, so the id reaches the row from any agent.
    assert status == 200 and out["memory_id"] == one["memory_id"]
    status, out = call(client, "recall", key="f", agent="*")
    assert status == 422 and "agent" in out["error"]["fields"]
