"""Builds and folds draw on the budgets: real Redis, the scripted model over HTTP, an injected
clock. Out of budget is a deferral (counted, logged once per namespace per window), never a
failure, and the deferred users are built once the window has room."""

from __future__ import annotations

import logging

import pytest

from app.model.chat import estimate_call_tokens
from app.store.budget import BudgetStore
from app.store.profile_schema import split_namespace_member
from app.store.usage import UsageStore
from jobs import consolidation
from jobs.planner import Outcome
from jobs.structured_profile import run_pass
from tests.support.model_server import ScriptedAnswer
from tests.test_consolidation import World as FoldWorld
from tests.test_structured_worker import SCHEMA
from tests.test_structured_worker import World as BuildWorld

WINDOW = 300
USERS = [f"u-{i}" for i in range(6)]


def _estimate(request) -> int:
    body = request.body
    schema = body.get("response_format", {}).get("json_schema", {}).get("schema")
    return estimate_call_tokens(body["messages"], body["max_tokens"], schema)


def _costs_its_estimate(request_body) -> ScriptedAnswer:
    """An answer whose reported usage is exactly the call's estimate: the worst a budget's
    reservation allows for."""
    content = {"preferred_name": "X"} if "Schema" in request_body["messages"][0]["content"] \
        else {"profile": "Prefers tea."}

    class Request:
        body = request_body

    estimate = _estimate(Request)
    return ScriptedAnswer(content=content, prompt_tokens=estimate - 10, completion_tokens=10)


@pytest.fixture
def builds(redis_url, tmp_path, model):
    model.default = _costs_its_estimate
    world = BuildWorld(redis_url, tmp_path, model, model_budget_window_seconds=WINDOW,
                       structured_profile_scan_max_age_seconds=60)
    for namespace in ("support", "billing", "probe"):
        world.client.post("/v1/profile_schema.set",
                          json={"namespace": namespace, "json_schema": SCHEMA})
    return world


def _facts(world, namespace: str, users: list[str]) -> None:
    for user in users:
        answer = world.client.post("/v1/memory.set", json={
            "namespace": namespace, "agent": "chat", "user_id": user, "key": "name",
            "value": f"I am {user}", "memory_type": "semantic"})
        assert answer.status_code == 200


def _one_estimate(world) -> int:
    """What one build of a user reserves, measured on a namespace of its own."""
    _facts(world, "probe", ["u-9"])
    world.run_pass()
    (request,) = world.calls()
    # Past the scan age: the probe pass's (empty) scans of the other namespaces are done with.
    world.clock.advance(61)
    return _estimate(request)


def _built(result: dict, namespace: str) -> list[str]:
    return [user for ns, user, outcome in result["built"]
            if split_namespace_member(ns)[1] == namespace and outcome == "built"]


def _deferred(result: dict, namespace: str) -> list[str]:
    return [user for ns, user, outcome in result["built"]
            if split_namespace_member(ns)[1] == namespace and outcome == str(Outcome.DEFERRED)]


def test_a_namespace_budget_stops_at_its_cap_and_resumes_when_the_window_moves(
        builds, caplog):
    estimate = _one_estimate(builds)
    cap = 2 * estimate + estimate // 2
    builds.client.post("/v1/budget.set", json={"namespace": "support", "tokens": cap})
    _facts(builds, "support", USERS)
    _facts(builds, "billing", USERS)
    budgets = builds.services.store(BudgetStore)
    usage = builds.services.store(UsageStore)

    with caplog.at_level(logging.WARNING, logger="loom.model.budget"):
        first = builds.run_pass()
        builds.clock.advance(60)
        second = builds.run_pass()
    # Two builds fit the cap, the rest wait; billing, with no budget, builds everyone.
    assert _built(first, "support") == USERS[:2]
    assert _deferred(first, "support") == USERS[2:]
    assert sorted(_built(first, "billing")) == USERS
    assert _built(second, "support") == [] and _deferred(second, "support") == USERS[2:]
    window = budgets.get("default", "support")
    assert window.spent_tokens <= cap and cap - window.spent_tokens < estimate
    assert usage.get("default", "support")["deferred_for_budget"] == 8
    assert usage.get("default", "support")["failures"] == 0
    logged = [r for r in caplog.records if "out of its namespace budget" in r.getMessage()]
    assert len(logged) == 1 and "default/support" in logged[0].getMessage()
    assert all("u-" not in r.getMessage() for r in caplog.records)
    for user in USERS[2:]:
        status = builds.client.post("/v1/profile.structured", json={
            "namespace": "support", "agent": "chat", "user_id": user}).get_json()["status"]
        assert status == "pending"

    # The window moves past the first builds: the first pass after it builds the next users in
    # the order the passes listed them.
    builds.clock.advance(WINDOW)
    third = builds.run_pass()
    assert _built(third, "support") == USERS[2:4]
    builds.clock.advance(WINDOW + 1)
    fourth = builds.run_pass()
    assert _built(fourth, "support") == USERS[4:]
    assert budgets.get("default", "support").spent_tokens <= cap


