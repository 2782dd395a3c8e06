"""user.erase and erasure.status against a real redis-server, real RQ jobs and a scripted model.

A user gets data in every plane (facts with versions, a tombstone, profile sections, a built
structured profile, working-memory blocks in two scopes, profile readers, agent states of their
subject scope and naming them, a queued and a failed RQ job naming them); another user of the
same namespace gets the same. After the erasure a full scan of the database (every key and
value, RQ's job payloads decompressed) finds neither the erased user's id nor any of their
content, and finds all of the other user's. The receipt's counts are what was written.
"""

from __future__ import annotations

import json
import os
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Queue
from rq.executions import Execution
from rq.job import JobStatus
from rq.registry import FailedJobRegistry

from app.clock import FrozenClock
from app.services import Services
from app.store import keys
from app.store.erasure import KINDS, STEPS, ErasureStore, scrub_user
from app.store.erasure.leftovers import pointers_naming
from jobs.queues import BUILDS, MAINTENANCE
from jobs.structured_build import build_user
from jobs.structured_profile import build_user_job, run_pass
from tests.conftest import ON_CLUSTER, make_app, on_cluster_skip
from tests.support.erasure_worker import erasure_worker_thread, run_erasure_jobs
from tests.support.model_server import ScriptedModelServer
from tests.support.persistence import append_only_bytes, own_server
from tests.support.redis_dump import dump_everything

ORG = "default"
NS = "support"
USER = "u-erase-7f3a9c"
OTHER = "u-keep-19c2d4"
SCHEMA = {
    "type": "object",
    "properties": {
        "preferred_name": {"type": "string", "description": "What the user asks to be called"},
        "timezone": {"type": "string", "description": "IANA time zone"},
    },
}
GUIDE_TYPE = {
    "type": "shop_guide_state",
    "ownership": "agent",
    "fields": {"offer": {"type": "string"}, "note": {"type": "text", "pii": True}},
    "agent_state": {"scope": "conversation", "max_bytes": 16384, "write": "both"},
}
LOYALTY_TYPE = {
    "type": "loyalty_state",
    "ownership": "agent",
    "fields": {"tier": {"type": "string"}},
    "agent_state": {"scope": "subject", "max_bytes": 16384, "write": "both"},
}
# What plant() writes for one user, per kind of the receipt (index entries vary with layout).
PLANTED = {
    "memory_rows": 4,  # name (2 versions), tz, old (set + tombstone), ticket (session s-1)
    "memory_versions": 10,  # 2 + 1 + 2 + 1 facts, 1 + 2 sections, 1 structured
    "profile_sections": 2,  # persona, notes (appended twice)
    "structured_profiles": 1,
    "working_memory_blocks": 3,  # scratch + plan in one scope, state in a run's scope
    "agent_states": 2,  # their subject scope's state, a conversation's state naming them
    "activity_entries": 2,  # two readers (agent, client)
    "jobs": 2,  # a queued build naming them, a failed one
    "tokens": 1,  # an end user's token pinned to them
}


def answer(**values: Any) -> dict[str, Any]:
    return {"preferred_name": None, "timezone": None, **values}


class World:
    def __init__(self, redis_url: str, tmp_path: Path, model: ScriptedModelServer | None,
                 **settings: Any) -> None:
        self.clock = FrozenClock()
        self.model = model
        self.app = make_app(
            redis_url, tmp_path, clock=self.clock,
            llm_base_url=model.base_url if model else "",
            llm_model="scripted-model" if model else "",
            llm_timeout_seconds=5.0, **settings,
        )
        self.client = self.app.test_client()
        self.services: Services = self.app.extensions["loom"]

    def call(self, op: str, headers: dict[str, str] | None = None, **body: Any):
        response = self.client.post(f"/v1/{op}", json={"namespace": NS, "agent": "chat", **body},
                                    headers=headers or {})
        assert response.status_code < 500, response.get_json()
        return response.status_code, response.get_json()

    def post(self, op: str, **body: Any) -> dict[str, Any]:
        status, out = self.call(op, **body)
        assert status == 200, (op, out)
        return out

    def fact(self, key: str, value: str, user: str, **fields: Any) -> dict[str, Any]:
        return self.post("memory.set", user_id=user, key=key, value=value,
                         memory_type=fields.pop("memory_type", "semantic"), **fields)

    def put_state(self, agent: str, scope: dict[str, str], body: dict[str, Any],
                  **extra: Any) -> dict[str, Any]:
        response = self.client.put("/v1/agent-state", json={
            "namespace": NS, "agent": agent, "scope": scope, "body": body, **extra})
        assert response.status_code == 200, response.get_json()
        assert response.get_json()["stored"], response.get_json()
        return response.get_json()

    def erase(self, user: str = USER, **body: Any) -> dict[str, Any]:
        """user.erase answers at once (running); a worker's run of the job finishes it."""
        started = self.post("user.erase", user_id=user, **body)
        assert started["status"] == "running" and started["steps_done"] == 0, started
        run_erasure_jobs(self.services)
        return self.post("erasure.status", erasure_id=started["erasure_id"])

    def store(self) -> ErasureStore:
        return self.services.store(ErasureStore)

    def run_pass(self) -> dict[str, Any]:
        return run_pass(self.services, holder="test-worker", force=True)


def make_world(redis_url: str, tmp_path: Path, model: ScriptedModelServer | None,
               **settings: Any) -> World:
    """A world with a profile schema and agent state on (two agent-owned types)."""
    w = World(redis_url, tmp_path, model, **settings)
    w.post("profile_schema.set", json_schema=SCHEMA)
    w.post("features.set", features={"agent_state": True})
    w.post("object_types.set", types=[GUIDE_TYPE, LOYALTY_TYPE])
    return w


