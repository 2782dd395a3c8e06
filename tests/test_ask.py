"""memory.ask through the Flask app, with its one model call over real HTTP to the scripted
OpenAI-compatible server: what the prompt carries (the hits, the run's blocks), which citations
stay, the read scope a pinned token holds it to, model calls off, budgets and the ledger, and
every way the call can fail answered as a 4xx or a 5xx that is not a 500.
"""

from __future__ import annotations

import json
import threading

import pytest

from app.store.usage import UsageStore
from loom import errors as sdk_errors
from loom.retry import retriable
from tests.auth_support import ADMIN_TOKEN, auth_app, bearer, mint
from tests.support.api import op_helpers

NS = {"namespace": "support", "agent": "triage-bot", "user_id": "u-42"}
call, ok = op_helpers(NS)


def model_app(app_factory, model, **overrides):
    return app_factory(llm_base_url=model.base_url, llm_model="scripted-model", **overrides)


@pytest.fixture
def client(app_factory, model):
    return model_app(app_factory, model).test_client()


def prompt_of(request) -> str:
    return "\n".join(message["content"] for message in request.body["messages"])


def prompt_facts(request) -> list[dict]:
    """The fact lines of the prompt, parsed."""
    text = prompt_of(request)
    block = text.split("Facts, best match first, one JSON object per line:\n", 1)[1]
    lines = block.split("\n\nQuestion:", 1)[0].splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def ledger(client) -> dict[str, int]:
    app = client.application
    return app.extensions["loom"].store(UsageStore).by_worker("default", "support")["memory_ask"]


def test_the_answer_cites_the_hits_the_prompt_carried(client, model):
    eur = ok(client, "memory.set", key="currency", value="Invoices go out in EUR")["memory_id"]
    ok(client, "memory.set", key="pet", value="Has a cat named Miso")
    model.script({"answer": "Use EUR.", "citations": [eur]})
    out = ok(client, "memory.ask", query="which currency for invoices", read_scope="own_user")
    assert out["answer"] == "Use EUR." and out["citations"] == [eur]
    assert out["uncited_ids"] == [] and out["model_called"] is True
    assert [hit["memory_id"] for hit in out["hits"]] == [eur]
    (request,) = model.completion_requests
    assert [fact["id"] for fact in prompt_facts(request)] == [eur]
    assert "which currency for invoices" in prompt_of(request)
    # json_schema asked, the answer shape named, the output cap sized from it.
    assert request.body["response_format"]["type"] == "json_schema"
    assert request.body["max_tokens"] > 32


def test_ids_the_model_cites_outside_its_prompt_are_dropped_and_listed(client, model):
    eur = ok(client, "memory.set", key="currency", value="Invoices in EUR")["memory_id"]
    hidden = ok(client, "memory.set", key="other", value="Ships to Lisbon")["memory_id"]
    model.script({"answer": "EUR.", "citations": ["made-up", eur, hidden, eur]})
    out = ok(client, "memory.ask", query="invoices currency", read_scope="own_user")
    assert out["citations"] == [eur]
    assert out["uncited_ids"] == ["made-up", hidden]


def test_the_named_runs_blocks_go_into_the_prompt_and_no_others(client, model):
    ok(client, "working_memory.set", block_key="plan", content="step 2: refund check",
       session_id="s-1", run_id="r-1")
    ok(client, "working_memory.set", block_key="session-note", content="session only",
       session_id="s-1")
    ok(client, "working_memory.set", block_key="other-run", content="not this run",
       session_id="s-1", run_id="r-2")
    ok(client, "memory.set", key="policy", value="Refunds need a ticket id")
    model.script({"answer": "Check the ticket.", "citations": []})
    out = ok(client, "memory.ask", query="refund policy", session_id="s-1", run_id="r-1",
             read_scope="own_user")
    assert [(b["layer"], b["block_key"]) for b in out["run_blocks"]] == [("run", "plan")]
    prompt = prompt_of(model.completion_requests[0])
    assert "step 2: refund check" in prompt
    assert "session only" not in prompt and "not this run" not in prompt


def test_without_a_run_no_block_reaches_the_prompt(client, model):
    ok(client, "working_memory.set", block_key="plan", content="secret plan", run_id="r-1",
       session_id="s-1")
    ok(client, "memory.set", key="policy", value="Refunds need a ticket id")
    model.script({"answer": "A ticket id.", "citations": []})
    out = ok(client, "memory.ask", query="refund policy", read_scope="own_user")
    assert out["run_blocks"] == []
    assert "secret plan" not in prompt_of(model.completion_requests[0])


def test_nothing_found_makes_no_model_call(client, model):
    out = ok(client, "memory.ask", query="anything about volcanoes", read_scope="own_user")
    assert out["answer"] is None and out["model_called"] is False and out["hits"] == []
    assert model.completion_requests == []
    assert ledger(client)["model_calls"] == 0


