"""The profile_consolidation worker and protected-attribute tagging, against real Redis, real RQ
and a scripted model over HTTP."""

from __future__ import annotations

import json
import threading

import pytest
from rq import Queue
from rq_scheduler import Scheduler

from app.clock import Clock, FrozenClock
from app.services import Services
from app.settings import load_settings
from app.store.consolidation import TRACE_PREFIX, ConsolidationStore
from app.store.memory import MemoryStore
from app.store.usage import UsageStore
from jobs import consolidation, context
from jobs.consolidation import run_pass
from jobs.queues import PASSES
from jobs.scheduler import Periodic, periodic_jobs, register
from tests.conftest import TEST_SECRET, make_app
from tests.support.rq_worker import BurstWorker

NS = "support"
USER = "u-42"


class World:
    def __init__(self, redis_url, tmp_path, model, clock=None, **settings):
        self.clock = clock or FrozenClock()
        self.model = model
        overrides = {
            "llm_base_url": model.base_url if model else "",
            "llm_model": "scripted-model" if model else "",
            "llm_timeout_seconds": 5.0,
            "profile_consolidation_enabled": True,
            **settings,
        }
        self.app = make_app(redis_url, tmp_path, clock=self.clock, **overrides)
        self.client = self.app.test_client()
        self.services: Services = self.app.extensions["loom"]

    def post(self, op, expect=200, **body):
        response = self.client.post(f"/v1/{op}", json={"namespace": NS, "agent": "chat", **body})
        assert response.status_code == expect, response.get_json()
        return response.get_json()

    def fact(self, key, value, memory_type="preference", user=USER, **fields):
        return self.post("memory.set", user_id=user, key=key, value=value,
                         memory_type=memory_type, **fields)

    def section(self, user=USER):
        out = self.post("memory.get", user_id=user, key="consolidated_profile", agent="-")
        return out["memory"] if out["found"] else None

    def run_pass(self):
        if isinstance(self.clock, FrozenClock):
            # Writes land at the frozen time; a pass reads after them, as a real one would.
            self.clock.advance(1)
        return run_pass(self.services, holder="test-worker")

    def calls(self):
        return self.model.completion_requests

    def usage(self):
        return self.services.store(UsageStore).get("default", NS)

    def entries(self, user=USER):
        return self.services.store(MemoryStore).source_entries("default", NS, user)


@pytest.fixture
def world(redis_url, tmp_path, model):
    return World(redis_url, tmp_path, model)


def folded(text):
    return {"profile": text}


def facts_sent(call):
    """The fact values a fold's prompt carried, in prompt order."""
    lines = call.body["messages"][1]["content"].splitlines()[1:]
    return [json.loads(line)["fact"] for line in lines]


def trace_ids(row):
    assert row["source_trace"].startswith(TRACE_PREFIX)
    rest = row["source_trace"][len(TRACE_PREFIX):]
    return set(rest.split(",")) if rest else set()


# --- off by default ----------------------------------------------------------------------------


def test_off_by_default_no_periodic_job_and_no_call(redis_url, tmp_path, model):
    settings = load_settings(overrides={"redis_url": redis_url, "secret_key": TEST_SECRET})
    assert settings.profile_consolidation_enabled is False
    assert all(p.func != consolidation.PASS_FUNC for p in periodic_jobs(settings))
    w = World(redis_url, tmp_path, model, profile_consolidation_enabled=False)
    w.fact("tea", "Prefers tea")
    assert w.run_pass() == {"skipped": "LOOM_PROFILE_CONSOLIDATION_ENABLED is off"}
    assert w.calls() == []
    assert w.section() is None


def test_enabled_registers_the_pass_at_its_interval(redis_url):
    settings = load_settings(overrides={
        "redis_url": redis_url, "secret_key": TEST_SECRET,
        "profile_consolidation_enabled": True, "profile_consolidation_interval_seconds": 900})
    assert Periodic(consolidation.PASS_FUNC, PASSES, 900) in periodic_jobs(settings)


# --- folding ---------------------------------------------------------------------------------