@pytest.fixture
def world(redis_url, tmp_path, model):
    return make_world(redis_url, tmp_path, model)


def enqueue_jobs(services: Services, user: str) -> tuple[str, str]:
    """A queued build naming the user, and one in the failed registry."""
    queue = Queue(BUILDS, connection=services.queue_redis)
    queued = queue.enqueue(build_user_job, ORG, NS, user)
    failed = queue.enqueue(build_user_job, ORG, NS, user)
    queue.remove(failed)
    failed.set_status(JobStatus.FAILED)
    FailedJobRegistry(queue=queue).add(failed, ttl=3600, exc_string="model call failed")
    return queued.id, failed.id


def plant(world: World, user: str, mark: str) -> None:
    """Data about ``user`` in every plane, each text carrying ``mark``; the counts are
    PLANTED."""
    world.fact("name", f"{mark} call me Sam", user)
    world.fact("name", f"{mark} call me Samuel", user)
    world.fact("tz", f"{mark} lives in Berlin", user)
    world.fact("old", f"{mark} an old fact", user)
    world.post("memory.delete", user_id=user, key="old")
    world.fact("ticket", f"{mark} ticket 981", user, session_id="s-1")
    world.post("profile.set", user_id=user, label="persona", value=f"{mark} persona text")
    world.post("profile.append", user_id=user, label="notes", addition=f"{mark} note one")
    world.post("profile.append", user_id=user, label="notes", addition=f"{mark} note two")
    assert world.model is not None
    world.model.script(answer(preferred_name=f"{mark}-Sam", timezone="Europe/Berlin"))
    world.clock.advance(601)  # past the cooldown and the last pass's scan list
    world.run_pass()
    assert world.post("profile.structured", user_id=user)["profile"]["preferred_name"] == (
        f"{mark}-Sam")
    world.post("working_memory.set", user_id=user, block_key="scratch",
               content=f"{mark} scratch")
    world.post("working_memory.set", user_id=user, block_key="plan", content=f"{mark} plan")
    world.post("working_memory.set", user_id=user, session_id="s-1", run_id="r-1",
               block_key="state", content=f"{mark} run state")
    # Two readers of the profile (profile.structured above read as a third client: reset).
    world.services.redis.delete(keys.profile_reads(ORG, NS, user),
                                keys.profile_reads_meta(ORG, NS, user))
    world.call("profile.render", headers={"X-Loom-Client": "app-a"}, user_id=user)
    world.call("profile.structured", headers={"X-Loom-Client": "app-b"}, user_id=user)
    world.put_state("loyalty", {"kind": "subject", "id": user}, {"tier": f"{mark} gold"})
    world.put_state("shop_guide", {"kind": "conversation", "id": f"conv-{user}"},
                    {"offer": f"{mark} offer"}, subject=user)
    enqueue_jobs(world.services, user)
    world.post("token.create", role="viewer", read_user_id=user, label="end-user app")


def everything(redis_url: str) -> str:
    """Every key and value of the test database, RQ's compressed payloads opened (on the
    cluster: every primary, and the queue's own server)."""
    if ON_CLUSTER:
        return "\n".join([_everything(redis.RedisCluster.from_url(redis_url)),
                          _everything(redis.Redis.from_url(os.environ["LOOM_QUEUE_URL"]))])
    return _everything(redis.Redis.from_url(redis_url))


def _everything(raw: redis.Redis) -> str:
    parts = [dump_everything(raw)]
    for key in raw.scan_iter(count=1000):
        kind = raw.type(key)
        values: list[bytes] = []
        if kind == b"hash":
            values = list(raw.hgetall(key).values())
        elif kind == b"stream":
            values = [v for _id, entry in raw.xrange(key) for v in entry.values()]
        for value in values:
            try:
                parts.append(repr(zlib.decompress(value)))
            except zlib.error:
                pass
    raw.close()
    return "\n".join(parts)


def user_keys(world: World, user: str) -> list[str]:
    return list(world.services.redis.scan_iter(match=keys.user_pattern(ORG, NS, user)))


# --- the whole erasure --------------------------------------------------------------------------


def test_erasure_leaves_nothing_of_the_user_and_everything_of_the_others(world, redis_url):
    plant(world, USER, "MARK-ERASED")
    plant(world, OTHER, "MARK-KEPT")
    world.put_state("shop_guide", {"kind": "conversation", "id": "conv-anon"},
                    {"offer": "MARK-KEPT anonymous"})
    before = everything(redis_url)
    assert USER in before and "MARK-ERASED" in before  # the scan sees payloads at all

    receipt = world.erase()

    assert receipt["status"] == "done" and receipt["retryable"] is False
    assert receipt["census"]["clean"] is True and receipt["census"]["found"] == {}
    assert receipt["attempts"] == 1 and receipt["error"] == ""
    assert {k: receipt["counts"][k] for k in PLANTED} == PLANTED
    assert receipt["counts"]["index_entries"] > 0
    assert set(receipt["counts"]) == set(KINDS)
    assert receipt["started_at"] <= receipt["finished_at"]
    after = everything(redis_url)
    assert USER not in after
    assert "MARK-ERASED" not in after
    assert "MARK-KEPT" in after and OTHER in after
    assert "MARK-KEPT anonymous" in after  # a state naming nobody is not the user's
    # The other user is whole: their profile, blocks, states and jobs.
    assert world.post("profile.structured", user_id=OTHER)["profile"]["preferred_name"] == (
        "MARK-KEPT-Sam")
    assert len(world.post("memory.history", user_id=OTHER, key="name")["versions"]) == 2
    assert world.post("working_memory.get", user_id=OTHER, block_key="scratch")["content"] == (
        "MARK-KEPT scratch")
    assert Queue(BUILDS, connection=world.services.queue_redis).count == 1
    assert len(FailedJobRegistry(BUILDS, connection=world.services.queue_redis)) == 1