def test_profile_rows_and_other_users_facts_stay_out_of_the_prompt(client, model):
    ok(client, "profile.set", label="persona", value="invoices are sacred")
    ok(client, "memory.set", key="theirs", value="invoices in USD", user_id="u-7")
    mine = ok(client, "memory.set", key="mine", value="invoices in CHF")["memory_id"]
    model.script({"answer": "CHF.", "citations": [mine]})
    ok(client, "memory.ask", query="invoices", read_scope="own_user")
    assert [fact["id"] for fact in prompt_facts(model.completion_requests[0])] == [mine]


# --- read scope ceilings -------------------------------------------------------------------------


def test_a_token_pinned_to_one_user_cannot_ask_about_another(app_factory, model):
    client = auth_app(app_factory, llm_base_url=model.base_url,
                      llm_model="scripted-model").test_client()
    admin = bearer(ADMIN_TOKEN)
    mine = ok(client, "memory.set", admin, key="mine", value="violin lessons on Monday",
              user_id="u1")["memory_id"]
    ok(client, "memory.set", admin, key="theirs", value="violin repair on Friday",
       user_id="u2")
    pinned = bearer(mint(client, namespace="support", role="viewer", read_user_id="u1"))
    status, out = call(client, "memory.ask", pinned, query="violin", user_id="u2")
    assert status == 403, out
    status, out = call(client, "memory.ask", pinned, query="violin", read_scope="namespace",
                       user_id="u1")
    assert status == 403 and list(out["error"]["fields"]) == ["read_scope"]
    assert model.completion_requests == []
    model.script({"answer": "Monday.", "citations": [mine]})
    status, out = call(client, "memory.ask", pinned, query="violin", user_id="u1")
    assert status == 200, out
    assert out["read_scope"] == "own_user" and out["citations"] == [mine]
    assert [fact["id"] for fact in prompt_facts(model.completion_requests[0])] == [mine]


def test_a_run_outside_the_read_scope_brings_no_blocks(app_factory, model):
    client = auth_app(app_factory, llm_base_url=model.base_url,
                      llm_model="scripted-model").test_client()
    admin = bearer(ADMIN_TOKEN)
    ok(client, "working_memory.set", admin, block_key="plan", content="other session plan",
       session_id="s-2", run_id="r-1", user_id="u1")
    ok(client, "memory.set", admin, key="fact", value="plan the trip", user_id="u1")
    session_token = bearer(mint(client, namespace="support", role="viewer",
                                read_user_id="u1", session_id="s-1"))
    status, out = call(client, "memory.ask", session_token, query="plan", user_id="u1",
                       session_id="s-2", run_id="r-1")
    assert status == 403, out


# --- model calls off -----------------------------------------------------------------------------


def test_no_model_configured_is_409_model_calls_off(app_factory):
    client = app_factory().test_client()
    ok(client, "memory.set", key="currency", value="Invoices in EUR")
    status, out = call(client, "memory.ask", query="currency")
    assert status == 409 and out["error"]["code"] == "MODEL_CALLS_OFF"
    assert out["error"]["reason"] == "no_model"


def test_model_calls_off_for_the_org_is_409_and_no_call(client, model):
    ok(client, "memory.set", key="currency", value="Invoices in EUR")
    ok(client, "org.set_model_calls", enabled=False)
    status, out = call(client, "memory.ask", query="currency")
    assert status == 409 and out["error"]["reason"] == "org_off"
    assert model.completion_requests == []


# --- budget and ledger ---------------------------------------------------------------------------


def test_a_call_is_counted_in_the_ledger_and_the_budget(client, model):
    eur = ok(client, "memory.set", key="currency", value="Invoices in EUR")["memory_id"]
    model.script({"answer": "EUR.", "citations": [eur]}, prompt_tokens=120,
                 completion_tokens=8)
    out = ok(client, "memory.ask", query="currency")
    assert out["usage"] == {"prompt_tokens": 120, "completion_tokens": 8}
    counted = ledger(client)
    assert (counted["model_calls"], counted["prompt_tokens"], counted["completion_tokens"]) == (
        1, 120, 8)
    usage = ok(client, "usage.get")
    assert usage["model_calls"] == 1 and usage["by_worker"]["memory_ask"]["model_calls"] == 1
    budget = client.post("/v1/budget.get", json={"namespace": "support"}).get_json()
    # The reservation was settled with what the model reported.
    assert budget["spent_calls"] == 1
    assert budget["spent_tokens"] == 128


