"""The planner's rule for a build deferred for budget: not a failure, stays listed at the front,
built in the first pass after the window has room, in the passes' order (pure, no Redis)."""

from __future__ import annotations

from jobs.planner import Outcome, PassPlanner, PlannerSettings, PlannerState
from tests.test_planner import FP, T0, World, ns, run_pass, users

CFG = PlannerSettings(max_users_per_pass=4)


def test_deferred_users_earn_no_wait_and_come_first_once_the_window_has_room():
    budget_open = {"value": False}

    def outcome(space: str, user: str) -> Outcome:
        if space == "a" and not budget_open["value"]:
            return Outcome.DEFERRED
        return Outcome.BUILT

    world = World(behind={"a": users("a-", 3), "b": users("b-", 3)}, outcome=outcome)
    state, delay, taken, _ = run_pass(PlannerState(generation=1), [ns("a"), ns("b")], world, T0,
                                      CFG)
    assert taken == [("a", "a-000"), ("a", "a-001"), ("b", "b-000"), ("b", "b-001")]
    assert state.user_waits == {}  # no backoff for the deferred users
    assert delay == CFG.interval_seconds  # users are behind: no idle wait
    # Listed again at the front, in the order they were taken.
    assert state.scans["a"].users[:3] == ["a-000", "a-001", "a-002"]

    # While the budget is spent the same users come first each pass (and the share b leaves
    # goes to a, as the seed's passes give it); the other namespace keeps building.
    state, _, taken, _ = run_pass(state, [ns("a"), ns("b")], world, T0 + 60, CFG)
    assert taken == [("a", "a-000"), ("a", "a-001"), ("b", "b-002"), ("a", "a-002")]
    assert state.scans["a"].users == ["a-000", "a-001", "a-002"]

    # The window has room: the first pass builds them, oldest listed first.
    budget_open["value"] = True
    state, _, taken, _ = run_pass(state, [ns("a"), ns("b")], world, T0 + 120, CFG)
    assert [pair for pair in taken if pair[0] == "a"] == [
        ("a", "a-000"), ("a", "a-001"), ("a", "a-002")]
    assert world.behind["a"] == []


def test_a_deferral_after_a_failure_keeps_the_failure_count():
    planner = PassPlanner(PlannerState(generation=1), [ns("a")], CFG, T0)
    world = World(behind={"a": ["u"]})
    step = planner.next_step(T0)
    planner.record_scan("a", world.scan(step), T0)
    step = planner.next_step(T0)
    planner.record_result("a", step.user_id, Outcome.FAILED, T0)
    state, _ = planner.finish(T0)
    failures = state.user_waits["a"]["u"].failures
    later = T0 + CFG.backoff_cap_seconds
    planner = PassPlanner(state, [ns("a")], CFG, later)
    step = planner.next_step(later)
    planner.record_scan("a", world.scan(step), later)
    step = planner.next_step(later)
    assert step.user_id == "u"
    planner.record_result("a", "u", Outcome.DEFERRED, later, FP)
    state, _ = planner.finish(later)
    assert state.user_waits["a"]["u"].failures == failures
    assert state.scans["a"].users == ["u"]