def test_an_org_budget_caps_its_namespaces_together(builds):
    estimate = _one_estimate(builds)
    spent_before = builds.services.store(BudgetStore).get("default", "*").spent_tokens
    cap = spent_before + 3 * estimate
    builds.client.post("/v1/budget.set", json={"namespace": "*", "tokens": cap})
    _facts(builds, "support", USERS)
    _facts(builds, "billing", USERS)
    result = builds.run_pass()
    built = _built(result, "support") + _built(result, "billing")
    assert len(built) == 3
    assert len(_deferred(result, "support") + _deferred(result, "billing")) == 9
    org = builds.services.store(BudgetStore).get("default", "*")
    assert org.spent_tokens <= cap and cap - org.spent_tokens < estimate


def test_a_failed_call_releases_its_reservation(builds, model):
    _facts(builds, "support", ["u-1"])
    builds.client.post("/v1/budget.set", json={"namespace": "support", "calls": 1})
    model.script(status=500)
    result = builds.run_pass()
    assert [outcome for _, _, outcome in result["built"]] == ["failed"]
    window = builds.services.store(BudgetStore).get("default", "support")
    assert (window.spent_calls, window.spent_tokens) == (0, 0)


def test_an_answer_that_is_not_json_still_settles_at_what_the_model_reported(builds, model):
    _facts(builds, "support", ["u-1"])
    model.script("not a JSON object", prompt_tokens=40, completion_tokens=3)
    result = builds.run_pass()
    assert [outcome for _, _, outcome in result["built"]] == ["failed"]
    window = builds.services.store(BudgetStore).get("default", "support")
    assert (window.spent_calls, window.spent_tokens) == (1, 43)


def test_a_cut_off_answer_settles_at_what_the_model_reported(builds, model):
    _facts(builds, "support", ["u-1"])
    model.script("{\"preferred_", finish_reason="length", prompt_tokens=70, completion_tokens=9)
    builds.run_pass()
    window = builds.services.store(BudgetStore).get("default", "support")
    assert (window.spent_calls, window.spent_tokens) == (1, 79)


# --- consolidation -----------------------------------------------------------------------------


@pytest.fixture
def folds(redis_url, tmp_path, model):
    model.default = _costs_its_estimate
    return FoldWorld(redis_url, tmp_path, model, model_budget_window_seconds=WINDOW)


def test_consolidation_draws_on_the_same_budget_and_resumes_in_order(folds, model):
    for user in ("a-1", "a-2", "a-3"):
        folds.fact("tea", f"{user} prefers tea", user=user)
        folds.clock.advance(1)
    folds.post("budget.set", calls=1)
    first = folds.run_pass()
    assert first["outcomes"] == {"folded": 1, "deferred": 1}  # the rest of the namespace waits
    assert folds.section(user="a-1") is not None and folds.section(user="a-2") is None
    assert folds.usage()["deferred_for_budget"] == 1 and folds.usage()["failures"] == 0
    folds.clock.advance(WINDOW)
    second = folds.run_pass()
    assert second["outcomes"] == {"folded": 1, "deferred": 1}
    assert folds.section(user="a-2") is not None and folds.section(user="a-3") is None
    assert len(folds.calls()) == 2


def test_builds_and_folds_share_one_budget(folds):
    folds.post("profile_schema.set", json_schema=SCHEMA)
    folds.fact("tea", "Prefers tea", user="u-1")
    folds.post("budget.set", calls=1)
    built = run_pass(folds.services, holder="test-worker", force=True)
    assert [outcome for _, _, outcome in built["built"]] == ["built"]
    result = folds.run_pass()
    assert result["outcomes"] == {str(consolidation.Outcome.DEFERRED): 1}
    assert folds.usage()["model_calls"] == 1 and folds.usage()["deferred_for_budget"] == 1
