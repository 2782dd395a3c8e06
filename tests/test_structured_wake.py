"""A first structured profile within a pass interval (issue 47, point 4): a schema set or a
never-built user's first source fact ends an idle pass's wait and makes the next pass scan the
namespace again; anything else leaves the idle interval as seed 000 sets it. And
``profile.structured``'s ``next_pass_at``.

Passes run here as the scheduler's job body does (``run_pass`` not forced), on a frozen clock,
against the suite's Redis and a scripted model over HTTP.
"""

from __future__ import annotations

from datetime import datetime

import pytest

from app.store.lease import NextPass
from jobs.structured_profile import run_pass
from tests.test_structured_worker import SCHEMA, World, answer

IDLE = "idle until the next pass is due"
INTERVAL = 60  # the seed's defaults: a 60 s tick, a 600 s idle interval and cooldown
START = 1_800_000_000.0


@pytest.fixture
def world(redis_url, tmp_path, model):
    return World(redis_url, tmp_path, model)


def tick(world: World, seconds: float = INTERVAL) -> dict:
    """The scheduler's next tick: the clock moves one interval, the pass job runs."""
    world.clock.advance(seconds)
    return run_pass(world.services, holder="test-worker")


def built(out: dict) -> list[str]:
    return [user for _ns, user, outcome in out.get("built", []) if outcome == "built"]


def at(iso: str | None) -> float:
    assert iso is not None
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_a_schema_set_after_an_idle_pass_is_built_at_the_next_tick(world, model):
    world.fact("name", "Call me Sam")  # no schema yet: nothing to build
    assert tick(world, 0)["next_pass_in"] == 600  # the start-up pass found no namespace: idle
    assert tick(world) == {"skipped": IDLE}
    world.post("profile_schema.set", json_schema=SCHEMA)
    model.script(answer(preferred_name="Sam"))
    assert built(tick(world)) == ["u-42"]
    assert world.structured()["status"] == "ready"


def test_a_new_users_first_fact_ends_the_idle_wait_and_is_built_without_a_cooldown(world, model):
    world.post("profile_schema.set", json_schema=SCHEMA)
    world.fact("name", "Call me Sam", user="old")
    model.script(answer(preferred_name="Sam"))
    assert built(tick(world, 0)) == ["old"]
    # Nobody behind: idle, and the namespace's scan list is drained and complete, which alone
    # would keep a new user off every list until it is SCAN_MAX_AGE old.
    assert tick(world)["next_pass_in"] == 600
    assert tick(world) == {"skipped": IDLE}

    world.fact("name", "Call me Ada", user="new")
    assert world.structured("new")["status"] == "pending"
    model.script(answer(preferred_name="Ada"))
    out = tick(world)
    assert built(out) == ["new"]
    assert world.structured("new")["profile"] == answer(preferred_name="Ada")
    assert len(world.calls()) == 2


def test_with_nothing_new_the_idle_interval_holds(world, model):
    world.post("profile_schema.set", json_schema=SCHEMA)
    world.fact("name", "Call me Sam")
    model.script(answer(preferred_name="Sam"))
    assert built(tick(world, 0)) == ["u-42"]
    assert tick(world)["next_pass_in"] == 600
    # A built user's next fact, a rewrite, a user who writes only a profile section or a
    # working-memory block: none is a first source fact, so none ends the wait.
    world.fact("tz", "Lives in Berlin")
    world.fact("name", "Call me Samuel")
    assert "error" not in world.post("profile.set", user_id="other", label="notes",
                                     value="likes tea")
    assert "error" not in world.post("working_memory.set", user_id="other", block_key="todo",
                                     content="x")
    skipped = [tick(world) for _ in range(8)]
    assert skipped == [{"skipped": IDLE}] * 8
    # The idle interval (600 s from the idle pass) ends, and so does the changes' cooldown.
    model.script(answer(preferred_name="Samuel", timezone="Europe/Berlin"))
    out = tick(world, 600 - 8 * INTERVAL)
    assert built(out) == ["u-42"], out
    assert len(world.calls()) == 2


def test_next_pass_at_says_when_a_pass_may_build_a_pending_or_stale_profile(world, model):
    world.post("profile_schema.set", json_schema=SCHEMA)
    world.fact("name", "Call me Sam")
    # No pass has run: no tick to count from.
    assert world.structured()["next_pass_at"] is None
    model.script(answer(preferred_name="Sam"))
    tick(world, 0)  # ticks at START, START + 60, ...
    ready = world.structured()
    assert ready["status"] == "ready" and ready["next_pass_at"] is None
    assert tick(world)["next_pass_in"] == 600  # idle: the wait runs to START + 660 or so

    world.clock.advance(5)
    # A new user woke the passes: the next tick, START + 120.
    world.fact("name", "Call me Ada", user="new")
    assert at(world.structured("new")["next_pass_at"]) == pytest.approx(START + 2 * INTERVAL)
    # A built user's change waits its cooldown from the change (START + 65 + 600), then the
    # first tick after it: START + 720.
    world.fact("tz", "Lives in Berlin")
    stale = world.structured()
    assert stale["status"] == "stale"
    assert at(stale["next_pass_at"]) == pytest.approx(START + 12 * INTERVAL)
    # A deletion skips the cooldown, like the pass.
    world.post("memory.delete", user_id="u-42", key="name")
    assert at(world.structured()["next_pass_at"]) == pytest.approx(START + 2 * INTERVAL)
    # And the pass comes when it says.
    world.clock.advance(55)
    assert "skipped" not in run_pass(world.services, holder="test-worker")


@pytest.mark.parametrize(("due", "wakes_then", "wakes_now", "now", "holds"), [
    (None, None, 0, 100.0, False),  # nothing stored: run
    (200.0, 3, 3, 100.0, True),  # idle, nothing woke it
    (200.0, 3, 4, 100.0, False),  # woken since
    (200.0, 3, 3, 200.0, False),  # the wait is over
    (200.0, None, 9, 100.0, True),  # stored by an older release or a busy pass: as it was
    (200.0, 5, 2, 100.0, False),  # the counts were lost (a flushed store): run once
])
def test_an_idle_wait_holds_only_while_nothing_woke_it(due, wakes_then, wakes_now, now, holds):
    assert NextPass(due, wakes_then, 0.0).wait_holds(now, wakes_now) is holds


def test_the_next_tick_is_on_the_schedulers_grid_after_the_wait():
    stored = NextPass(due=700.0, wakes=1, ticked_at=100.0)
    assert stored.next_tick(130.0, 2, 60) == 160.0  # woken: the next tick
    assert stored.next_tick(130.0, 1, 60) == 700.0  # the idle wait holds until 700
    assert stored.next_tick(701.0, 1, 60) == 760.0
    assert stored.next_tick(160.0, 2, 60) == 160.0  # on a tick: that tick
    assert NextPass(due=700.0).next_tick(130.0, 0, 60) is None  # no tick known
    for raw in ("", None):
        assert NextPass.parse(raw) == NextPass()
    assert NextPass.parse("700.5") == NextPass(700.5)  # as an older release wrote it
    assert NextPass.parse(NextPass(1.5, 7, 2.25).dump()) == NextPass(1.5, 7, 2.25)
    assert NextPass.parse(NextPass(1.5, None, 2.25).dump()) == NextPass(1.5, None, 2.25)