def test_folds_preference_and_decision_facts_only(world, model):
    tea = world.fact("tea", "PREF-TEA", confidence=0.9)
    plan = world.fact("plan", "DECISION-ANNUAL", memory_type="decision")
    world.fact("city", "SEMANTIC-BERLIN", memory_type="semantic")
    world.fact("call", "EPISODIC-CALL", memory_type="episodic")
    world.fact("tagged", "TAGGED-PREF", tags=["attribute:religion_or_belief"])
    world.fact("secret", "HIGH-PREF", label="high")
    world.fact("other", "OTHER-PREF", tags=["about:other"])
    world.fact("gone", "FORGET-PREF", tags=["forget"])
    world.fact("tea", "PREF-TEA", user="u-7")  # another user's fact
    model.default = lambda body: folded("Prefers tea; chose the annual plan.")

    result = world.run_pass()
    assert result["model_calls"] == 2  # u-42 and u-7
    sent = [str(call.body) for call in world.calls()]
    mine = next(call for call in world.calls() if "DECISION-ANNUAL" in str(call.body))
    assert facts_sent(mine) == ["DECISION-ANNUAL", "PREF-TEA"]  # most confident first
    for excluded in ("SEMANTIC-BERLIN", "EPISODIC-CALL", "TAGGED-PREF", "HIGH-PREF",
                     "OTHER-PREF", "FORGET-PREF"):
        assert all(excluded not in body for body in sent)
    assert world.calls()[0].body["response_format"]["type"] == "json_schema"
    assert world.calls()[0].body["max_tokens"] > 32

    row = world.section()
    assert row["value"] == "Prefers tea; chose the annual plan."
    assert row["memory_type"] == "profile" and row["provenance"] == "derived"
    assert row["actor"] == "worker:profile_consolidation"
    assert row["agent"] == "-" and row["user_id"] == USER
    assert trace_ids(row) == {tea["memory_id"], plan["memory_id"]}
    rendered = world.post("profile.render", user_id=USER, read_scope="own_user")["rendered"]
    assert "Prefers tea; chose the annual plan." in rendered
    usage = world.usage()
    assert usage["model_calls"] == 2 and usage["builds"] == 2


def test_an_unchanged_user_costs_no_call_and_a_change_costs_one(world, model):
    world.fact("tea", "Prefers tea")
    model.script(folded("Prefers tea."))
    world.run_pass()
    assert len(world.calls()) == 1
    first_version = world.section()["version"]

    world.run_pass()
    world.fact("city", "Lives in Berlin", memory_type="semantic")  # not a folded type
    world.run_pass()
    assert len(world.calls()) == 1
    assert world.usage()["skipped_unchanged"] == 1  # the semantic write listed the user

    coffee = world.fact("tea", "Prefers coffee now")
    model.script(folded("Prefers coffee."))
    world.run_pass()
    assert len(world.calls()) == 2 and "Prefers coffee now" in str(world.calls()[1].body)
    row = world.section()
    assert row["value"] == "Prefers coffee." and row["version"] > first_version
    assert trace_ids(row) == {coffee["memory_id"]}
    history = world.post("memory.history", user_id=USER, key="consolidated_profile", agent="-")
    assert len(history["versions"]) == 2
    world.run_pass()
    assert len(world.calls()) == 2


def test_a_locked_section_refuses_and_waits_until_unlocked(world, model):
    world.fact("tea", "Prefers tea")
    model.script(folded("Prefers tea."))
    world.run_pass()
    world.post("memory.lock", user_id=USER, key="consolidated_profile", agent="-")
    world.fact("tea", "Prefers coffee")
    world.run_pass()
    world.run_pass()
    assert len(world.calls()) == 1  # refused before the call, and not counted twice
    assert world.usage()["refusals"] == 1
    assert world.section()["value"] == "Prefers tea."

    world.post("memory.unlock", user_id=USER, key="consolidated_profile", agent="-")
    model.script(folded("Prefers coffee."))
    world.run_pass()
    assert len(world.calls()) == 2
    assert world.section()["value"] == "Prefers coffee."


def test_a_pinned_or_high_section_refuses_too(world, model):
    world.fact("tea", "Prefers tea")
    world.post("memory.set", user_id=USER, agent="-", key="consolidated_profile",
               memory_type="profile", value="Written by hand", label="high")
    world.run_pass()
    assert world.calls() == [] and world.section()["value"] == "Written by hand"
    world.post("memory.set", user_id="u-9", agent="-", key="consolidated_profile",
               memory_type="profile", value="Pinned by hand")
    world.post("memory.pin", user_id="u-9", key="consolidated_profile", agent="-")
    world.fact("tea", "Prefers tea", user="u-9")
    world.run_pass()
    assert world.calls() == [] and world.section("u-9")["value"] == "Pinned by hand"
    assert world.usage()["refusals"] == 2


