"""Concurrent agent-state writers through the Flask app against the real redis-server.

Two cas writers at one version: exactly one wins, the other gets 412 and changes nothing.
Sub-agents merging different fields in parallel: no field is ever lost, and a deleted field
never comes back. A sweep racing live writers removes only what expired.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from app.clock import FrozenClock
from tests.test_agent_state import AGENT, DAY, enable, guide_type, put, read, store_of

SUB_AGENTS = 8
EACH = 15
ROUNDS = 25


def _run(workers, work):
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return [f.result() for f in [pool.submit(work, w) for w in range(workers)]]


def _fields_type(count, **agent_state):
    fields = {f"f{i}": {"type": "integer"} for i in range(count)}
    return guide_type(fields=fields, retention={"state": "30d"}, agent_state=agent_state)


def test_two_cas_writers_at_one_version_exactly_one_wins(app):
    client = app.test_client()
    enable(client, types=[_fields_type(2)])
    barrier = threading.Barrier(2)
    for version in range(ROUNDS):

        def work(writer, version=version):
            c = app.test_client()
            barrier.wait()
            return put(c, {f"f{writer}": version}, mode="cas", if_version=version)

        results = _run(2, work)
        stored = [(w, out) for w, (status, out) in enumerate(results) if status == 200]
        refused = [out for status, out in results if status == 412]
        assert len(stored) == 1 and len(refused) == 1, results
        assert stored[0][1] == {"stored": True, "version": version + 1,
                                "version_text": str(version + 1), "reason": None,
                                "ignored_args": []}
        assert refused[0]["error"]["code"] == "agent_state_conflict"
        # The loser changed nothing: the state is the winner's whole body.
        assert read(client)[1]["body"] == {f"f{stored[0][0]}": version}
    assert read(client)[1]["version"] == ROUNDS


def test_sub_agents_merging_different_fields_never_lose_a_write(app):
    client = app.test_client()
    enable(client, types=[_fields_type(SUB_AGENTS)])
    barrier = threading.Barrier(SUB_AGENTS)

    def work(sub_agent):
        c = app.test_client()
        barrier.wait()
        versions = []
        for i in range(EACH):
            status, out = put(c, {f"f{sub_agent}": i})
            assert status == 200 and out["stored"] is True, out
            versions.append(out["version"])
        # Even sub-agents remove their field at the end; it must stay removed.
        if sub_agent % 2 == 0:
            status, out = put(c, {f"f{sub_agent}": {"$delete": True}})
            assert status == 200 and out["stored"] is True, out
            versions.append(out["version"])
        return versions

    versions = [v for chunk in _run(SUB_AGENTS, work) for v in chunk]
    total = SUB_AGENTS * EACH + SUB_AGENTS // 2
    # Every stored write has its own version, and versions count the stored writes exactly.
    assert sorted(versions) == list(range(1, total + 1))
    out = read(client)[1]
    assert out["version"] == total
    assert out["body"] == {f"f{k}": EACH - 1 for k in range(SUB_AGENTS) if k % 2 == 1}


def test_merges_at_one_if_version_apply_once(app):
    client = app.test_client()
    enable(client, types=[_fields_type(SUB_AGENTS)])
    put(client, {"f0": 0})
    barrier = threading.Barrier(SUB_AGENTS)

    def work(sub_agent):
        c = app.test_client()
        barrier.wait()
        return put(c, {f"f{sub_agent}": 1}, if_version=1)

    results = _run(SUB_AGENTS, work)
    assert sorted(status for status, _ in results) == [200] + [412] * (SUB_AGENTS - 1)
    winner = next(w for w, (status, _) in enumerate(results) if status == 200)
    expected = {"f0": 0, f"f{winner}": 1} if winner else {"f0": 1}
    out = read(client)[1]
    assert (out["body"], out["version"]) == (expected, 2)


def test_a_sweep_racing_writers_removes_only_expired_fields(app_factory):
    clock = FrozenClock()
    app = app_factory(clock=clock)
    client = app.test_client()
    fields = {f"f{i}": {"type": "integer"} for i in range(SUB_AGENTS)}
    fields["note"] = {"type": "text"}
    enable(client, types=[guide_type(fields=fields, retention={"state": "30d", "note": "1d"})])
    put(client, {"note": "old"})
    clock.advance(2 * DAY)  # the note has expired; the writers below are fresh
    store = store_of(app)
    done = threading.Event()
    sweeps = []

    def sweeper():
        while not done.is_set():
            sweeps.append(store.sweep("default", "shop"))

    thread = threading.Thread(target=sweeper)
    thread.start()
    try:

        def work(sub_agent):
            c = app.test_client()
            for i in range(EACH):
                assert put(c, {f"f{sub_agent}": i})[1]["stored"] is True

        _run(SUB_AGENTS, work)
    finally:
        done.set()
        thread.join()
    assert sweeps
    store.sweep("default", "shop")
    out = read(client)[1]
    assert out["body"] == {f"f{k}": EACH - 1 for k in range(SUB_AGENTS)}
    assert out["version"] == 1 + SUB_AGENTS * EACH
    raw = store.redis.hgetall(next(store.redis.scan_iter("loom:as:*")))
    assert "old" not in raw["body"]
    assert raw["version"] == str(1 + SUB_AGENTS * EACH)
    assert AGENT == raw["agent"]
