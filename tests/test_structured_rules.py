"""Structured-profile rules that live in the glue between the planner, the stores and RQ,
with the injected clock, real Redis and the scripted model over HTTP."""

from __future__ import annotations

from datetime import UTC, datetime

from tests import test_structured_worker
from tests.test_structured_worker import SCHEMA, World, answer

# The worker tests' fixtures, bound in this module so pytest offers them to these tests.
world = test_structured_worker.world

ROW = {"user_id": "u-42", "agent": "-", "key": "structured_profile"}


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat().replace("+00:00", "Z")


def _built(world, model, name="Sam"):
    world.fact("name", f"Call me {name}")
    model.script(answer(preferred_name=name))
    world.run_pass()
    assert world.structured()["status"] == "ready"


def test_a_callers_overwrite_of_a_built_profile_is_rebuilt(world, model):
    _built(world, model)
    world.post("memory.set", **ROW, memory_type="profile", value={"preferred_name": "Forged"})
    assert world.structured()["status"] == "pending"
    model.script(answer(preferred_name="Sam"))
    world.clock.advance(61)  # the namespace's next scan; no cooldown for a pending profile
    world.run_pass()
    out = world.structured()
    assert out["status"] == "ready" and out["profile"]["preferred_name"] == "Sam"
    assert len(world.calls()) == 2


def test_a_redacted_built_profile_is_rebuilt(world, model):
    _built(world, model)
    world.post("memory.redact", **ROW)
    assert world.structured()["status"] == "pending"
    model.script(answer(preferred_name="Sam"))
    world.clock.advance(61)
    world.run_pass()
    assert world.structured()["status"] == "ready" and len(world.calls()) == 2


def test_a_fact_passing_its_valid_to_reads_stale_and_is_rebuilt_without_cooldown(world, model):
    now = world.clock.now()
    world.fact("name", "Call me Sam")
    world.fact("tz", "Lives in Lisbon until next week", valid_to=_iso(now + 100))
    model.script(answer(preferred_name="Sam", timezone="Europe/Lisbon"))
    world.run_pass()
    assert world.structured()["status"] == "ready"
    world.clock.advance(101)
    assert world.structured()["status"] == "stale"  # on read, no write since
    model.script(answer(preferred_name="Sam"))
    world.run_pass()  # 101 s after the build: well inside the 600 s cooldown
    out = world.structured()
    assert out["status"] == "ready" and out["profile"]["timezone"] is None
    assert len(world.calls()) == 2
    assert "Lisbon" not in str(world.calls()[1].body)


def test_a_refusal_is_retried_after_refusal_retry_seconds_not_a_cooldown_later(
    redis_url, tmp_path, model
):
    w = World(redis_url, tmp_path, model, structured_profile_cooldown_seconds=600,
              structured_profile_scan_max_age_seconds=10,
              structured_profile_refusal_retry_seconds=1000)
    w.post("profile_schema.set", json_schema=SCHEMA)
    _built(w, model, "Sam")
    w.fact("name", "Call me Samuel")
    w.clock.advance(601)
    model.script('{"preferred_name": "Sa', finish_reason="length")
    w.run_pass()
    assert len(w.calls()) == 2 and w.structured()["status"] == "stale"
    w.clock.advance(990)
    w.run_pass()
    assert len(w.calls()) == 2
    w.clock.advance(20)  # 1010 s after the cut-off answer: its wait is over
    model.script(answer(preferred_name="Samuel"))
    w.run_pass()
    assert len(w.calls()) == 3 and w.structured()["status"] == "ready"


def test_the_all_null_profile_is_never_written_over_a_callers_row(world, model):
    _built(world, model)
    world.post("memory.set", **ROW, memory_type="profile", value={"preferred_name": "Mine"})
    world.post("memory.delete", user_id="u-42", key="name")
    world.clock.advance(61)
    world.run_pass()
    row = world.post("memory.get", **ROW)["memory"]
    assert row["value"] == {"preferred_name": "Mine"}
    assert row["written_by"] != "worker:structured_profile"
    assert len(world.calls()) == 1


def test_a_fact_passing_its_valid_to_while_the_model_runs_is_never_kept(world, model):
    """The build read the fact while it held; it passed its valid_to before the answer came:
    the answer is not written, the fact leaves the digest (a removal: rebuilt at the next
    pass, without the fact), and no profile holding it is ever served."""
    now = world.clock.now()
    world.fact("name", "Call me Sam")
    model.script(answer(preferred_name="Sam"))
    world.run_pass()
    assert world.structured()["status"] == "ready"
    world.clock.advance(700)
    world.fact("tz", "Lives in Lisbon until next week", valid_to=_iso(now + 1361))
    world.clock.advance(601)  # past the cooldown: the next pass builds the new fact

    def slow_answer(_body):
        world.clock.advance(120)  # the model answers after the fact's valid_to
        return answer(preferred_name="Sam", timezone="Europe/Lisbon")

    model.default = slow_answer
    world.run_pass()
    model.default = None
    assert len(world.calls()) == 2 and "Lisbon" in str(world.calls()[1].body)
    out = world.structured()
    assert out["status"] == "ready" and out["profile"] == answer(preferred_name="Sam")
    world.clock.advance(61)
    model.script(answer(preferred_name="Sam"))
    world.run_pass()
    assert len(world.calls()) == 3 and "Lisbon" not in str(world.calls()[2].body)
    out = world.structured()
    assert out["status"] == "ready" and out["profile"]["timezone"] is None


def test_waits_and_scan_lists_start_over_when_another_process_takes_the_lease(world, model):
    """Seed 000: the waits and the scan lists are kept in the worker's process and start over
    when another process takes the worker lease."""
    from jobs.structured_profile import run_pass

    world.fact("name", "Call me Sam")
    model.script(status=500, body={"error": {"message": "down"}})
    run_pass(world.services, holder="host:1", force=True)
    assert len(world.calls()) == 1  # failed: waits the 300 s backoff in process 1
    world.clock.advance(61)  # a new scan is due; the wait is not over
    run_pass(world.services, holder="host:1", force=True)
    assert len(world.calls()) == 1
    model.script(answer(preferred_name="Sam"))
    run_pass(world.services, holder="host:2", force=True)  # another process: no wait kept
    assert len(world.calls()) == 2
    assert world.structured()["status"] == "ready"
