"""budget.set / budget.get through the Flask app: answers, validation, reach, audit, races."""

from __future__ import annotations

import threading

import pytest
import redis

from app.store.budget import BudgetStore
from tests.auth_support import ADMIN_TOKEN, auth_app, bearer, mint
from tests.conftest import on_cluster_skip


def test_set_then_get_answers_caps_spent_and_remaining(client):
    answer = client.post("/v1/budget.set", json={"namespace": "support", "calls": 3,
                                                 "tokens": 1000}).get_json()
    assert {k: answer[k] for k in ("namespace", "calls", "tokens", "spent_calls",
                                   "remaining_calls", "remaining_tokens", "window_seconds")} == {
        "namespace": "support", "calls": 3, "tokens": 1000, "spent_calls": 0,
        "remaining_calls": 3, "remaining_tokens": 1000, "window_seconds": 86400}
    assert answer["set_by"] == "single-user" and answer["set_at"].endswith("Z")
    budgets = client.application.extensions["loom"].store(BudgetStore)
    reservation = budgets.reserve("default", "support", 400)
    budgets.settle(reservation, 250)
    got = client.post("/v1/budget.get", json={"namespace": "support"}).get_json()
    assert (got["spent_calls"], got["spent_tokens"]) == (1, 250)
    assert (got["remaining_calls"], got["remaining_tokens"]) == (2, 750)
    org = client.post("/v1/budget.get", json={"namespace": "*"}).get_json()
    assert org["namespace"] == "*" and org["calls"] is None and org["remaining_calls"] is None
    assert (org["spent_calls"], org["spent_tokens"]) == (1, 250)


def test_get_answers_the_windows_calls_over_time_per_namespace(app_factory, clock):
    client = app_factory(clock=clock).test_client()
    budgets = client.application.extensions["loom"].store(BudgetStore)
    window = budgets.window_seconds
    clock.advance(0.1 * window)
    for namespace, tokens in (("support", 100), ("support", 50)):
        budgets.settle(budgets.reserve("default", namespace, tokens), tokens)
    clock.advance(0.5 * window)
    for namespace, tokens in (("support", 30), ("sales", 999)):
        budgets.settle(budgets.reserve("default", namespace, tokens), tokens)
    clock.advance(0.2 * window)
    # The window is now [-0.2, 0.8) of a window after the start, in quarters: the first two
    # calls fall in the second quarter, the third in the last; sales is another namespace.
    got = client.post("/v1/budget.get", json={"namespace": "support",
                                              "timeline_buckets": 4}).get_json()
    assert [(b["calls"], b["tokens"]) for b in got["timeline"]] == [
        (0, 0), (2, 150), (0, 0), (1, 30)]
    calls = [b["calls"] for b in got["timeline"]]
    assert sum(calls) == got["spent_calls"] == 3
    assert sum(b["tokens"] for b in got["timeline"]) == got["spent_tokens"] == 180
    assert got["timeline"][0]["start"] < got["timeline"][-1]["start"]
    org = client.post("/v1/budget.get", json={"namespace": "*", "timeline_buckets": 4}).get_json()
    assert sum(b["tokens"] for b in org["timeline"]) == 180 + 999
    plain = client.post("/v1/budget.get", json={"namespace": "support"}).get_json()
    assert "timeline" not in plain
    refused = client.post("/v1/budget.get", json={"namespace": "support",
                                                  "timeline_buckets": 10_000})
    assert refused.status_code == 422
    assert "timeline_buckets" in refused.get_json()["error"]["fields"]


def test_a_budget_never_set_is_no_cap(client):
    got = client.post("/v1/budget.get", json={"namespace": "fresh"}).get_json()
    assert (got["calls"], got["tokens"], got["set_by"], got["set_at"]) == (None, None, None, None)


def test_null_or_left_out_removes_a_cap(client):
    client.post("/v1/budget.set", json={"namespace": "support", "calls": 3, "tokens": 10})
    got = client.post("/v1/budget.set", json={"namespace": "support", "calls": None}).get_json()
    assert (got["calls"], got["tokens"]) == (None, None)


