"""The per-token request budget with auth on (issue 46, point 3), through the Flask app.

With LOOM_AUTH=on a token has a budget unless LOOM_RATE_LIMIT turns it off, and a search
(memory.search, memory.ask, memory.unified_search, context.pack with a query) counts by its
distinct terms and read scope (``app.search_cost``), so one long query spends what the short
queries holding the same words spend, never less.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import requests

from app.search_cost import TERMS_PER_REQUEST, search_cost, terms_cost
from app.settings import AUTO_RATE_LIMIT, load_settings
from tests.auth_support import auth_app, bearer, mint
from tests.conftest import TEST_SECRET
from tests.support.live_server import LiveServer

NS = "budget-ns"
WHO = {"namespace": NS, "agent": "bot", "user_id": "alice"}
SEARCHES = ("memory.search", "memory.ask", "memory.unified_search", "context.pack")


def words(count: int, start: int = 0) -> str:
    """``count`` distinct terms the recall tokenizer keeps as they are."""
    return " ".join(f"zq{n:04d}" for n in range(start, start + count))


def post(client, token: str, op_name: str, **body: Any):
    return client.post(f"/v1/{op_name}", json={**WHO, **body}, headers=bearer(token))


def spend_until_refused(client, token: str, op_name: str, most: int, **body: Any) -> int:
    """How many calls pass before the first 429 (which must come within ``most``)."""
    for passed in range(most):
        response = post(client, token, op_name, **body)
        if response.status_code == 429:
            assert response.get_json()["error"]["code"] == "RATE_LIMITED"
            assert int(response.headers["Retry-After"]) >= 1
            return passed
        assert response.status_code == 200, response.get_json()
    raise AssertionError(f"{most} calls passed without a 429")


def test_the_cost_counts_distinct_kept_terms_times_the_scope_weight():
    assert search_cost("refund", "own_user") == 1
    # Stop words and repeats are no terms: they cost nothing.
    assert search_cost("what is the refund the refund policy", "own_user") == 1
    assert search_cost(words(TERMS_PER_REQUEST), "own_user") == 1
    assert search_cost(words(TERMS_PER_REQUEST + 1), "own_user") == 2
    assert search_cost(words(32), "own_user") == 32 // TERMS_PER_REQUEST
    assert search_cost(words(32), "own_session") == search_cost(words(32), "own_user")
    assert search_cost(words(32), "namespace") == 4 * search_cost(words(32), "own_user")
    # Split into short queries, the same words cost as much as in one long one.
    short = sum(search_cost(words(TERMS_PER_REQUEST, n), "namespace")
                for n in range(0, 32, TERMS_PER_REQUEST))
    assert short == search_cost(words(32), "namespace")
    assert terms_cost(0, "namespace") == 1


def test_auth_on_has_a_budget_by_default_and_off_turns_it_off():
    base = {"LOOM_SECRET_KEY": "k"}
    assert load_settings(base).request_budget is None  # auth off: one local user
    on = load_settings({**base, "LOOM_AUTH": "on"})
    assert on.rate_limit == "auto" and on.request_budget == (1200, 60)
    assert AUTO_RATE_LIMIT == "1200/minute"
    for off in ("off", ""):
        assert load_settings({**base, "LOOM_AUTH": "on",
                              "LOOM_RATE_LIMIT": off}).request_budget is None
    assert load_settings({**base, "LOOM_AUTH": "on",
                          "LOOM_RATE_LIMIT": "30/second"}).request_budget == (30, 1)


def test_a_token_spends_the_default_budget_and_waits_out_the_window(app_factory, clock):
    client = auth_app(app_factory, clock=clock).test_client()
    token = mint(client, namespace=NS, role="viewer")
    other = mint(client, namespace=NS, role="viewer")
    # 32 terms at namespace scope cost 32 requests: 1200 // 32 = 37 pass, the 38th is refused.
    long_query = words(32)
    assert search_cost(long_query, "namespace") == 32
    passed = spend_until_refused(client, token, "memory.search", 40,
                                 query=long_query, read_scope="namespace")
    assert passed == 1200 // 32
    # The budget is the token's: another token still searches; the next window serves it.
    assert post(client, other, "memory.search", query=long_query).status_code == 200
    assert post(client, token, "memory.get", key="k").status_code == 429
    clock.advance(61)
    assert post(client, token, "memory.search", query=long_query).status_code == 200


def test_auth_on_with_the_budget_turned_off_refuses_nothing(app_factory, clock):
    client = auth_app(app_factory, rate_limit=None, clock=clock).test_client()
    token = mint(client, namespace=NS, role="viewer")
    for _ in range(40):  # 40 x 32 requests' worth, past the default budget
        response = post(client, token, "memory.search", query=words(32), read_scope="namespace")
        assert response.status_code == 200


@pytest.mark.parametrize("op_name", SEARCHES)
def test_long_queries_buy_no_more_than_short_ones(app_factory, clock, model, op_name):
    # memory.ask needs a model configured; with no facts found it makes no call.
    client = auth_app(app_factory, rate_limit=(40, 60), clock=clock,
                      llm_base_url=model.base_url, llm_model="scripted-model").test_client()
    short, long_, wide = (mint(client, namespace=NS, role="viewer") for _ in range(3))
    # Four terms at own_user: one request each, forty of them.
    assert spend_until_refused(client, short, op_name, 50, query=words(4),
                               read_scope="own_user") == 40
    # Thirty-two terms: eight requests each, so five of them, the same 160 terms in all.
    assert spend_until_refused(client, long_, op_name, 10, query=words(32),
                               read_scope="own_user") == 5
    # The same at namespace scope weighs four times as much: one, and the next is refused.
    assert spend_until_refused(client, wide, op_name, 5, query=words(32),
                               read_scope="namespace") == 1


def test_a_search_dearer_than_the_whole_budget_still_runs_in_a_fresh_window(app_factory, clock):
    client = auth_app(app_factory, rate_limit=(5, 60), clock=clock).test_client()
    token = mint(client, namespace=NS, role="viewer")
    # 32 terms at namespace cost 32, capped at the budget: it takes the whole window.
    assert spend_until_refused(client, token, "memory.search", 3, query=words(32),
                               read_scope="namespace") == 1
    clock.advance(61)
    assert post(client, token, "memory.search", query=words(32),
                read_scope="namespace").status_code == 200


def test_gunicorn_with_auth_on_and_no_setting_refuses_past_the_default(redis_url, tmp_path):
    """The real web process, LOOM_AUTH=on and LOOM_RATE_LIMIT unset: the default budget is
    on, shared by both workers, and a namespace search of 32 terms spends 32 of it."""
    admin = "budget-admin-token"
    env = {"REDIS_URL": redis_url, "LOOM_SECRET_KEY": TEST_SECRET,
           "LOOM_DATA_DIR": str(tmp_path), "LOOM_AUTH": "on", "LOOM_ADMIN_TOKEN": admin}
    with LiveServer(env) as live:
        minted = requests.post(live.url + "/v1/token.create", timeout=10,
                               json={"namespace": NS, "role": "viewer"},
                               headers=bearer(admin))
        token = minted.json()["token"]
        if time.time() % 60 > 45:  # the 38 calls must fall in one minute's window
            time.sleep(61 - time.time() % 60)
        statuses = [requests.post(live.url + "/v1/memory.search", timeout=10, json={
            **WHO, "query": words(32), "read_scope": "namespace"},
            headers=bearer(token)).status_code for _ in range(1200 // 32 + 1)]
    assert statuses == [200] * (1200 // 32) + [429]
