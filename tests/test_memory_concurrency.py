"""Concurrent writers on memory rows and profile sections, through the app and gunicorn."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from app.store.memory import MemoryStore, source_digest_of

WRITERS = 8
EACH = 25
NS = {"namespace": "race", "agent": "bot", "user_id": "u-1"}


def _run(work):
    with ThreadPoolExecutor(max_workers=WRITERS) as pool:
        return [f.result() for f in [pool.submit(work, w) for w in range(WRITERS)]]


def _post(client, op, **body):
    response = client.post(f"/v1/{op}", json={**NS, **body})
    return response.status_code, response.get_json()


def _assert_every_addition_once(value):
    parts = value.split("\n")
    expected = {f"w{w}-{i}" for w in range(WRITERS) for i in range(EACH)}
    assert len(parts) == len(expected) and set(parts) == expected


def test_eight_appenders_to_one_section_lose_nothing(app):
    def work(writer):
        client = app.test_client()
        versions = []
        for i in range(EACH):
            status, out = _post(client, "profile.append", label="log", addition=f"w{writer}-{i}")
            assert status == 200, out
            versions.append(out["version"])
        return versions

    versions = [v for chunk in _run(work) for v in chunk]
    assert len(set(versions)) == WRITERS * EACH
    client = app.test_client()
    row = _post(client, "memory.get", key="log", memory_type="profile")[1]["memory"]
    _assert_every_addition_once(row["value"])
    assert row["version"] == max(versions)
    # Every acknowledged append is one version of the row: the history holds them all.
    history, cursor = [], ""
    while True:
        body = {"key": "log", "limit": 100, **({"cursor": cursor} if cursor else {})}
        out = _post(client, "memory.history", **body)[1]
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
    _post(client, "profile.set", label="persona", value="start")
    barrier = threading.Barrier(WRITERS)
    outcomes: list[list[int]] = [[] for _ in range(rounds)]
    lock = threading.Lock()

    def work(writer):
        c = app.test_client()
        for r in range(rounds):
            barrier.wait()
            seen = _post(c, "memory.get", key="persona")[1]["memory"]["content_sha256"]
            barrier.wait()  # everyone read the same hash before anyone writes
            status, out = _post(c, "profile.set", label="persona", value=f"r{r}-w{writer}",
                                if_match_sha256=seen)
            assert status in (200, 409), out
            if status == 409:
                assert out["error"]["code"] == "HASH_MISMATCH"
            with lock:
                outcomes[r].append(status)

    _run(work)
    for r, statuses in enumerate(outcomes):
        assert sorted(statuses) == [200] + [409] * (WRITERS - 1), (r, statuses)
    final = _post(client, "memory.get", key="persona")[1]["memory"]["value"]
    assert final.startswith(f"r{rounds - 1}-")


def test_concurrent_replaces_each_land_once(app):
    tokens = [f"<{w}-{i}>" for w in range(WRITERS) for i in range(EACH)]
    client = app.test_client()
    _post(client, "profile.set", label="doc", value="".join(tokens), char_limit=65536)

    def work(writer):
        c = app.test_client()
        for i in range(EACH):
            status, out = _post(c, "profile.replace", label="doc", old=f"<{writer}-{i}>",
                                new=f"[{writer}-{i}]")
            assert status == 200, out

    _run(work)
    value = _post(client, "memory.get", key="doc")[1]["memory"]["value"]
    assert value == "".join(t.replace("<", "[").replace(">", "]") for t in tokens)


def test_concurrent_fact_writers_keep_the_digest_exact(app):
    def work(writer):
        c = app.test_client()
        for i in range(EACH):
            kind = ("preference", "decision", "episodic")[i % 3]
            status, out = _post(c, "memory.set", key=f"f{writer}-{i % 5}", value=i,
                                memory_type=kind)
            assert status == 200, out
            if i % 7 == 0:
                _post(c, "memory.delete", key=f"f{writer}-{i % 5}")

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
    _post(client, "memory.set", key="k", value="start")
    start = threading.Event()
    acknowledged: list[int] = []
    refused = []
    guard = threading.Lock()

    def writer(w):
        c = app.test_client()
        start.wait()
        for i in range(EACH):
            status, out = _post(c, "memory.set", key="k", value=f"{w}-{i}")
            with guard:
                if status == 200:
                    acknowledged.append(out["version"])
                else:
                    assert out["error"]["code"] == "MEMORY_LOCKED"
                    refused.append(status)

    def locker():
        c = app.test_client()
        start.wait()
        status, out = _post(c, "memory.lock", key="k")
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
    row = _post(client, "memory.get", key="k")[1]["memory"]
    assert row["locked"] and row["version"] == lock_version
    assert len(acknowledged) + len(refused) == WRITERS * EACH
