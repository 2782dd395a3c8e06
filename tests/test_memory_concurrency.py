"""Concurrent writers on memory rows and profile sections, through the app and gunicorn."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from app.store import keys
from app.store.memory import MemoryStore, source_digest_of
from tests.support.api import op_helpers

WRITERS = 8
EACH = 25
NS = {"namespace": "race", "agent": "bot", "user_id": "u-1"}
call, _ = op_helpers(NS)


def _run(work):
    with ThreadPoolExecutor(max_workers=WRITERS) as pool:
        return [f.result() for f in [pool.submit(work, w) for w in range(WRITERS)]]


def _assert_every_addition_once(value):
    parts = value.split("\n")
    expected = {f"w{w}-{i}" for w in range(WRITERS) for i in range(EACH)}
    assert len(parts) == len(expected) and set(parts) == expected


def test_eight_appenders_to_one_section_lose_nothing(app):
    def work(writer):
        client = app.test_client()
        versions = []
        for i in range(EACH):
            status, out = call(client, "profile.append", label="log", addition=f"w{writer}-{i}")
            assert status == 200, out
            versions.append(out["version"])
        return versions

    versions = [v for chunk in _run(work) for v in chunk]
    assert len(set(versions)) == WRITERS * EACH
    client = app.test_client()
    row = call(client, "memory.get", key="log", memory_type="profile")[1]["memory"]
    _assert_every_addition_once(row["value"])
    assert row["version"] == max(versions)
    # Every acknowledged append is one version of the row: the history holds them all.
    history, cursor = [], ""
    while True:
        body = {"key": "log", "limit": 100, **({"cursor": cursor} if cursor else {})}
        out = call(client, "memory.history", **body)[1]
        history += [v["version"] for v in out["versions"]]
        cursor = out["next_cursor"]
        if not cursor:
            break
    assert sorted(history) == sorted(versions)


@pytest.mark.slow
def test_eight_appenders_through_gunicorn_lose_nothing(live_server):
    def work(writer):
        with requests.Session() as http:
            for i in range(EACH):
                response = http.post(
                    live_server.url + "/v1/profile.append",
                    json={**NS, "label": "log", "addition": f"w{writer}-{i}"},
                    timeout=10,
                )
                assert response.status_code == 200, response.text

    _run(work)
    out = requests.post(
        live_server.url + "/v1/memory.get",
        json={**NS, "key": "log", "memory_type": "profile"},
        timeout=10,
    ).json()
    _assert_every_addition_once(out["memory"]["value"])


def test_racing_if_match_writers_one_wins_each_round(app):
    rounds = 15
    client = app.test_client()
    call(client, "profile.set", label="persona", value="start")
    barrier = threading.Barrier(WRITERS)
    outcomes: list[list[int]] = [[] for _ in range(rounds)]
    lock = threading.Lock()

    def work(writer):
        c = app.test_client()
        for r in range(rounds):
            barrier.wait()
            seen = call(c, "memory.get", key="persona")[1]["memory"]["content_sha256"]
            barrier.wait()  # everyone read the same hash before anyone writes
            status, out = call(c, "profile.set", label="persona", value=f"r{r}-w{writer}",
                                if_match_sha256=seen)
            assert status in (200, 409), out
            if status == 409:
                assert out["error"]["code"] == "HASH_MISMATCH"
            with lock:
                outcomes[r].append(status)

    _run(work)
    for r, statuses in enumerate(outcomes):
        assert sorted(statuses) == [200] + [409] * (WRITERS - 1), (r, statuses)
    final = call(client, "memory.get", key="persona")[1]["memory"]["value"]
    assert final.startswith(f"r{rounds - 1}-")


def test_concurrent_replaces_each_land_once(app):
    tokens = [f"<{w}-{i}>" for w in range(WRITERS) for i in range(EACH)]
    client = app.test_client()
    call(client, "profile.set", label="doc", value="".join(tokens), char_limit=65536)

    def work(writer):
        c = app.test_client()
        for i in range(EACH):
            status, out = call(c, "profile.replace", label="doc", old=f"<{writer}-{i}>",
                                new=f"[{writer}-{i}]")
            assert status == 200, out

    _run(work)
    value = call(client, "memory.get", key="doc")[1]["memory"]["value"]
    assert value == "".join(t.replace("<", "[").replace(">", "]") for t in tokens)


def test_concurrent_fact_writers_keep_the_digest_exact(app):
    def work(writer):
        c = app.test_client()
        for i in range(EACH):
            kind = ("preference", "decision", "episodic")[i % 3]
            status, out = call(c, "memory.set", key=f"f{writer}-{i % 5}", value=i,
                                memory_type=kind)
            assert status == 200, out
            if i % 7 == 0:
                call(c, "memory.delete", key=f"f{writer}-{i % 5}")

    _run(work)
    services = app.extensions["loom"]
    store = services.store(MemoryStore)
    org = services.settings.default_org
    entries = store.source_entries(org, "race", "u-1")
    digest = store.source_digest(org, "race", "u-1")
    assert digest.digest == source_digest_of(entries) and digest.count == len(entries)
    now = services.clock.now_ns()
    rows = store.scan_rows(org, "race", "u-1", batch=1000)[0]
    sources = {row.memory_id for _, row in rows if row is not None and row.is_source(now)}
    assert set(entries) == sources


def test_no_write_lands_after_a_lock(app):
    client = app.test_client()
    call(client, "memory.set", key="k", value="start")
    start = threading.Event()
    acknowledged: list[int] = []
    refused = []
    guard = threading.Lock()

    def writer(w):
        c = app.test_client()
        start.wait()
        for i in range(EACH):
            status, out = call(c, "memory.set", key="k", value=f"{w}-{i}")
            with guard:
                if status == 200:
                    acknowledged.append(out["version"])
                else:
                    assert out["error"]["code"] == "MEMORY_LOCKED"
                    refused.append(status)

    def locker():
        c = app.test_client()
        start.wait()
        status, out = call(c, "memory.lock", key="k")
        assert status == 200
        return out["version"]

    with ThreadPoolExecutor(max_workers=WRITERS + 1) as pool:
        futures = [pool.submit(writer, w) for w in range(WRITERS)]
        lock_future = pool.submit(locker)
        start.set()
        for f in futures:
            f.result()
        lock_version = lock_future.result()
    assert all(version < lock_version for version in acknowledged)
    row = call(client, "memory.get", key="k")[1]["memory"]
    assert row["locked"] and row["version"] == lock_version
    assert len(acknowledged) + len(refused) == WRITERS * EACH


# --- the revisions (memory.revert, restore, restate, reinforce, recall, backfill) ---------------


def _digest_exact(app, user="u-1"):
    services = app.extensions["loom"]
    store = services.store(MemoryStore)
    org = services.settings.default_org
    entries = store.source_entries(org, "race", user)
    digest = store.source_digest(org, "race", user)
    assert digest.digest == source_digest_of(entries) and digest.count == len(entries)
    now = services.clock.now_ns()
    rows = store.scan_rows(org, "race", user, batch=1000)[0]
    sources = {row.memory_id: row for _, row in rows if row is not None and row.is_source(now)}
    assert set(entries) == set(sources)
    for memory_id, row in sources.items():
        date = row.valid_at if row.valid_at is not None else row.updated_at
        assert entries[memory_id].endswith(f":{date}")
    return digest


def _all_versions(client, key):
    history, cursor = [], ""
    while True:
        body = {"key": key, "limit": 100, **({"cursor": cursor} if cursor else {})}
        out = call(client, "memory.history", **body)[1]
        history += out["versions"]
        cursor = out["next_cursor"]
        if not cursor:
            return history


def test_concurrent_recalls_and_reinforcements_each_count_once(app):
    client = app.test_client()
    call(client, "memory.set", key="k", value="fact", memory_type="preference", confidence=0.1)
    confidences = [round(0.1 + 0.8 * (w * EACH + i) / (WRITERS * EACH), 6)
                   for w in range(WRITERS) for i in range(EACH)]

    def work(writer):
        c = app.test_client()
        versions = []
        for i in range(EACH):
            op = "memory.recall" if (writer + i) % 2 else "memory.reinforce"
            extra = {"confidence": confidences[writer * EACH + i]} if op.endswith("ce") else {}
            status, out = call(c, op, key="k", **extra)
            assert status == 200, out
            versions.append(out["version"])
        return versions

    versions = [v for chunk in _run(work) for v in chunk]
    assert len(set(versions)) == WRITERS * EACH
    row = call(client, "memory.get", key="k")[1]["memory"]
    recalls = sum(1 for w in range(WRITERS) for i in range(EACH) if (w + i) % 2)
    assert row["recall_count"] == recalls
    assert row["reinforce_count"] == WRITERS * EACH - recalls
    reinforced = [confidences[w * EACH + i] for w in range(WRITERS) for i in range(EACH)
                  if not (w + i) % 2]
    assert row["confidence"] == max(reinforced)  # raised to the highest, never lowered
    history = _all_versions(client, "k")
    assert sorted(v["version"] for v in history[:-1]) == sorted(versions)
    # The last change is the last reinforcement: no recall moved it.
    last_reinforce = max(v["version"] for v in history if v["change"] == "reinforce")
    assert row["updated_at"] == next(v["updated_at"] for v in history
                                     if v["version"] == last_reinforce)
    _digest_exact(app)


def test_concurrent_restates_and_edits_keep_the_digest_exact(app):
    client = app.test_client()
    for k in range(4):
        call(client, "memory.set", key=f"k{k}", value=k, memory_type="decision")

    def work(writer):
        c = app.test_client()
        for i in range(EACH):
            key = f"k{(writer + i) % 4}"
            if i % 3 == 0:
                status, out = call(c, "memory.set", key=key, value=f"{writer}-{i}",
                                    memory_type="decision")
            else:
                status, out = call(c, "memory.restate", key=key)
            assert status == 200, out

    _run(work)
    _digest_exact(app)


def test_concurrent_reverts_each_bring_back_a_whole_version(app):
    client = app.test_client()
    stored = {}
    for n in range(WRITERS):
        out = call(client, "memory.set", key="k", value=f"v{n}", memory_type="semantic",
                    confidence=round(0.1 * (n + 1), 1), tags=[f"t{n}"])[1]
        stored[out["version"]] = (f"v{n}", round(0.1 * (n + 1), 1), [f"t{n}"])
    targets = sorted(stored)

    def work(writer):
        c = app.test_client()
        landed = []
        for i in range(EACH):
            target = targets[(writer + i) % len(targets)]
            status, out = call(c, "memory.revert", key="k", version=target)
            assert status == 200, out
            assert out["from_version"] == target
            landed.append((out["version"], target))
        return landed

    landed = [pair for chunk in _run(work) for pair in chunk]
    assert len({version for version, _ in landed}) == WRITERS * EACH
    final_version, final_target = max(landed)
    row = call(client, "memory.get", key="k")[1]["memory"]
    assert row["version"] == final_version
    assert (row["value"], row["confidence"], row["tags"]) == stored[final_target]
    for version in _all_versions(client, "k"):
        if version["change"] == "revert":  # every version is one whole stored version
            assert (version["value"], version["confidence"], version["tags"]) == stored[
                version["from_version"]]
    _digest_exact(app)


def test_racing_restores_bring_a_deleted_row_back_once(app):
    rounds = 10
    client = app.test_client()
    call(client, "memory.set", key="k", value="fact", memory_type="preference")
    barrier = threading.Barrier(WRITERS)
    outcomes: list[list[int]] = [[] for _ in range(rounds)]
    guard = threading.Lock()

    def work(writer):
        c = app.test_client()
        for r in range(rounds):
            if writer == 0:
                assert call(c, "memory.delete", key="k")[0] == 200
            barrier.wait()  # deleted before anyone restores
            status, out = call(c, "memory.restore", key="k")
            assert status in (200, 409), out
            if status == 409:
                assert out["error"]["code"] == "MEMORY_NOT_DELETED"
            with guard:
                outcomes[r].append(status)
            barrier.wait()

    _run(work)
    for r, statuses in enumerate(outcomes):
        assert sorted(statuses) == [200] + [409] * (WRITERS - 1), (r, statuses)
    row = call(client, "memory.get", key="k")[1]["memory"]
    assert row["value"] == "fact" and not row["deleted"]
    _digest_exact(app)


def _unindex_all(app, user="u-1"):
    """Leave every row as an older release wrote it: no recall terms, an empty index."""
    services = app.extensions["loom"]
    org = services.settings.default_org
    redis = services.redis
    for name in (keys.recall_docs, keys.recall_postings, keys.recall_stats,
                 keys.recall_vectors_due):
        redis.delete(name(org, "race", user))
    rows = services.store(MemoryStore).scan_rows(org, "race", user, batch=1000)[0]
    for _, row in rows:
        key = keys.memory_row(org, "race", user, row.agent, row.session_id, row.key)
        redis.hset(key, "recall_terms", "")


def test_backfills_racing_edits_never_index_stale_terms(app):
    from tests.test_recall import index_matches_rows

    client = app.test_client()
    for k in range(8):
        call(client, "memory.set", key=f"k{k}", value=f"start {k}")
    _unindex_all(app)
    backfilled = []
    guard = threading.Lock()

    def work(writer):
        c = app.test_client()
        for i in range(EACH):
            key = f"k{(writer + i) % 8}"
            if writer % 2:
                status, out = call(c, "memory.set", key=key, value=f"word{writer}x{i} text")
            else:
                status, out = call(c, "memory.backfill", key=key)
                with guard:
                    backfilled.append(out.get("changed"))
            assert status == 200, out

    _run(work)
    # Each backfill wrote terms computed from the version it wrote over, or nothing: the index
    # is exactly what the rows hold now.
    assert True in backfilled
    index_matches_rows(app, "race", "u-1")
    _digest_exact(app)