@pytest.mark.parametrize("body, bad", [
    ({"calls": -1}, {"calls"}),
    ({"tokens": "1000"}, {"tokens"}),
    ({"calls": True, "tokens": 1.5}, {"calls", "tokens"}),
    ({"tokens": 2**53}, {"tokens"}),
])
def test_bad_caps_are_422_naming_each_field_and_nothing_is_stored(client, body, bad):
    response = client.post("/v1/budget.set", json={"namespace": "support", **body})
    assert response.status_code == 422
    error = response.get_json()["error"]
    assert error["code"] == "VALIDATION_ERROR" and set(error["fields"]) == bad
    got = client.post("/v1/budget.get", json={"namespace": "support"}).get_json()
    assert got["set_at"] is None


def test_set_is_audited_with_old_and_new_caps(client):
    client.post("/v1/budget.set", json={"namespace": "support", "tokens": 100})
    client.post("/v1/budget.set", json={"namespace": "support", "calls": 5, "tokens": 200})
    client.post("/v1/budget.set", json={"namespace": "*", "calls": 50})
    entries = client.post("/v1/audit.list", json={"namespace": "support"}).get_json()["entries"]
    assert [(e["action"], e["old_calls"], e["old_tokens"], e["new_calls"], e["new_tokens"])
            for e in entries] == [("budget.set", None, 100, 5, 200),
                                  ("budget.set", None, None, None, 100)]
    assert entries[0]["actor"] == "single-user" and entries[0]["scope"] == "namespace"
    org = client.post("/v1/audit.list", json={"namespace": "*"}).get_json()["entries"]
    assert [(e["scope"], e["new_calls"]) for e in org] == [("org", 50)]


@pytest.fixture
def auth_client(app_factory):
    return auth_app(app_factory).test_client()


def test_the_org_budget_needs_a_token_reaching_the_whole_org(auth_client):
    namespace_admin = mint(auth_client, org="acme", namespace="support", role="admin")
    org_admin = mint(auth_client, org="acme", namespace="*", role="admin")
    for op in ("budget.set", "budget.get"):
        refused = auth_client.post(f"/v1/{op}", json={"namespace": "*", "calls": 1},
                                   headers=bearer(namespace_admin))
        assert refused.status_code == 403, refused.get_json()
        assert refused.get_json()["error"]["code"] == "AUTH_INSUFFICIENT"
        assert list(refused.get_json()["error"]["fields"]) == ["namespace"]
    ok = auth_client.post("/v1/budget.set", json={"namespace": "*", "calls": 1},
                          headers=bearer(org_admin))
    assert ok.status_code == 200 and ok.get_json()["namespace"] == "*"
    # A namespace's admin sets its own namespace's budget (the body may leave it out).
    own = auth_client.post("/v1/budget.set", json={"tokens": 9}, headers=bearer(namespace_admin))
    assert own.status_code == 200 and own.get_json()["namespace"] == "support"
    other = auth_client.post("/v1/budget.set", json={"namespace": "billing", "tokens": 9},
                             headers=bearer(namespace_admin))
    assert other.status_code == 403
    org = auth_client.post("/v1/budget.get", json={"namespace": "*"},
                           headers=bearer(org_admin)).get_json()
    assert org["calls"] == 1 and org["tokens"] is None


def test_viewers_and_writers_cannot_set_or_read_budgets(auth_client):
    for role in ("viewer", "writer"):
        token = mint(auth_client, org="acme", namespace="support", role=role)
        for op in ("budget.set", "budget.get"):
            response = auth_client.post(f"/v1/{op}", json={"namespace": "support", "calls": 1},
                                        headers=bearer(token))
            assert response.status_code == 403, (role, op)
    got = auth_client.post("/v1/budget.get", json={"org": "acme", "namespace": "support"},
                           headers=bearer(ADMIN_TOKEN)).get_json()
    assert got["calls"] is None