def test_the_receipt_and_the_audit_hold_counts_and_times_only(world):
    plant(world, USER, "MARK-ERASED")
    receipt = world.erase()
    by_user = world.post("erasure.status", user_id=USER)
    by_id = world.post("erasure.status", erasure_id=receipt["erasure_id"])
    assert by_user == by_id == receipt
    assert USER not in json.dumps(receipt) and "MARK" not in json.dumps(receipt)
    assert receipt["erasure_id"] == world.store().erasure_id(ORG, NS, USER)
    entries = world.post("audit.list")["entries"]
    erased = [e for e in entries if e["action"] == "user.erase"]
    assert len(erased) == 1 and erased[0]["status"] == "done"
    assert erased[0]["counts"] == receipt["counts"]
    assert USER not in json.dumps(entries)
    # Another user's id does not read this erasure.
    status, out = world.call("erasure.status", user_id=OTHER)
    assert status == 404 and out["error"]["code"] == "ERASURE_NOT_FOUND"
    # Nor does this erasure's id beside another user's: it is no erasure of theirs.
    status, out = world.call("erasure.status", user_id=OTHER,
                             erasure_id=receipt["erasure_id"])
    assert status == 404 and out["error"]["code"] == "ERASURE_NOT_FOUND"
    assert USER not in json.dumps(out)


def test_a_user_with_nothing_is_erased_with_zero_counts(world):
    receipt = world.erase(user="u-never-seen")
    assert receipt["status"] == "done" and set(receipt["counts"].values()) == {0}


def test_bad_requests_are_refused(world):
    status, out = world.call("user.erase")
    assert status == 422 and out["error"]["code"] == "IDENTITY_INCOMPLETE"
    status, out = world.call("user.erase", user_id=USER, handles=["not a handle @@"])
    assert status == 422 and "handles.0" in out["error"]["fields"]
    status, out = world.call("erasure.status", erasure_id="nope")
    assert status == 422 and "erasure_id" in out["error"]["fields"]


# --- while it runs: writes refused, fail closed, resumable --------------------------------------


def test_memory_writes_for_the_user_are_refused_while_it_runs(world):
    plant(world, USER, "MARK-ERASED")
    seen: dict[str, Any] = {}

    def during(step: str, counts: dict[str, int]) -> None:
        if step == "working_memory":
            seen["set"] = world.call("memory.set", user_id=USER, key="k", value="x")
            seen["profile"] = world.call("profile.set", user_id=USER, label="p", value="x")
            seen["replace"] = world.call("profile.replace", user_id=USER, label="persona",
                                         old="not there", new="x")
            seen["other"] = world.call("memory.set", user_id=OTHER, key="k", value="x")
            seen["status"] = world.post("erasure.status", user_id=USER)

    world.store().erase(ORG, NS, USER, actor="test", progress=during)
    for name in ("set", "profile", "replace"):
        status, out = seen[name]
        assert status == 409 and out["error"]["code"] == "USER_BEING_ERASED", out
    assert seen["other"][0] == 200
    assert seen["status"]["status"] == "running" and seen["status"]["step"] == "working_memory"
    assert seen["status"]["counts"]["memory_rows"] == PLANTED["memory_rows"]
    # Done: a later write starts from nothing.
    world.fact("name", "fresh", USER)
    assert len(world.post("memory.history", user_id=USER, key="name")["versions"]) == 1
    assert world.post("profile.render", user_id=USER, read_scope="own_user")["labels"] == []
    assert world.post("working_memory.get", user_id=USER, block_key="scratch")["found"] is False
    structured = world.post("profile.structured", user_id=USER)
    assert structured["status"] == "pending" and structured["version"] == 0
    response = world.client.get(f"/v1/profiles/{USER}/agent-state?namespace={NS}")
    assert response.get_json()["count"] == 0


def test_a_row_the_census_finds_fails_it_closed_and_a_retry_finishes(world):
    plant(world, USER, "MARK-ERASED")
    late = keys.memory_row(ORG, NS, USER, "-", "-", "structured_profile")

    def race(step: str, counts: dict[str, int]) -> None:
        if step == "sweep":
            # What a build writing in the gap between its check and its write leaves behind.
            world.services.redis.hset(late, mapping={
                "memory_type": "profile", "key": "structured_profile", "agent": "-",
                "session_id": "-", "value": '"MARK-ERASED late"'})

    failed = world.store().erase(ORG, NS, USER, actor="test", progress=race)
    assert failed["status"] == "failed" and failed["retryable"] is True
    assert failed["error"] == "CENSUS_FOUND_DATA"
    assert failed["census"]["clean"] is False
    assert failed["census"]["found"] == {"memory_rows": 1}
    assert failed["finished_at"] is None
    assert world.post("erasure.status", user_id=USER)["status"] == "failed"
    status, out = world.call("memory.set", user_id=USER, key="k", value="x")
    assert status == 409 and out["error"]["code"] == "USER_BEING_ERASED"  # still closed

    done = world.erase()
    assert done["status"] == "done" and done["attempts"] == 2
    assert done["census"]["clean"] is True
    expected = {**PLANTED, "structured_profiles": PLANTED["structured_profiles"] + 1}
    assert {k: done["counts"][k] for k in PLANTED} == expected
    assert user_keys(world, USER) == []
    assert world.post("memory.set", user_id=USER, key="k", value="x")["created"] is True
    audit = [e["status"] for e in world.post("audit.list")["entries"]
             if e["action"] == "user.erase"]
    assert audit == ["done", "failed"]