def test_a_section_too_small_for_the_answer_or_of_another_type_is_not_retried(world, model):
    world.post("memory.set", user_id=USER, agent="-", key="consolidated_profile",
               memory_type="profile", value="short", char_limit=10)
    world.fact("tea", "Prefers tea")
    model.default = lambda body: folded("Prefers tea, strong, with milk.")
    world.run_pass()
    world.run_pass()
    assert len(world.calls()) == 1 and world.usage()["refusals"] == 1
    assert world.section()["value"] == "short"

    world.post("memory.set", user_id="u-9", agent="-", key="consolidated_profile",
               memory_type="semantic", value="A fact under the section's key")
    world.fact("tea", "Prefers tea", user="u-9")
    world.run_pass()
    world.run_pass()
    assert len(world.calls()) == 1 and world.usage()["refusals"] == 2


def test_a_fact_changed_while_the_model_runs_means_nothing_is_written(world, model):
    world.fact("tea", "Prefers tea")
    started, changed = threading.Event(), threading.Event()

    def slow(body):
        started.set()
        changed.wait(5)
        return folded("Prefers tea.")

    model.default = slow
    runner = threading.Thread(target=world.run_pass)
    runner.start()
    assert started.wait(5)
    world.fact("tea", "Prefers green tea")
    changed.set()
    runner.join(10)
    assert world.section() is None
    model.default = lambda body: folded("Prefers green tea.")
    world.run_pass()  # still listed: the next pass folds the new fact
    assert world.section()["value"] == "Prefers green tea."
    assert len(world.calls()) == 2


def test_a_section_written_while_the_model_runs_is_not_written_over(world, model):
    world.fact("tea", "Prefers tea")
    started, written = threading.Event(), threading.Event()

    def slow(body):
        started.set()
        written.wait(5)
        return folded("Prefers tea.")

    model.default = slow
    runner = threading.Thread(target=world.run_pass)
    runner.start()
    assert started.wait(5)
    world.post("memory.set", user_id=USER, agent="-", key="consolidated_profile",
               memory_type="profile", value="By hand")
    written.set()
    runner.join(10)
    assert world.section()["value"] == "By hand"
    assert world.usage()["builds"] == 0


def test_concurrent_fact_writers_and_passes_lose_no_change(redis_url, tmp_path, model):
    world = World(redis_url, tmp_path, model, clock=Clock())
    model.default = lambda body: folded("Folded.")
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(n):
        try:
            for i in range(8):
                world.fact(f"k{n}-{i % 3}", f"Preference {n}/{i}")
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    def passes():
        while not stop.is_set():
            world.run_pass()

    folder = threading.Thread(target=passes)
    folder.start()
    writers = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join(30)
    stop.set()
    folder.join(30)
    assert errors == []
    world.run_pass()  # whatever the racing passes left listed
    current = {
        world.post("memory.get", user_id=USER, key=f"k{n}-{j}")["memory"]["memory_id"]
        for n in range(8) for j in range(3)
    }
    assert trace_ids(world.section()) == current
    assert len(facts_sent(world.calls()[-1])) == 24
    calls = len(world.calls())
    world.run_pass()
    assert len(world.calls()) == calls


def test_a_write_stamped_before_the_read_but_landing_after_it_stays_listed(world):
    store = world.services.store(ConsolidationStore)
    now = world.clock.now_ns()
    world.fact("tea", "Prefers tea")
    sources = store.sources("default", NS, USER, now)
    read_at = now + 10**9  # the fold's clock has moved past the write's stamp below
    world.fact("tea", "Prefers green tea")  # stamped at `now`, committed after the read
    assert store.clear_changed("default", NS, USER, read_at, sources.source_digest) is False
    assert store.users_to_fold("default", NS, read_at, 10) == [USER]
    sources = store.sources("default", NS, USER, now)
    assert store.clear_changed("default", NS, USER, read_at, sources.source_digest) is True
    assert store.users_to_fold("default", NS, read_at, 10) == []


def test_all_folded_facts_gone_empties_the_section_without_a_call(world, model):
    world.fact("tea", "Prefers tea")
    model.script(folded("Prefers tea."))
    world.run_pass()
    world.post("memory.delete", user_id=USER, key="tea")
    world.run_pass()
    row = world.section()
    assert row["value"] == "" and row["source_trace"] == TRACE_PREFIX
    assert len(world.calls()) == 1
    world.run_pass()
    assert len(world.calls()) == 1 and world.section()["version"] == row["version"]


def test_a_user_with_no_facts_and_no_section_gets_nothing_written(world, model):
    world.fact("tea", "Prefers tea")
    world.post("memory.delete", user_id=USER, key="tea")
    world.run_pass()
    assert world.calls() == []
    assert world.section() is None
    assert world.services.store(ConsolidationStore).record("default", NS, USER) is None


