"""The structured_profile worker against real Redis, real RQ and a scripted model over HTTP."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rq import Queue
from rq_scheduler import Scheduler

from app.clock import FrozenClock
from app.services import Services
from app.settings import load_settings
from app.store import keys
from app.store.memory import MemoryStore
from app.store.usage import UsageStore
from jobs import context
from jobs.queues import BUILDS, PASSES
from jobs.scheduler import periodic_jobs, register
from jobs.structured_profile import PASS_FUNC, run_pass
from tests.conftest import TEST_SECRET, make_app
from tests.support.rq_worker import BurstWorker

NS = "support"
SCHEMA = {
    "type": "object",
    "properties": {
        "preferred_name": {"type": "string", "description": "What the user asks to be called"},
        "timezone": {"type": "string", "description": "IANA time zone, e.g. Europe/Berlin"},
        "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 5,
                      "description": "Languages they speak"},
    },
}


class World:
    def __init__(self, redis_url, tmp_path, model, **settings):
        self.clock = FrozenClock()
        self.model = model
        overrides = {
            "redis_url": redis_url,
            "secret_key": TEST_SECRET,
            "data_dir": str(tmp_path),
            "llm_base_url": model.base_url if model else "",
            "llm_model": "scripted-model" if model else "",
            "llm_timeout_seconds": 5.0,
            **settings,
        }
        self.app = make_app(redis_url, tmp_path, clock=self.clock,
                            **{k: v for k, v in overrides.items()
                               if k not in ("redis_url", "data_dir", "secret_key")})
        self.client = self.app.test_client()
        self.services: Services = self.app.extensions["loom"]

    def post(self, op, **body):
        response = self.client.post(f"/v1/{op}", json={"namespace": NS, "agent": "chat", **body})
        assert response.status_code < 500, response.get_json()
        return response.get_json()

    def fact(self, key, value, user="u-42", **fields):
        return self.post("memory.set", user_id=user, key=key, value=value,
                         memory_type=fields.pop("memory_type", "semantic"), **fields)

    def structured(self, user="u-42"):
        return self.post("profile.structured", user_id=user)

    def run_pass(self):
        return run_pass(self.services, holder="test-worker", force=True)

    def calls(self):
        return [r for r in self.model.requests if r.path.endswith("/chat/completions")]


@pytest.fixture
def world(redis_url, tmp_path, model):
    # Scans expire after 60 s, cooldowns after 600 s, so the two rules can be told apart.
    w = World(redis_url, tmp_path, model, structured_profile_cooldown_seconds=600,
              structured_profile_scan_max_age_seconds=60)
    w.post("profile_schema.set", json_schema=SCHEMA)
    return w


def answer(**values):
    return {"preferred_name": None, "timezone": None, "languages": None, **values}


def test_lifecycle_pending_ready_stale_ready(world, model):
    assert world.structured()["status"] == "ready"  # no facts: ready, all null, version 0
    world.fact("name", "Call me Sam")
    out = world.structured()
    assert out["status"] == "pending" and out["profile"] == answer() and out["version"] == 0
    model.script(answer(preferred_name="Sam"))
    world.run_pass()
    out = world.structured()
    assert out["status"] == "ready"
    assert out["profile"] == answer(preferred_name="Sam")
    assert out["memory_id"] and out["version"] > 0 and out["version_text"] == str(out["version"])
    assert out["built_at"] is not None
    first_version = out["version"]

    world.fact("tz", "Lives in Berlin")
    assert world.structured()["status"] == "stale"
    world.run_pass()  # inside the cooldown: served as built, no call
    assert len(world.calls()) == 1 and world.structured()["status"] == "stale"
    world.clock.advance(601)
    model.script(answer(preferred_name="Sam", timezone="Europe/Berlin"))
    world.run_pass()
    out = world.structured()
    assert out["status"] == "ready" and out["profile"]["timezone"] == "Europe/Berlin"
    assert out["version"] > first_version
    history = world.post("memory.history", user_id="u-42", key="structured_profile", agent="-")
    assert len(history["versions"]) == 2
    row = world.post("memory.get", user_id="u-42", key="structured_profile", agent="-")["memory"]
    assert row["provenance"] == "derived"
    assert row["source_trace"].startswith("profile.fold:structured_profile:")
    assert set(row["source_trace"].split(":", 2)[2].split(",")) == {
        world.post("memory.get", user_id="u-42", key=k)["memory"]["memory_id"]
        for k in ("name", "tz")
    }


def test_unchanged_users_cost_no_model_call_across_many_passes(world, model):
    for user in ("u-1", "u-2", "u-3"):
        world.fact("name", f"Name of {user}", user=user)
    model.default = lambda request: answer(preferred_name="X")
    world.run_pass()
    assert len(world.calls()) == 3
    for _ in range(10):
        world.clock.advance(3600)
        world.run_pass()
    assert len(world.calls()) == 3
    usage = world.post("usage.get")
    assert usage["model_calls"] == 3 and usage["builds"] == 3


def test_excluded_facts_never_reach_the_model(world, model):
    world.fact("ok", "SOURCE-OK")
    world.fact("high", "SECRET-HIGH", label="high")
    world.fact("other", "ABOUT-OTHER", tags=["about:other"])
    world.fact("health", "ATTRIBUTE-HEALTH", tags=["attribute:health"])
    world.fact("forget", "FORGET-ME", tags=["forget"])
    world.fact("episode", "EPISODIC-ROW", memory_type="episodic")
    world.fact("expired", "EXPIRED-ROW", valid_to="2020-01-01T00:00:00Z",
               valid_at="2019-01-01T00:00:00Z")
    original = world.fact("dup-source", "CANONICAL-ROW")
    world.fact("dup", "DUPLICATE-ROW", duplicate_of=original["memory_id"])
    world.post("profile.set", label="persona", value="PROFILE-SECTION", user_id="u-42")
    model.script(answer())
    world.run_pass()
    sent = str(world.calls()[0].body)
    assert "SOURCE-OK" in sent and "CANONICAL-ROW" in sent
    for excluded in ("SECRET-HIGH", "ABOUT-OTHER", "ATTRIBUTE-HEALTH", "FORGET-ME",
                     "EPISODIC-ROW", "EXPIRED-ROW", "DUPLICATE-ROW", "PROFILE-SECTION"):
        assert excluded not in sent


def test_answers_are_held_to_the_schema(world, model):
    world.fact("name", "Sam")
    model.script({"preferred_name": 7, "timezone": "Europe/Berlin",
                  "languages": ["en", 3], "undeclared": "x"})
    world.run_pass()
    assert world.structured()["profile"] == answer(timezone="Europe/Berlin")


def test_output_cap_is_sent_and_a_cut_off_answer_is_a_refusal(world, model):
    world.fact("name", "Sam")
    model.script('{"preferred_name": "Sa', finish_reason="length")
    world.run_pass()
    sent = world.calls()[0].body
    assert sent["max_tokens"] > 32
    assert world.structured()["status"] == "pending"
    world.clock.advance(7200)
    world.run_pass()  # not retried until something changes
    assert len(world.calls()) == 1
    world.fact("name", "Sam, really")
    world.clock.advance(601)
    model.script(answer(preferred_name="Sam"))
    world.run_pass()
    assert len(world.calls()) == 2 and world.structured()["status"] == "ready"


def test_a_failed_build_backs_off_and_doubles(world, model):
    world.fact("name", "Sam")
    model.script(status=500, body={"error": "down"})
    world.run_pass()
    assert world.post("usage.get")["failures"] == 1
    world.clock.advance(200)
    world.run_pass()
    assert len(world.calls()) == 1  # waiting BACKOFF_BASE (300 s)
    world.clock.advance(200)
    model.script(status=500, body={"error": "down"})
    world.run_pass()
    assert len(world.calls()) == 2
    world.clock.advance(400)
    world.run_pass()
    assert len(world.calls()) == 2  # now waiting 600 s
    world.clock.advance(300)
    model.script(answer(preferred_name="Sam"))
    world.run_pass()
    assert world.structured()["status"] == "ready"


def test_a_locked_profile_row_refuses_builds_until_unlocked(world, model):
    world.fact("name", "Sam")
    model.script(answer(preferred_name="Sam"))
    world.run_pass()
    world.post("memory.lock", user_id="u-42", key="structured_profile", agent="-")
    world.fact("name", "Samuel")
    world.clock.advance(601)
    world.run_pass()
    world.clock.advance(601)
    world.run_pass()
    assert len(world.calls()) == 1
    assert world.post("usage.get")["refusals"] >= 1
    world.post("memory.unlock", user_id="u-42", key="structured_profile", agent="-")
    world.clock.advance(601)
    model.script(answer(preferred_name="Samuel"))
    world.run_pass()
    assert len(world.calls()) == 2
    assert world.structured()["profile"]["preferred_name"] == "Samuel"


def test_a_callers_row_reads_pending_and_is_rebuilt_over(world, model):
    world.fact("name", "Sam")
    world.post("memory.set", user_id="u-42", agent="-", key="structured_profile",
               memory_type="profile", value={"preferred_name": "Forged"})
    assert world.structured()["status"] == "pending"
    model.script(answer(preferred_name="Sam"))
    world.run_pass()
    out = world.structured()
    assert out["status"] == "ready" and out["profile"]["preferred_name"] == "Sam"


def test_all_facts_gone_gives_the_all_null_profile_without_a_call(world, model):
    world.fact("name", "Sam")
    model.script(answer(preferred_name="Sam"))
    world.run_pass()
    world.post("memory.delete", user_id="u-42", key="name")
    assert world.structured()["status"] == "stale"
    world.clock.advance(61)  # the next scan, well inside the cooldown
    world.run_pass()  # a deletion skips the cooldown
    out = world.structured()
    assert out["status"] == "ready" and out["profile"] == answer()
    assert len(world.calls()) == 1


def test_a_deletion_skips_the_cooldown(world, model):
    world.fact("name", "Sam")
    world.fact("tz", "Berlin")
    model.script(answer(preferred_name="Sam", timezone="Europe/Berlin"))
    world.run_pass()
    world.post("memory.delete", user_id="u-42", key="tz")
    model.script(answer(preferred_name="Sam"))
    world.run_pass()
    assert len(world.calls()) == 1  # the namespace's last scan is still fresh
    world.clock.advance(61)
    world.run_pass()
    assert len(world.calls()) == 2
    assert world.structured()["status"] == "ready"


def test_a_fact_deleted_while_the_model_runs_means_nothing_is_written(world, model):
    world.fact("name", "Sam")
    started = threading.Event()

    def slow_answer(request):
        started.set()
        deleted.wait(5)
        return answer(preferred_name="Sam")

    deleted = threading.Event()
    model.default = slow_answer
    runner = threading.Thread(target=world.run_pass)
    runner.start()
    assert started.wait(5)
    world.post("memory.delete", user_id="u-42", key="name")
    deleted.set()
    runner.join(10)
    out = world.structured()
    assert out["version"] == 0 and out["memory_id"] == ""


def test_model_calls_switched_off_for_the_org(world, model):
    world.post("org.set_model_calls", enabled=False)
    world.fact("name", "Sam")
    world.run_pass()
    assert world.calls() == [] and world.structured()["status"] == "pending"


def test_no_model_configured_makes_no_call(redis_url, tmp_path):
    w = World(redis_url, tmp_path, None)
    w.post("profile_schema.set", json_schema=SCHEMA)
    w.fact("name", "Sam")
    w.run_pass()
    assert w.structured()["status"] == "pending"
    assert w.services.store(UsageStore).get("default", NS)["model_calls"] == 0


def test_a_schema_change_rebuilds_and_reads_stale_until_then(world, model):
    world.fact("name", "Sam")
    model.script(answer(preferred_name="Sam"))
    world.run_pass()
    changed = {**SCHEMA, "properties": {**SCHEMA["properties"],
                                        "city": {"type": "string", "description": "City"}}}
    world.post("profile_schema.set", json_schema=changed)
    out = world.structured()
    assert out["status"] == "stale" and "city" in out["profile"]
    model.script({**answer(preferred_name="Sam"), "city": "Berlin"})
    world.run_pass()
    assert world.structured()["status"] == "ready"
    assert world.structured()["profile"]["city"] == "Berlin"


def test_two_passes_at_once_only_one_plans(world, model):
    world.fact("name", "Sam")
    gate, building = threading.Event(), threading.Event()

    def slow(request):
        building.set()  # the first pass holds the lease and is inside its build
        gate.wait(5)
        return answer(preferred_name="Sam")

    model.default = slow
    results = []
    first = threading.Thread(target=lambda: results.append(world.run_pass()))
    first.start()
    assert building.wait(10)
    second = run_pass(world.services, holder="other-worker", force=True)
    gate.set()
    first.join(10)
    assert second == {"skipped": "another pass holds the lease"}
    assert len(world.calls()) == 1


def test_the_scheduler_enqueues_passes_and_a_real_worker_builds(world, model, monkeypatch):
    context.use_services(world.services)
    try:
        scheduler = Scheduler(connection=world.services.queue_redis)
        register(scheduler, periodic_jobs(load_settings(overrides={
            "redis_url": world.services.settings.redis_url, "secret_key": TEST_SECRET})))
        world.fact("name", "Sam")
        model.script(answer(preferred_name="Sam"))
        scheduler.enqueue_jobs()
        queue = Queue(PASSES, connection=world.services.queue_redis)
        assert queue.count == 1
        # The pass hands its build to the builds queue and a closing job back to the passes
        # queue: a worker on both runs the three.
        builds = Queue(BUILDS, connection=world.services.queue_redis)
        BurstWorker([queue, builds], connection=world.services.queue_redis).work(burst=True)
        assert world.structured()["status"] == "ready"
        assert world.services.redis.exists(keys.worker_lease("structured_profile")) == 0
    finally:
        context.use_services(None)


@pytest.mark.parametrize(("first_waited", "next_enqueued_after", "next_runs"), [
    (40, 20, True),  # the next tick, one interval after the first's: it runs
    (10, 0, False),  # a duplicate enqueued as the first ended, 10 s after its tick: it returns
])
def test_a_pass_that_waited_in_its_queue_leaves_the_next_tick_due(
    redis_url, tmp_path, model, first_waited, next_enqueued_after, next_runs
):
    """The next pass is due half an interval after the tick that asked for this one, not
    after this one started: a pass that waited behind other jobs (here 40 s of a 60 s
    interval) does not make the next tick's pass, which waited less, find itself early."""
    w = World(redis_url, tmp_path, model, structured_profile_interval_seconds=60,
              structured_profile_max_users_per_pass=1)
    w.post("profile_schema.set", json_schema=SCHEMA)
    model.default = lambda request: answer(preferred_name="Built")
    for index in range(3):  # one user a pass: every pass leaves users behind
        w.fact("name", "Sam", user=f"behind-{index}")
    redis_queue = w.services.queue_redis
    passes, builds = Queue(PASSES, connection=redis_queue), Queue(BUILDS, connection=redis_queue)

    def tick(waited: float) -> Any:
        job = passes.enqueue(PASS_FUNC)
        job.enqueued_at = datetime.now(UTC) - timedelta(seconds=waited)
        job.save()
        BurstWorker([passes, builds], connection=redis_queue).work(burst=True)
        return job.latest_result().return_value

    context.use_services(w.services)
    try:
        first = tick(first_waited)
        assert first["fanned_out"] == 1
        assert len(w.calls()) == 1
        w.clock.advance(next_enqueued_after)
        following = tick(0)
    finally:
        context.use_services(None)
    if next_runs:
        assert following["fanned_out"] == 1 and len(w.calls()) == 2
    else:
        assert following == {"skipped": "idle until the next pass is due"}
        assert len(w.calls()) == 1