def test_a_late_build_index_entry_is_swept(world):
    plant(world, USER, "MARK-ERASED")
    from app.store.structured import StructuredStore

    def race(step: str, counts: dict[str, int]) -> None:
        if step == "memory":
            # A build whose row and record landed before the marker indexes the user after the
            # memory step: its entry in the namespace's built users and expiry index.
            world.services.store(StructuredStore).index_build(ORG, NS, USER, next_expiry=5)

    receipt = world.store().erase(ORG, NS, USER, actor="test", progress=race)
    assert receipt["status"] == "done" and receipt["census"]["clean"]
    assert user_keys(world, USER) == []
    assert USER not in world.services.redis.smembers(keys.structured_users(ORG, NS))
    assert world.services.redis.zscore(keys.structured_expiry(ORG, NS), USER) is None


class Crash(BaseException):
    """The process dies mid-erasure (not an error the saga can record)."""


def test_an_interrupted_erasure_resumes_with_exact_counts(world):
    plant(world, USER, "MARK-ERASED")

    def crash(step: str, counts: dict[str, int]) -> None:
        if step == "activity":
            raise Crash()

    with pytest.raises(Crash):
        world.store().erase(ORG, NS, USER, actor="test", progress=crash)
    interrupted = world.post("erasure.status", user_id=USER)
    assert interrupted["status"] == "interrupted" and interrupted["retryable"]
    assert interrupted["step"] == "activity"
    status, _ = world.call("memory.set", user_id=USER, key="k", value="x")
    assert status == 409
    done = world.erase()
    assert done["status"] == "done" and done["attempts"] == 2
    assert {k: done["counts"][k] for k in PLANTED} == PLANTED


def test_an_error_mid_erasure_is_recorded_failed_and_retryable(world):
    plant(world, USER, "MARK-ERASED")

    def broken(step: str, counts: dict[str, int]) -> None:
        if step == "jobs":
            raise RuntimeError("queue Redis went away")

    with pytest.raises(RuntimeError):
        world.store().erase(ORG, NS, USER, actor="test", progress=broken)
    failed = world.post("erasure.status", user_id=USER)
    assert failed["status"] == "failed" and failed["error"] == "RuntimeError"
    done = world.erase()
    assert done["status"] == "done"
    assert {k: done["counts"][k] for k in PLANTED} == PLANTED


def test_a_second_erasure_while_one_runs_is_409(world):
    erasure = world.store().erasure_id(ORG, NS, USER)
    world.services.redis.set(keys.erasure_lock(ORG, NS, erasure), "someone-else", px=5000)
    status, out = world.call("user.erase", user_id=USER)
    assert status == 409 and out["error"]["code"] == "ERASURE_RUNNING"
    assert out["error"]["erasure_id"] == erasure
    status, out = world.call("erasure.status", user_id=USER)
    assert status == 404  # nothing was started


