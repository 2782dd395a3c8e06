"""What the memory revisions cost a structured profile (seed 000, Staleness): a revert, a
restore, a restatement and a reinforcement change the digest and are rebuilt once, after the
cooldown; a recall or a backfill keeps the row's last change and is never rebuilt. With the
injected clock, real Redis and the scripted model over HTTP."""

from __future__ import annotations

import pytest

from app.store.memory import MemoryStore
from tests import test_structured_worker
from tests.test_structured_worker import answer

# The worker tests' fixtures, bound in this module so pytest offers them to these tests.
world = test_structured_worker.world


def _built(world, model):
    """Two facts, one built profile; answers the first fact's first version."""
    first = world.fact("name", "Call me Sam")
    world.fact("tz", "Lives in Berlin")
    model.script(answer(preferred_name="Sam", timezone="Europe/Berlin"))
    world.run_pass()
    assert world.structured()["status"] == "ready" and len(world.calls()) == 1
    return first


def _revise(world, op_name, first):
    body = {"user_id": "u-42", "key": "name"}
    if op_name == "revert":
        world.fact("name", "Call me Samuel")  # an edit, built below, then reverted
        model_calls = len(world.calls())
        world.clock.advance(601)
        world.model.script(answer(preferred_name="Samuel", timezone="Europe/Berlin"))
        world.run_pass()
        assert len(world.calls()) == model_calls + 1
        body["version"] = first["version"]
    if op_name == "restore":
        world.post("memory.delete", user_id="u-42", key="name")
        world.clock.advance(61)  # a deletion skips the cooldown: rebuilt at the next scan
        world.model.script(answer(timezone="Europe/Berlin"))
        world.run_pass()
        assert world.structured()["status"] == "ready"
    if op_name == "reinforce":
        body["confidence"] = 0.9
    calls = len(world.calls())
    world.clock.advance(601)  # the cooldown of whatever came before is over
    world.run_pass()
    assert len(world.calls()) == calls  # nothing behind before the revision
    out = world.post(f"memory.{op_name}", **body)
    assert out["change"] == op_name, out
    return out, calls


@pytest.mark.parametrize("op_name", ["revert", "restore", "restate", "reinforce"])
def test_a_revision_that_moves_the_fact_costs_one_rebuild_after_the_cooldown(
    world, model, op_name
):
    first = _built(world, model)
    out, calls = _revise(world, op_name, first)
    assert out["digest_moved"] is True
    assert world.structured()["status"] == "stale"  # at once, on read
    world.clock.advance(61)
    world.run_pass()  # scanned, but inside the cooldown: no call
    assert len(world.calls()) == calls and world.structured()["status"] == "stale"
    model.script(answer(preferred_name="Sam", timezone="Europe/Berlin"))
    world.clock.advance(540)
    world.run_pass()
    assert len(world.calls()) == calls + 1
    assert world.structured()["status"] == "ready"
    # The revised fact is read first now: the newest among facts of equal confidence.
    facts = world.calls()[-1].body["messages"][1]["content"].splitlines()[1:]
    assert "Call me Sam" in facts[0]
    for _ in range(3):  # and once only
        world.clock.advance(601)
        world.run_pass()
    assert len(world.calls()) == calls + 1


@pytest.mark.parametrize("op_name", ["recall", "backfill"])
def test_a_recall_or_a_backfill_keeps_the_profile_ready_and_costs_no_call(
    world, model, op_name
):
    first = _built(world, model)
    digest_before = world.services.store(
        MemoryStore).source_digest(
        world.services.settings.default_org, "support", "u-42")
    if op_name == "backfill":
        # Leave the row as an older release wrote it, so the backfill has something to write.
        row_key = world.services.store(MemoryStore).locate(
            world.services.settings.default_org, "support", first["memory_id"]).row_key()
        world.services.redis.hset(row_key, "recall_terms", "")
    out, calls = _revise(world, op_name, first)
    assert out["digest_moved"] is False and out["changed"] is True
    assert world.structured()["status"] == "ready"
    digest_after = world.services.store(
        MemoryStore).source_digest(
        world.services.settings.default_org, "support", "u-42")
    assert digest_after == digest_before
    for _ in range(3):
        world.clock.advance(601)
        world.run_pass()
    assert len(world.calls()) == calls and world.structured()["status"] == "ready"