def test_a_call_past_the_budget_is_429_and_not_made(client, model):
    ok(client, "memory.set", key="currency", value="Invoices in EUR")
    assert client.post("/v1/budget.set", json={"namespace": "support", "calls": 1}
                       ).status_code == 200
    model.script({"answer": "EUR.", "citations": []})
    ok(client, "memory.ask", query="currency")
    status, out = call(client, "memory.ask", query="currency")
    assert status == 429 and out["error"]["code"] == "MODEL_BUDGET_EXCEEDED"
    assert out["error"]["budget"] == "namespace"
    assert len(model.completion_requests) == 1
    assert ledger(client)["deferred_for_budget"] == 1


def test_the_org_budget_refuses_too(client, model):
    ok(client, "memory.set", key="currency", value="Invoices in EUR")
    assert client.post("/v1/budget.set", json={"namespace": "*", "tokens": 10}
                       ).status_code == 200
    status, out = call(client, "memory.ask", query="currency")
    assert status == 429 and out["error"]["budget"] == "org"
    assert model.completion_requests == []


def test_concurrent_asks_never_pass_the_budget(app_factory, model):
    app = model_app(app_factory, model)
    setup = app.test_client()
    ok(setup, "memory.set", key="currency", value="Invoices in EUR")
    assert setup.post("/v1/budget.set", json={"namespace": "support", "calls": 3}
                      ).status_code == 200
    model.default = {"answer": "EUR.", "citations": []}
    statuses: list[int] = []
    lock = threading.Lock()

    def asker() -> None:
        status, _ = call(app.test_client(), "memory.ask", query="currency")
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=asker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [200] * 3 + [429] * 5
    assert len(model.completion_requests) == 3


# --- failures ------------------------------------------------------------------------------------


def test_a_model_server_error_is_502_counted_as_a_failure_and_released(client, model):
    ok(client, "memory.set", key="currency", value="Invoices in EUR")
    model.script(status=500, body={"error": {"message": "boom"}})
    status, out = call(client, "memory.ask", query="currency")
    assert status == 502 and out["error"]["code"] == "MODEL_CALL_FAILED"
    assert out["error"]["model_status"] == 500
    counted = ledger(client)
    assert counted["model_calls"] == 1 and counted["failures"] == 1
    budget = client.post("/v1/budget.get", json={"namespace": "support"}).get_json()
    assert budget["spent_calls"] == 0  # released: nothing was reported


def test_an_answer_without_its_text_is_502(client, model):
    ok(client, "memory.set", key="currency", value="Invoices in EUR")
    model.script({"reply": "EUR"})
    status, out = call(client, "memory.ask", query="currency")
    assert status == 502 and out["error"]["code"] == "MODEL_CALL_FAILED"


def test_a_slow_model_is_a_504_after_the_ask_timeout(app_factory, model):
    client = model_app(app_factory, model, ask_timeout_seconds=1).test_client()
    ok(client, "memory.set", key="currency", value="Invoices in EUR")
    # Never answered (until the server closes): the ask's own timeout ends the call.
    model.script({"answer": "late", "citations": []}, gate=threading.Event())
    status, out = call(client, "memory.ask", query="currency")
    assert status == 504 and out["error"]["code"] == "MODEL_TIMEOUT"
    assert out["error"]["timeout_seconds"] == 1
    assert ledger(client)["failures"] == 1


def test_an_answer_cut_off_at_the_cap_keeps_what_was_written(client, model):
    eur = ok(client, "memory.set", key="currency", value="Invoices in EUR")["memory_id"]
    model.script('{"answer": "Invoices go out in E', finish_reason="length")
    out = ok(client, "memory.ask", query="currency")
    assert out["cut_off"] is True and out["answer"] == "Invoices go out in E"
    assert out["citations"] == [] and eur in [hit["memory_id"] for hit in out["hits"]]


@pytest.mark.parametrize("body, field", [
    ({}, "query"),
    ({"query": ""}, "query"),
    ({"query": "x", "limit": 0}, "limit"),
    ({"query": "x", "limit": 101}, "limit"),
    ({"query": "x", "read_scope": "everyone"}, "read_scope"),
])
def test_bad_input_is_422_naming_the_field_and_calls_no_model(client, model, body, field):
    status, out = call(client, "memory.ask", **body)
    assert status == 422 and field in out["error"]["fields"]
    assert model.completion_requests == []


def test_the_sdk_never_sends_a_budget_refusal_again_but_does_a_rate_limit():
    refused = sdk_errors.error_from_answer(
        429, {"code": "MODEL_BUDGET_EXCEEDED", "message": "m", "budget": "namespace"})
    assert isinstance(refused, sdk_errors.ModelBudgetExceeded)
    assert refused.details == {"budget": "namespace"} and not retriable("read", refused)
    limited = sdk_errors.error_from_answer(429, {"code": "RATE_LIMITED", "message": "m"})
    assert retriable("read", limited)
    timed_out = sdk_errors.error_from_answer(504, {"code": "MODEL_TIMEOUT", "message": "m"})
    assert isinstance(timed_out, sdk_errors.ModelTimeout) and not retriable("read", timed_out)