def test_concurrent_erasures_of_one_user_count_once(world):
    """Four user.erase calls at once start one run: each answers that run's receipt (or 409
    while another call holds the start), one job is queued, and the counts are counted once."""
    plant(world, USER, "MARK-ERASED")
    results: list[tuple[int, dict[str, Any]]] = []
    start = threading.Barrier(4)

    def erase() -> None:
        client = world.app.test_client()
        start.wait(120)
        response = client.post("/v1/user.erase", json={"namespace": NS, "user_id": USER})
        results.append((response.status_code, response.get_json()))

    threads = [threading.Thread(target=erase) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(results) == 4
    assert all(status == 200 or out["error"]["code"] == "ERASURE_RUNNING"
               for status, out in results)
    answered = [out for status, out in results if status == 200]
    assert answered and all(out["status"] == "running" for out in answered)
    named = {out["erasure_id"] if status == 200 else out["error"]["erasure_id"]
             for status, out in results}
    assert named == {world.store().erasure_id(ORG, NS, USER)}
    assert Queue(MAINTENANCE, connection=world.services.queue_redis).count == 1
    run_erasure_jobs(world.services)
    final = world.post("erasure.status", user_id=USER)
    assert final["status"] == "done" and final["attempts"] == 1
    assert {k: final["counts"][k] for k in PLANTED} == PLANTED
    assert user_keys(world, USER) == []


def test_concurrent_runs_of_one_erasure_count_once(world):
    """Two workers' runs of one erasure at once (a job enqueued twice): one runs it, the other
    finds the lock held and ends, and the counts are counted once."""
    plant(world, USER, "MARK-ERASED")
    started = world.post("user.erase", user_id=USER)
    store = world.store()
    results: list[Any] = []
    start = threading.Barrier(2)

    def run() -> None:
        start.wait(120)
        results.append(store.run_background(ORG, NS, started["erasure_id"]))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(results) == 2 and results.count(None) == 1
    run_erasure_jobs(world.services)  # the queued job finds the erasure done: nothing to run
    final = world.post("erasure.status", user_id=USER)
    assert final["status"] == "done"
    assert {k: final["counts"][k] for k in PLANTED} == PLANTED
    assert user_keys(world, USER) == []


def test_writers_racing_the_erasure_are_all_erased_and_counted(world):
    """Eight writers write facts for the user until the erasure refuses them; every write that
    was answered 200 is a row the receipt counts, and nothing of the user is left."""
    stopped = threading.Barrier(9)
    written: list[int] = [0] * 8
    refused: list[str] = [""] * 8

    def writer(n: int) -> None:
        client = world.app.test_client()
        i = 0
        while True:
            response = client.post("/v1/memory.set", json={
                "namespace": NS, "agent": "chat", "user_id": USER, "key": f"k-{n}-{i}",
                "value": f"MARK-RACE {n} {i}"})
            if response.status_code != 200:
                refused[n] = response.get_json()["error"]["code"]
                break
            written[n] += 1
            i += 1
        stopped.wait(120)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 120
    while min(written) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert min(written) >= 3, written

    def hold(step: str, counts: dict[str, int]) -> None:
        if step == "worker_state":
            stopped.wait(120)  # every writer has seen a refusal: none writes after the census

    receipt = world.store().erase(ORG, NS, USER, actor="test", progress=hold)
    for thread in threads:
        thread.join(120)
    while receipt["status"] != "done":  # a write's namespace entries may land after a step
        receipt = world.erase()
    assert refused == ["USER_BEING_ERASED"] * 8
    assert receipt["counts"]["memory_rows"] == sum(written)
    assert receipt["counts"]["memory_versions"] == sum(written)
    assert user_keys(world, USER) == []
    assert pointers_naming(world.services.redis, _probe(world), remove=False) == 0


def _probe(world: World):
    from app.store.erasure import ErasureRun

    return ErasureRun(ORG, NS, USER, "", [], "test")


# --- builds and jobs --------------------------------------------------------------------------


def test_a_build_in_flight_writes_nothing_for_the_erased_user(world, model, redis_url):
    world.fact("name", "MARK-ERASED call me Sam", USER)
    world.fact("tz", "MARK-ERASED Berlin", USER)
    asked = threading.Event()
    release = threading.Event()

    def slow(request: Any) -> dict[str, Any]:
        asked.set()
        release.wait(10)
        return answer(preferred_name="MARK-ERASED-Sam")

    model.default = slow
    passes: list[dict[str, Any]] = []
    runner = threading.Thread(target=lambda: passes.append(world.run_pass()))
    runner.start()
    assert asked.wait(10)
    receipt = world.erase()
    release.set()
    runner.join(15)
    assert receipt["status"] == "done" and receipt["census"]["clean"]
    assert passes and passes[0]["built"] == [(json.dumps([ORG, NS], separators=(",", ":")),
                                              USER, "unchanged")]
    assert user_keys(world, USER) == []
    text = everything(redis_url)
    assert USER not in text and "MARK-ERASED" not in text
    # A build reaching the erased user later writes nothing either.
    assert build_user(world.services, ORG, NS, USER).wrote is False
    assert user_keys(world, USER) == []


def take(queue: Queue, job: Any) -> None:
    """What a worker does when it takes a job: out of the queue, an execution in the started
    registry, status started."""
    queue.remove(job)
    with queue.connection.pipeline() as pipe:
        Execution.create(job, ttl=600, pipeline=pipe)
        job.set_status(JobStatus.STARTED, pipeline=pipe)
        pipe.execute()


def end(queue: Queue, job: Any) -> None:
    """What a worker does when the job ends: out of the started registry, into the finished."""
    with queue.connection.pipeline() as pipe:
        queue.started_job_registry.remove_executions(job, pipeline=pipe)
        queue.finished_job_registry.add(job, ttl=600, pipeline=pipe)
        job.set_status(JobStatus.FINISHED, pipeline=pipe)
        pipe.execute()


def test_a_running_job_fails_the_census_until_it_ends(world):
    world.fact("name", "MARK-ERASED", USER)
    queue = Queue(BUILDS, connection=world.services.queue_redis)
    job = queue.enqueue(build_user_job, ORG, NS, USER)
    take(queue, job)
    failed = world.erase()
    assert failed["status"] == "failed" and failed["census"]["found"] == {"jobs": 1}
    assert failed["counts"]["jobs"] == 0  # a running job is never deleted under its worker
    assert world.services.queue_redis.exists(job.key)
    end(queue, job)
    done = world.erase()
    assert done["status"] == "done" and done["counts"]["jobs"] == 1
    assert not world.services.queue_redis.exists(job.key)


def test_jobs_of_another_namespace_or_user_are_kept(world):
    queue = Queue(BUILDS, connection=world.services.queue_redis)
    kept = [queue.enqueue(build_user_job, ORG, "elsewhere", USER),
            queue.enqueue(build_user_job, ORG, NS, OTHER),
            queue.enqueue(build_user_job, "other-org", NS, USER)]
    gone = queue.enqueue(build_user_job, org=ORG, namespace=NS, user_id=USER)
    receipt = world.erase()
    assert receipt["counts"]["jobs"] == 1
    assert not world.services.queue_redis.exists(gone.key)
    assert all(world.services.queue_redis.exists(job.key) for job in kept)
    assert queue.count == 3


def test_the_workers_kept_state_forgets_the_user():
    ns_id = json.dumps([ORG, NS], separators=(",", ":"))
    other_ns = json.dumps([ORG, "elsewhere"], separators=(",", ":"))
    state = {
        "format": 1, "cursor": ns_id,
        "scans": {ns_id: {"users": [OTHER, USER], "complete": True},
                  other_ns: {"users": [USER], "complete": True}},
        "user_waits": {ns_id: {USER: {"failures": 2}, OTHER: {"failures": 1}},
                       other_ns: {USER: {"failures": 1}}},
    }
    scrubbed, removed = scrub_user(state, ORG, NS, USER)
    assert removed == 2
    assert scrubbed["scans"][ns_id]["users"] == [OTHER]
    assert scrubbed["user_waits"][ns_id] == {OTHER: {"failures": 1}}
    assert scrubbed["scans"][other_ns] == state["scans"][other_ns]  # another namespace's user
    assert scrubbed["cursor"] == ns_id


def test_the_erasure_scrubs_the_stored_worker_state(world):
    ns_id = json.dumps([ORG, NS], separators=(",", ":"))
    key = keys.worker_state("structured_profile")
    world.services.redis.hset(key, mapping={
        "generation": "test-worker",
        "state": json.dumps({"scans": {ns_id: {"users": [USER, OTHER]}},
                             "user_waits": {ns_id: {USER: {"failures": 1}}}})})
    receipt = world.erase()
    assert receipt["status"] == "done"
    state = json.loads(world.services.redis.hget(key, "state"))
    assert state["scans"][ns_id]["users"] == [OTHER] and state["user_waits"][ns_id] == {}
    assert world.services.redis.hget(key, "generation") == "test-worker"


def test_agent_states_under_another_handle_go_when_the_handle_is_given(world):
    world.put_state("loyalty", {"kind": "subject", "id": "Sam@Example.com"}, {"tier": "gold"})
    world.put_state("shop_guide", {"kind": "conversation", "id": "conv-9"}, {"offer": "x"},
                    subject="+49 170 1234567")
    world.put_state("loyalty", {"kind": "subject", "id": USER}, {"tier": "silver"})
    receipt = world.erase(handles=["sam@example.com", "0049 170 1234567"])
    assert receipt["counts"]["agent_states"] == 3
    for profile_id in ("sam@example.com", "+491701234567", USER):
        response = world.client.get(f"/v1/profiles/{profile_id}/agent-state?namespace={NS}")
        assert response.get_json()["count"] == 0


# --- the append-only file -----------------------------------------------------------------------


def _aof_text(data_dir: Path) -> bytes:
    return append_only_bytes(data_dir)


def _wait_for(predicate, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _rewrite_done(client: redis.Redis) -> bool:
    info = client.info("persistence")
    return not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]


@on_cluster_skip  # a server of its own, with its append-only file: not the data plane under test
@pytest.mark.parametrize("rewrite", [True, False], ids=["rewrite", "no-rewrite"])
def test_erased_data_leaves_the_append_only_file_only_with_a_rewrite(tmp_path, rewrite):
    data_dir = tmp_path / "redis"
    with own_server(data_dir, appendonly=True) as server:
        app = make_app(server.url, tmp_path, erasure_rewrite_aof=rewrite)
        client = app.test_client()
        body = {"namespace": NS, "agent": "chat", "user_id": USER}
        assert client.post("/v1/memory.set", json={
            **body, "key": "k", "value": "MARK-IN-THE-AOF"}).status_code == 200
        assert _wait_for(lambda: b"MARK-IN-THE-AOF" in _aof_text(data_dir))
        started = client.post("/v1/user.erase", json=body).get_json()
        assert started["status"] == "running"
        run_erasure_jobs(app.extensions["loom"])  # the rewrite is asked for by the worker
        receipt = client.post("/v1/erasure.status", json=body).get_json()
        assert receipt["status"] == "done"
        probe = redis.Redis.from_url(server.url)
        assert _wait_for(lambda: _rewrite_done(probe))
        if rewrite:
            assert receipt["aof_rewrite"] == "scheduled"
            assert _wait_for(lambda: b"MARK-IN-THE-AOF" not in _aof_text(data_dir))
            assert USER.encode() not in _aof_text(data_dir)
        else:
            assert receipt["aof_rewrite"] == "off"
            time.sleep(0.2)
            assert b"MARK-IN-THE-AOF" in _aof_text(data_dir)  # what the README warns of
        probe.close()


# --- the command --------------------------------------------------------------------------------


def test_the_erase_command_shows_each_step_and_the_receipt(world):
    plant(world, USER, "MARK-ERASED")
    with erasure_worker_thread(world.services):
        result = world.app.test_cli_runner().invoke(
            args=["loom", "erase", USER, "--namespace", NS])
    assert result.exit_code == 0, result.output
    for step in ("mark", "memory", "working_memory", "activity", "agent_state", "jobs",
                 "worker_state", "sweep", "census"):
        assert f"  {step} " in result.stderr
    assert "status:     done (attempt 1)" in result.stdout
    assert f"memory_rows            {PLANTED['memory_rows']}" in result.stdout
    assert user_keys(world, USER) == []


def test_the_erase_command_fails_while_another_runs_and_on_a_dirty_census(world):
    erasure = world.store().erasure_id(ORG, NS, USER)
    lock = keys.erasure_lock(ORG, NS, erasure)
    world.services.redis.set(lock, "someone-else", px=5000)
    runner = world.app.test_cli_runner()
    result = runner.invoke(args=["loom", "erase", USER, "--namespace", NS])
    assert result.exit_code == 1 and "ERASURE_RUNNING" in result.output
    world.services.redis.delete(lock)
    queue = Queue(BUILDS, connection=world.services.queue_redis)
    job = queue.enqueue(build_user_job, ORG, NS, USER)
    take(queue, job)
    with erasure_worker_thread(world.services):
        result = runner.invoke(args=["loom", "erase", USER, "--namespace", NS])
    assert result.exit_code == 1 and "run this command again" in result.output
    assert "status:     failed" in result.stdout


def test_glob_characters_in_a_user_id_match_only_that_user(world):
    odd, lookalike = "we*ird[1]?", "weXXird1!"
    world.fact("k", "MARK-ODD", odd)
    world.post("working_memory.set", user_id=odd, block_key="b", content="MARK-ODD")
    world.fact("k", "MARK-LOOKALIKE", lookalike)
    world.post("working_memory.set", user_id=lookalike, block_key="b", content="MARK-LOOKALIKE")
    receipt = world.erase(user=odd)
    assert receipt["status"] == "done"
    assert receipt["counts"]["memory_rows"] == 1
    assert receipt["counts"]["working_memory_blocks"] == 1
    assert world.post("memory.get", user_id=lookalike, key="k")["memory"]["value"] == (
        "MARK-LOOKALIKE")
    assert world.post("memory.get", user_id=odd, key="k")["found"] is False


def test_a_retry_without_the_marker_keeps_the_counts_of_earlier_attempts(world):
    plant(world, USER, "MARK-ERASED")

    def crash(step: str, counts: dict[str, int]) -> None:
        if step == "working_memory":
            raise Crash()

    with pytest.raises(Crash):
        world.store().erase(ORG, NS, USER, actor="test", progress=crash)
    world.services.redis.delete(keys.user_erasing(ORG, NS, USER))  # removed by hand
    done = world.erase()
    assert done["status"] == "done"
    assert {k: done["counts"][k] for k in PLANTED} == PLANTED


# --- agent state and tokens -----------------------------------------------------------------


def test_agent_state_writes_naming_the_user_are_refused_while_it_runs(world):
    plant(world, USER, "MARK-ERASED")
    seen: dict[str, Any] = {}

    def put(scope: dict[str, str], **extra: Any):
        response = world.client.put("/v1/agent-state", json={
            "namespace": NS, "agent": extra.pop("agent", "loyalty"), "scope": scope,
            "body": extra.pop("body", {"tier": "gold"}), **extra})
        return response.status_code, response.get_json()

    def during(step: str, counts: dict[str, int]) -> None:
        if step in ("mark", "agent_state", "sweep"):
            seen[f"{step}-subject"] = put({"kind": "subject", "id": USER})
            seen[f"{step}-handle"] = put({"kind": "subject", "id": "Sam@Example.com"})
            seen[f"{step}-naming"] = put({"kind": "conversation", "id": f"conv-{step}"},
                                         agent="shop_guide", body={"offer": "x"},
                                         subject=USER)
            seen[f"{step}-other"] = put({"kind": "subject", "id": OTHER})

    receipt = world.store().erase(ORG, NS, USER, actor="test", handles=["sam@example.com"],
                                  progress=during)
    for step in ("mark", "agent_state", "sweep"):
        for what in ("subject", "handle", "naming"):
            status, out = seen[f"{step}-{what}"]
            assert status == 409 and out["error"]["code"] == "USER_BEING_ERASED", (step, what)
        assert seen[f"{step}-other"][0] == 200
    assert receipt["status"] == "done", receipt["census"]
    # Done: the markers are gone and writes naming the user start from nothing.
    status, out = put({"kind": "subject", "id": USER})
    assert status == 200 and out["version"] == 1
    assert put({"kind": "subject", "id": "sam@example.com"})[0] == 200
    assert not list(world.services.redis.scan_iter(match="*as-erasing*"))


def test_a_failed_erasure_keeps_refusing_agent_state_writes(world):
    late = keys.memory_row(ORG, NS, USER, "-", "-", "late")

    def race(step: str, counts: dict[str, int]) -> None:
        if step == "sweep":
            world.services.redis.hset(late, mapping={"memory_type": "semantic", "key": "late"})

    failed = world.store().erase(ORG, NS, USER, actor="test", progress=race)
    assert failed["status"] == "failed"
    response = world.client.put("/v1/agent-state", json={
        "namespace": NS, "agent": "loyalty", "scope": {"kind": "subject", "id": USER},
        "body": {"tier": "gold"}})
    assert response.status_code == 409
    assert world.erase()["status"] == "done"
    assert world.put_state("loyalty", {"kind": "subject", "id": USER}, {"tier": "gold"})


def test_the_user_tokens_are_revoked_and_keep_only_the_keyed_hash(world):
    pinned = world.post("token.create", role="viewer", read_user_id=USER)
    everywhere = world.post("token.create", namespace="*", role="viewer", read_user_id=USER)
    elsewhere = world.post("token.create", namespace="other-ns", role="viewer",
                           read_user_id=USER)
    other = world.post("token.create", role="viewer", read_user_id=OTHER)
    headers = {"Authorization": f"Bearer {pinned['token']}"}
    assert world.call("memory.list", headers=headers, user_id=USER)[0] == 200

    receipt = world.erase()

    assert receipt["status"] == "done" and receipt["counts"]["tokens"] == 2
    for created in (pinned, everywhere):
        status, out = world.call("memory.list", user_id=USER,
                                 headers={"Authorization": f"Bearer {created['token']}"})
        assert status == 401, out
    for created in (elsewhere, other):
        status, _ = world.call("memory.list",
                               headers={"Authorization": f"Bearer {created['token']}"},
                               namespace=created["namespace"])
        assert status == 200
    claims = {row["token_id"]: row for row in world.post("token.list")["tokens"]}
    assert claims[pinned["token_id"]]["read_user_id"] == f"erased:{receipt['erasure_id']}"
    assert claims[pinned["token_id"]]["revoked"] is True
    assert claims[elsewhere["token_id"]]["read_user_id"] == USER  # another namespace's user
    assert world.erase()["counts"]["tokens"] == 0  # a second erasure finds none left


def test_agent_state_writers_racing_the_erasure_leave_nothing_and_are_counted(world):
    """Writers of the user's subject scope and of conversations naming them write until the
    erasure refuses them; the first census is clean and the receipt counts each 200."""
    stopped = threading.Barrier(7)
    written: list[int] = [0] * 6
    refused: list[str] = [""] * 6

    def writer(n: int) -> None:
        client = world.app.test_client()
        i = 0
        while True:
            if n < 3:
                body = {"agent": "loyalty", "scope": {"kind": "subject", "id": USER},
                        "body": {"tier": f"t-{n}-{i}"}}
            else:
                body = {"agent": "shop_guide", "scope": {"kind": "conversation",
                                                         "id": f"conv-{n}-{i}"},
                        "body": {"offer": f"o-{n}-{i}"}, "subject": USER}
            response = client.put("/v1/agent-state", json={"namespace": NS, **body})
            if response.status_code != 200:
                refused[n] = response.get_json()["error"]["code"]
                break
            written[n] += 1
            i += 1
        stopped.wait(120)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    # Every writer has written before the erasure begins (under load that takes a while): the
    # subject scope's state exists, and each conversation writer has states to count.
    deadline = time.monotonic() + 120
    while min(written) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert min(written) >= 3, written

    def hold(step: str, counts: dict[str, int]) -> None:
        if step == "worker_state":
            stopped.wait(120)

    receipt = world.store().erase(ORG, NS, USER, actor="test", progress=hold)
    for thread in threads:
        thread.join(120)
    assert refused == ["USER_BEING_ERASED"] * 6
    assert receipt["status"] == "done", receipt["census"]
    assert receipt["counts"]["agent_states"] == 1 + sum(written[3:])
    response = world.client.get(f"/v1/profiles/{USER}/agent-state?namespace={NS}")
    assert response.get_json()["count"] == 0


# --- in the background: resume ------------------------------------------------------------------


def test_an_interrupted_background_erasure_is_enqueued_again_by_the_resume_pass(world):
    from jobs.erasure import resume_interrupted

    plant(world, USER, "MARK-ERASED")
    started = world.post("user.erase", user_id=USER)
    assert started["status"] == "running" and started["attempts"] == 0
    assert resume_interrupted(world.services) == 0  # its job waits for a worker: not dead

    def crash(step: str, counts: dict[str, int]) -> None:
        if step == "agent_state":
            raise Crash()  # the worker dies here

    from app.store.erasure import PROGRESS

    reset = PROGRESS.set(crash)
    try:
        with pytest.raises(Crash):
            world.store().run_background(ORG, NS, started["erasure_id"])
    finally:
        PROGRESS.reset(reset)
    # What a killed work horse leaves: the job still says started, long ago.
    job = Queue(MAINTENANCE, connection=world.services.queue_redis).fetch_job(
        world.services.redis.hget(keys.erasure(ORG, NS, started["erasure_id"]), "job_id"))
    assert job is not None
    take(Queue(MAINTENANCE, connection=world.services.queue_redis), job)
    world.services.queue_redis.hset(job.key, "started_at", "2020-01-01T00:00:00.000000Z")
    interrupted = world.post("erasure.status", erasure_id=started["erasure_id"])
    assert interrupted["status"] == "interrupted" and interrupted["step"] == "agent_state"
    assert interrupted["steps_done"] == STEPS.index("agent_state") + 1

    assert resume_interrupted(world.services) == 1
    assert world.post("erasure.status", user_id=USER)["status"] == "running"
    assert resume_interrupted(world.services) == 0  # enqueued once
    run_erasure_jobs(world.services)
    done = world.post("erasure.status", user_id=USER)
    assert done["status"] == "done" and done["attempts"] == 2
    assert {k: done["counts"][k] for k in PLANTED} == PLANTED
    assert not world.services.queue_redis.exists(job.key)  # the dead run's job is gone
    assert not world.services.redis.smembers(keys.erasures_due())


def test_the_erase_command_without_waiting_answers_running(world):
    plant(world, USER, "MARK-ERASED")
    result = world.app.test_cli_runner().invoke(
        args=["loom", "erase", USER, "--namespace", NS, "--no-wait"])
    assert result.exit_code == 0, result.output
    assert "status:     running (attempt 0)" in result.stdout
    run_erasure_jobs(world.services)
    assert world.post("erasure.status", user_id=USER)["status"] == "done"


def test_keyed_write_records_go_with_the_user(world, redis_url):
    """Idempotency-Key records of the user's writes live in the user's slot, by key or by
    memory_id with no user in the identity: the erasure takes them and counts them, and no key
    or value holds the user's id or text after it."""
    keyed = {"Idempotency-Key": "k-erase-1"}
    fact = world.fact("name", "MARK-KEYED call me Sam", USER)
    for op_name, body in (
        ("memory.reinforce", {"user_id": "-", "memory_id": fact["memory_id"]}),
        ("memory.restate", {"user_id": "-", "memory_id": fact["memory_id"]}),
        ("working_memory.append", {"user_id": USER, "block_key": "log",
                                   "addition": "MARK-KEYED step"}),
        ("profile.append", {"user_id": USER, "label": "notes", "addition": "MARK-KEYED note"}),
    ):
        status, out = world.call(op_name, headers=keyed, **body)
        assert status == 200, (op_name, out)
    records = [key for key in world.services.redis.scan_iter(match="loom:idem:*")]
    assert len(records) == 4 and all(USER in record for record in records)
    before = everything(redis_url)
    assert USER in before and "MARK-KEYED" in before

    receipt = world.erase()

    assert receipt["status"] == "done" and receipt["census"]["clean"] is True
    assert receipt["counts"]["index_entries"] >= len(records)
    assert not list(world.services.redis.scan_iter(match="loom:idem:*"))
    after = everything(redis_url)
    assert USER not in after and "MARK-KEYED" not in after