def test_concurrent_sets_leave_one_budget_and_an_exact_audit_chain(client):
    app = client.application
    errors: list[object] = []

    def writer(index: int) -> None:
        local = app.test_client()
        for round_ in range(10):
            response = local.post("/v1/budget.set", json={
                "namespace": "support", "calls": index * 100 + round_, "tokens": index})
            if response.status_code != 200:
                errors.append(response.get_json())

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(1, 6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    entries = client.post("/v1/audit.list", json={"namespace": "support", "limit": 200}
                          ).get_json()["entries"]
    assert len(entries) == 50
    # Newest first: each entry's old caps are the caps the entry before it set. Entries of one
    # nanosecond's clock reading may tie, so the chain is checked as a set of links.
    links = {(e["old_calls"], e["old_tokens"]): (e["new_calls"], e["new_tokens"])
             for e in entries}
    current = (None, None)
    seen = 0
    while current in links:
        current = links[current]
        seen += 1
    assert seen == 50
    got = client.post("/v1/budget.get", json={"namespace": "support"}).get_json()
    assert (got["calls"], got["tokens"]) == current


@on_cluster_skip  # a server of its own, killed: not the data plane under test
def test_budget_ops_answer_503_with_retry_after_while_redis_is_down(tmp_path):
    from tests.conftest import make_app
    from tests.support.owned_redis import OwnedRedis

    server = OwnedRedis(tmp_path / "owned-redis").start()
    try:
        client = make_app(server.url, tmp_path, redis_socket_timeout_seconds=0.5,
                          redis_connect_timeout_seconds=0.5).test_client()
        assert client.post("/v1/budget.set", json={"namespace": "support",
                                                   "calls": 1}).status_code == 200
        server.kill()
        for op in ("budget.set", "budget.get"):
            response = client.post(f"/v1/{op}", json={"namespace": "support", "calls": 2})
            assert response.status_code == 503, (op, response.get_json())
            assert response.get_json()["error"]["code"] == "STORE_UNAVAILABLE"
            assert response.headers.get("Retry-After")
        server.start()
        got = client.post("/v1/budget.get", json={"namespace": "support"}).get_json()
        assert got["calls"] == 1  # the refused set wrote nothing
    finally:
        server.stop()


@on_cluster_skip  # on a cluster the audit list is in another slot: the entry is its own step
@pytest.mark.parametrize("headers", [{}, {"Idempotency-Key": "set-cut"}])
def test_a_set_cut_right_after_its_script_still_leaves_its_audit_entry(client, monkeypatch,
                                                                       headers):
    client.post("/v1/budget.set", json={"namespace": "support", "calls": 3})
    store = client.application.extensions["loom"].store(BudgetStore)
    real_set = store._set

    def cut(*args, **kwargs):
        real_set(*args, **kwargs)
        # The connection resets (or the worker dies) once the script ran: nothing after it.
        raise redis.ConnectionError("connection reset after the script ran")

    monkeypatch.setattr(store, "_set", cut)
    body = {"namespace": "support", "calls": 5, "tokens": 9}
    assert client.post("/v1/budget.set", json=body, headers=headers).status_code >= 500
    monkeypatch.undo()

    def audited() -> list[tuple[object, ...]]:
        entries = client.post("/v1/audit.list", json={"namespace": "support"}).get_json()
        return [(e["old_calls"], e["old_tokens"], e["new_calls"], e["new_tokens"])
                for e in entries["entries"]]

    # The caps and their entry came in the same step: the cut could not part them.
    assert audited() == [(3, None, 5, 9), (None, None, 3, None)]
    got = client.post("/v1/budget.get", json={"namespace": "support"}).get_json()
    assert (got["calls"], got["tokens"]) == (5, 9)
    if headers:
        # The retry gets the kept answer and audits nothing twice.
        retry = client.post("/v1/budget.set", json=body, headers=headers)
        assert retry.status_code == 200 and retry.get_json()["calls"] == 5
        assert len(audited()) == 2