def test_refused_users_never_starve_the_users_behind_them(redis_url, tmp_path, model):
    w = World(redis_url, tmp_path, model, structured_profile_max_users_per_pass=1,
              structured_profile_cooldown_seconds=0, structured_profile_scan_max_age_seconds=1)
    w.post("profile_schema.set", json_schema=SCHEMA)
    model.default = lambda request: answer(preferred_name="Built")
    locked = [f"locked-{i:02d}" for i in range(25)]
    for user in locked:
        w.fact("name", "first", user=user)
    for _ in locked:
        w.run_pass()
        w.clock.advance(2)
    for user in locked:
        w.post("memory.lock", user_id=user, key="structured_profile", agent="-")
        w.fact("name", "second", user=user)
    w.fact("name", "Sam", user="late-user")
    for _ in range(40):
        w.clock.advance(2)
        w.run_pass()
        if w.structured("late-user")["status"] == "ready":
            break
    assert w.structured("late-user")["status"] == "ready"
    assert len(w.calls()) == len(locked) + 1


def test_a_fact_written_as_a_build_reads_its_sources_is_in_its_prompt_only_if_in_its_digest(
        world, model, monkeypatch):
    """Issue 40 point 1: a build counted its digest in one round trip and read the sources in
    the next, so a fact written in between reached the model but not the build's record; once
    that fact passed its valid_to, the digest came back to the record's and the profile read
    ready, still holding the expired fact's value, with nothing left to rebuild it."""
    world.fact("name", "Call me Sam")
    valid_to = datetime.fromtimestamp(world.clock.now() + 60, tz=UTC)
    original = MemoryStore.source_entries
    written = []

    def a_write_lands_first(self, org, namespace, user_id):
        if not written:  # the build's read of its sources, once: the fact lands just before
            world.clock.advance(0.001)  # after the build's snapshot, as on a moving clock
            written.append(world.fact("tz", "Lives in Berlin",
                                      valid_to=valid_to.isoformat().replace("+00:00", "Z")))
        return original(self, org, namespace, user_id)

    model.default = lambda body: answer(
        preferred_name="Sam",
        timezone="Europe/Berlin" if "Berlin" in body["messages"][-1]["content"] else None)
    monkeypatch.setattr(MemoryStore, "source_entries", a_write_lands_first)
    world.run_pass()
    monkeypatch.setattr(MemoryStore, "source_entries", original)
    assert written
    out = world.structured()
    prompt = world.calls()[0].body["messages"][-1]["content"]
    # Either the build read the fact and counted it, or it did neither and reads stale.
    if "Berlin" in prompt:
        assert out["status"] == "ready" and out["profile"]["timezone"] == "Europe/Berlin"
    else:
        assert out["status"] == "stale" and out["profile"]["timezone"] is None
    for step in (61, 600):  # past the fact's valid_to, then past the new fact's cooldown
        world.clock.advance(step)
        for _ in range(2):
            out = world.structured()
            assert not (out["status"] == "ready" and out["profile"]["timezone"]), out
            world.run_pass()
    out = world.structured()
    assert out["status"] == "ready" and out["profile"] == answer(preferred_name="Sam"), out