def test_a_fact_passing_its_valid_to_is_folded_out_without_a_write(world, model):
    world.fact("tea", "Prefers tea")
    world.fact("trial", "TRIAL-PLAN until February", memory_type="decision",
               valid_to="2027-02-01T00:00:00Z")
    model.default = lambda body: folded("Folded.")
    world.run_pass()
    assert "TRIAL-PLAN" in str(world.calls()[0].body)
    world.clock.advance(30 * 86400)  # past valid_to; nobody writes
    world.run_pass()
    assert len(world.calls()) == 2 and "TRIAL-PLAN" not in str(world.calls()[1].body)
    assert len(trace_ids(world.section())) == 1


def test_a_cut_off_answer_is_not_retried_until_something_changes(world, model):
    world.fact("tea", "Prefers tea")
    model.script('{"profile": "Prefers t', finish_reason="length")
    world.run_pass()
    world.run_pass()
    assert len(world.calls()) == 1 and world.usage()["refusals"] == 1
    world.fact("tea", "Prefers tea, strong")
    model.script(folded("Prefers strong tea."))
    world.run_pass()
    assert world.section()["value"] == "Prefers strong tea."


def test_a_failed_call_is_counted_and_tried_again_after_its_backoff(
    redis_url, tmp_path, model
):
    w = World(redis_url, tmp_path, model, structured_profile_backoff_base_seconds=10)
    w.fact("tea", "Prefers tea")
    model.script(status=500, body={"error": "down"})
    w.run_pass()
    assert w.usage()["failures"] == 1 and w.usage()["model_calls"] == 1
    w.run_pass()  # within the 10 s wait: no call
    assert len(w.calls()) == 1
    w.clock.advance(10)
    model.script({"summary": "wrong key"})
    w.run_pass()
    assert w.usage()["failures"] == 2 and len(w.calls()) == 2
    w.clock.advance(10)  # the second failure waits 20 s
    w.run_pass()
    assert len(w.calls()) == 2
    w.clock.advance(10)
    model.script(folded("Prefers tea."))
    w.run_pass()
    assert w.section()["value"] == "Prefers tea."
    assert w.services.store(ConsolidationStore).record("default", NS, USER).failures == 0


def test_an_unchanged_user_whose_fold_keeps_failing_backs_off_to_the_cap(
    redis_url, tmp_path, model
):
    """One pass a second for two minutes over a user whose facts never change and whose fold's
    answer is never usable: calls at 0, 4, 12, 28, 44, ... s (4 s doubling to the 16 s cap),
    not one a pass; the ledger counts them under the fold's worker."""
    w = World(redis_url, tmp_path, model, structured_profile_backoff_base_seconds=4,
              structured_profile_backoff_cap_seconds=16)
    w.fact("tea", "Prefers tea")
    model.default = {"summary": "not the profile key"}
    start = w.clock.now()
    times = []
    for _ in range(120):
        before = len(w.calls())
        w.run_pass()  # advances the clock a second
        if len(w.calls()) > before:
            times.append(round(w.clock.now() - start))
    assert [b - a for a, b in zip(times, times[1:], strict=False)] == [4, 8, 16, 16, 16, 16, 16,
                                                                       16][:len(times) - 1]
    assert len(times) == 9
    ledger = w.services.store(UsageStore)
    assert w.usage()["model_calls"] == 9 and w.usage()["failures"] == 9
    by_worker = ledger.by_worker("default", NS)
    assert by_worker["profile_consolidation"]["model_calls"] == 9
    assert by_worker["structured_profile"]["model_calls"] == 0


def test_a_refused_fold_is_tried_again_after_the_refusal_retry(redis_url, tmp_path, model):
    w = World(redis_url, tmp_path, model, structured_profile_refusal_retry_seconds=50)
    w.fact("tea", "Prefers tea")
    model.script('{"profile": "Prefers t', finish_reason="length")
    w.run_pass()
    w.clock.advance(40)
    w.run_pass()
    assert len(w.calls()) == 1  # nothing changed, the retry's time not come
    w.clock.advance(10)
    model.script(folded("Prefers tea."))
    w.run_pass()
    assert len(w.calls()) == 2 and w.section()["value"] == "Prefers tea."


def test_no_model_or_calls_switched_off_make_no_call(redis_url, tmp_path, model):
    w = World(redis_url, tmp_path, None)
    w.fact("tea", "Prefers tea")
    w.run_pass()
    assert w.usage()["model_calls"] == 0
    world = World(redis_url, tmp_path, model)
    world.post("org.set_model_calls", enabled=False)
    world.run_pass()
    assert world.calls() == []
    world.post("org.set_model_calls", enabled=True)
    model.script(folded("Prefers tea."))
    world.run_pass()  # the user stayed listed while calls were off
    assert world.section()["value"] == "Prefers tea."


def test_the_structured_worker_does_not_consume_the_folds_changes(world, model):
    from jobs.structured_profile import run_pass as structured_pass

    world.fact("tea", "Prefers tea")
    structured_pass(world.services, holder="test-worker", force=True)  # no schema: no build
    memory = world.services.store(MemoryStore)
    memory.clear_changed("default", NS, USER, world.clock.now_ns() + 10**12)
    model.script(folded("Prefers tea."))
    world.run_pass()
    assert world.section()["value"] == "Prefers tea."


def test_a_pass_spends_its_budget_and_the_next_starts_at_the_next_namespace(
    world, model, monkeypatch
):
    monkeypatch.setattr(consolidation, "MAX_FOLDS_PER_PASS", 1)
    world.fact("tea", "ALPHA-1", user="u-1", namespace="alpha")
    world.fact("tea", "ALPHA-2", user="u-2", namespace="alpha")
    world.fact("tea", "BETA-3", user="u-3", namespace="beta")
    model.default = lambda body: folded("Folded.")
    order = []
    for _ in range(3):
        world.run_pass()
        order.extend(facts_sent(world.calls()[-1]))
    assert order == ["ALPHA-1", "BETA-3", "ALPHA-2"]
    world.run_pass()
    assert len(world.calls()) == 3


def test_two_passes_at_once_only_one_folds(world, model):
    world.fact("tea", "Prefers tea")
    calling, gate = threading.Event(), threading.Event()

    def slow(body):
        calling.set()
        gate.wait(60)  # held until the second pass has run; 60 s only stops a hung test
        return folded("Prefers tea.")

    model.default = slow
    first = threading.Thread(target=world.run_pass)
    first.start()
    assert calling.wait(60)  # the first pass holds the lease and waits on its model call
    second = run_pass(world.services, holder="other-worker")
    gate.set()
    first.join(60)
    assert second == {"skipped": "another pass holds the lease"}
    assert len(world.calls()) == 1


def test_the_scheduler_enqueues_the_pass_and_a_real_worker_folds(world, model):
    context.use_services(world.services)
    try:
        scheduler = Scheduler(connection=world.services.queue_redis)
        register(scheduler, periodic_jobs(world.services.settings))
        world.fact("tea", "Prefers tea")
        model.script(folded("Prefers tea."))
        world.clock.advance(1)
        scheduler.enqueue_jobs()
        queue = Queue(PASSES, connection=world.services.queue_redis)
        assert queue.count == 2  # the structured pass and the fold
        BurstWorker([queue], connection=world.services.queue_redis).work(burst=True)
        assert world.section()["value"] == "Prefers tea."
    finally:
        context.use_services(None)


# --- attribute tagging -----------------------------------------------------------------------


def test_tagging_off_by_default_leaves_tags_alone(world):
    out = world.fact("dx", "I was diagnosed with diabetes")
    row = world.post("memory.get", user_id=USER, key="dx")["memory"]
    assert row["tags"] == [] and out["memory_id"] in world.entries()


def test_tagged_facts_stay_out_of_the_fold_and_the_structured_sources(
    redis_url, tmp_path, model
):
    world = World(redis_url, tmp_path, model, memory_attribute_tagging=True)
    world.fact("dx", "I was diagnosed with diabetes", tags=["vip"])
    row = world.post("memory.get", user_id=USER, key="dx")["memory"]
    assert row["tags"] == ["vip", "attribute:health"]
    assert world.entries() == {}  # not a source of the structured profile either
    world.run_pass()
    assert world.calls() == []  # nothing left to fold, no call

    tea = world.fact("tea", "Prefers tea")
    assert world.post("memory.get", user_id=USER, key="tea")["memory"]["tags"] == []
    model.script(folded("Prefers tea."))
    world.run_pass()
    assert "diabetes" not in str(world.calls()[0].body)
    assert trace_ids(world.section()) == {tea["memory_id"]}

    # A rewrite without the attribute drops the tag the detector added, not the caller's.
    world.fact("dx", "Prefers morning appointments", tags=["vip"])
    assert world.post("memory.get", user_id=USER, key="dx")["memory"]["tags"] == ["vip"]
