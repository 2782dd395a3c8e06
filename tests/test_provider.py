"""The OpenAI-compatible provider against a scripted model server over real HTTP."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from app.model.chat import (
    LLM_MAX_TOKENS,
    MODE_JSON_OBJECT,
    MODE_JSON_SCHEMA,
    MODE_PROMPT,
    Completion,
    ModelProvider,
    OpenAICompatibleProvider,
    base_max_tokens,
    parse_json_object,
    parse_max_tokens_overrides,
    provider_from_settings,
)
from app.model.errors import ModelCallFailed
from app.profile_schema import max_tokens_for
from tests.support.model_server import ScriptedAnswer, ScriptedModelServer

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "preferred_name": {"type": "string", "description": "What the user asks to be called"},
        "languages": {"type": "array", "items": {"type": "string"}, "description": "Languages"},
    },
}
MESSAGES = [
    {"role": "system", "content": "Build the user's profile from their facts."},
    {"role": "user", "content": "Facts: the user is called Sam and speaks en, de."},
]
ANSWER = {"preferred_name": "Sam", "languages": ["en", "de"]}


@pytest.fixture
def srv() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer() as server:
        yield server


@pytest.fixture
def provider(srv: ScriptedModelServer) -> Iterator[OpenAICompatibleProvider]:
    with OpenAICompatibleProvider(srv.base_url, "sk-test", "test-model", 5) as p:
        yield p


def ask(provider: ModelProvider, max_tokens: int = 100) -> Completion:
    return provider.complete(MESSAGES, max_tokens=max_tokens, json_schema=SCHEMA)


# --- the request -----------------------------------------------------------------------------


def test_request_fields(srv: ScriptedModelServer, provider: OpenAICompatibleProvider) -> None:
    srv.script(ANSWER, prompt_tokens=11, completion_tokens=7)
    completion = provider.complete(
        MESSAGES,
        max_tokens=max_tokens_for(SCHEMA),
        json_schema=SCHEMA,
        schema_name="structured profile!",
    )

    assert completion.data == ANSWER
    assert json.loads(completion.text) == ANSWER
    assert completion.finish_reason == "stop"
    assert completion.cut_off is False
    assert (completion.prompt_tokens, completion.completion_tokens) == (11, 7)
    assert completion.mode == MODE_JSON_SCHEMA

    [request] = srv.requests
    assert request.method == "POST"
    assert request.path == "/v1/chat/completions"
    assert request.headers["Authorization"] == "Bearer sk-test"
    assert request.headers["Content-Type"] == "application/json"
    assert request.body == {
        "model": "test-model",
        "messages": MESSAGES,
        "max_tokens": max_tokens_for(SCHEMA),
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "structured_profile_", "schema": SCHEMA, "strict": False},
        },
    }


def test_base_url_with_trailing_slash(srv: ScriptedModelServer) -> None:
    srv.script(ANSWER)
    with OpenAICompatibleProvider(srv.base_url + "/", "k", "m", 5) as p:
        assert ask(p).data == ANSWER
    assert srv.requests[0].path == "/v1/chat/completions"


def test_no_api_key_sends_no_authorization(srv: ScriptedModelServer) -> None:
    srv.script(ANSWER)
    with OpenAICompatibleProvider(srv.base_url, None, "m", 5) as p:
        ask(p)
    assert "Authorization" not in srv.requests[0].headers


def test_usage_is_reported(srv: ScriptedModelServer, provider: OpenAICompatibleProvider) -> None:
    srv.script(ANSWER)
    completion = ask(provider)
    assert completion.prompt_tokens is not None and completion.prompt_tokens > 0
    assert completion.completion_tokens is not None and completion.completion_tokens > 0


def test_default_answer_sees_the_request() -> None:
    with ScriptedModelServer(default=lambda body: {"echo": body["max_tokens"]}) as srv:
        with OpenAICompatibleProvider(srv.base_url, "k", "m", 5) as p:
            assert ask(p, max_tokens=77).data == {"echo": 77}
            srv.default = ScriptedAnswer(content="{}", finish_reason="length")
            assert ask(p).cut_off is True


def test_plain_text_call_sends_no_response_format(
    srv: ScriptedModelServer, provider: OpenAICompatibleProvider
) -> None:
    srv.script("Terse. Prefers EUR invoices.")
    completion = provider.complete(MESSAGES, max_tokens=48, expect_json=False)
    assert completion.text == "Terse. Prefers EUR invoices."
    assert completion.data is None
    assert "response_format" not in srv.requests[0].body
    assert srv.requests[0].body["messages"] == MESSAGES


def test_without_a_schema_json_object_is_asked(
    srv: ScriptedModelServer, provider: OpenAICompatibleProvider
) -> None:
    srv.script({"ok": True})
    assert provider.complete(MESSAGES, max_tokens=10).data == {"ok": True}
    assert srv.requests[0].response_format_type == "json_object"
    # That says nothing about json_schema, which the next call still tries first.
    assert provider.mode == MODE_JSON_SCHEMA


# --- falling back when the server refuses response_format ------------------------------------


def test_json_schema_refused_falls_back_to_json_object_and_remembers(
    srv: ScriptedModelServer, provider: OpenAICompatibleProvider
) -> None:
    srv.script(ANSWER, refuse_response_format=True)
    completion = ask(provider)
    assert completion.data == ANSWER
    assert completion.mode == MODE_JSON_OBJECT
    assert [r.response_format_type for r in srv.requests] == ["json_schema", "json_object"]
    assert provider.mode == MODE_JSON_OBJECT
    # json_object servers want the word JSON in the messages, and the schema has to be there.
    extra = srv.requests[1].body["messages"][-1]
    assert extra["role"] == "system"
    assert "JSON" in extra["content"] and "preferred_name" in extra["content"]
    assert srv.requests[1].body["messages"][:-1] == MESSAGES

    srv.script(ANSWER)
    ask(provider)
    assert [r.response_format_type for r in srv.requests][2:] == ["json_object"]


def test_both_refused_falls_back_to_prompt_only_and_remembers() -> None:
    with ScriptedModelServer(refuse_response_formats={"json_schema", "json_object"}) as srv:
        with OpenAICompatibleProvider(srv.base_url, "k", "m", 5) as p:
            srv.script(ANSWER)
            completion = ask(p)
            assert completion.data == ANSWER
            assert completion.mode == MODE_PROMPT
            assert [r.response_format_type for r in srv.requests] == [
                "json_schema",
                "json_object",
                None,
            ]
            assert "response_format" not in srv.requests[2].body
            assert "preferred_name" in srv.requests[2].body["messages"][-1]["content"]
            assert p.mode == MODE_PROMPT

            srv.script(ANSWER)
            ask(p)
            assert len(srv.requests) == 4
            assert srv.requests[3].response_format_type is None


def test_prompt_only_answer_in_a_markdown_fence_is_read() -> None:
    with ScriptedModelServer(refuse_response_formats={"json_schema", "json_object"}) as srv:
        with OpenAICompatibleProvider(srv.base_url, "k", "m", 5) as p:
            srv.script("Here you go:\n```json\n" + json.dumps(ANSWER) + "\n```")
            assert ask(p).data == ANSWER


def test_a_422_is_a_refusal(srv: ScriptedModelServer, provider: OpenAICompatibleProvider) -> None:
    srv.script(status=422, body={"detail": [{"loc": ["body", "x"], "msg": "bad"}]})
    srv.script(ANSWER)
    assert ask(provider).data == ANSWER
    assert [r.response_format_type for r in srv.requests] == ["json_schema", "json_object"]


def test_another_4xx_naming_response_format_is_a_refusal(
    srv: ScriptedModelServer, provider: OpenAICompatibleProvider
) -> None:
    srv.script(status=415, body={"error": {"message": "unknown field response_format"}})
    srv.script(ANSWER)
    assert ask(provider).data == ANSWER
    assert len(srv.requests) == 2


@pytest.mark.parametrize("status", [401, 403, 404, 429])
def test_other_4xx_fail_without_falling_back(
    srv: ScriptedModelServer, provider: OpenAICompatibleProvider, status: int
) -> None:
    srv.script(status=status, body={"error": {"message": "no"}})
    with pytest.raises(ModelCallFailed) as caught:
        ask(provider)
    assert caught.value.status == status
    assert len(srv.requests) == 1
    assert provider.mode == MODE_JSON_SCHEMA


def test_a_failure_after_refusals_is_not_remembered(
    srv: ScriptedModelServer, provider: OpenAICompatibleProvider
) -> None:
    for _ in range(3):
        srv.script(status=400, body={"error": {"message": "prompt is too long"}})
    with pytest.raises(ModelCallFailed) as caught:
        ask(provider)
    assert caught.value.status == 400
    assert len(srv.requests) == 3
    assert provider.mode == MODE_JSON_SCHEMA


# --- answers that are not usable -------------------------------------------------------------


def test_finish_reason_length_is_a_cut_off_not_an_error(
    srv: ScriptedModelServer, provider: OpenAICompatibleProvider
) -> None:
    srv.script('{"preferred_name": "Sa', finish_reason="length")
    completion = ask(provider, max_tokens=5)
    assert completion.cut_off is True
    assert completion.finish_reason == "length"
    assert completion.data is None
    assert completion.text == '{"preferred_name": "Sa'


@pytest.mark.parametrize("content", ["I cannot help with that.", "[1, 2]", '"Sam"', ""])
def test_an_answer_that_is_not_a_json_object_fails(
    srv: ScriptedModelServer, provider: OpenAICompatibleProvider, content: str
) -> None:
    srv.script(content)
    with pytest.raises(ModelCallFailed, match="not a JSON object"):
        ask(provider)


def test_500_fails(srv: ScriptedModelServer, provider: OpenAICompatibleProvider) -> None:
    srv.script(status=500, body={"error": {"message": "boom"}})
    with pytest.raises(ModelCallFailed) as caught:
        ask(provider)
    assert caught.value.status == 500
    assert len(srv.requests) == 1


def test_503_without_a_body_fails(
    srv: ScriptedModelServer, provider: OpenAICompatibleProvider
) -> None:
    srv.script(status=503)
    with pytest.raises(ModelCallFailed) as caught:
        ask(provider)
    assert caught.value.status == 503


def test_a_body_that_is_not_a_completion_fails(
    srv: ScriptedModelServer, provider: OpenAICompatibleProvider
) -> None:
    srv.script(status=200, body="<html>gateway</html>")
    srv.script(status=200, body={"object": "chat.completion", "choices": []})
    with pytest.raises(ModelCallFailed, match="not JSON"):
        ask(provider)
    with pytest.raises(ModelCallFailed, match="no choices"):
        ask(provider)


class TimeoutRecordingSession(requests.Session):
    """A real session that notes the timeout each request was sent with."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[Any] = []

    def request(self, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        self.timeouts.append(kwargs.get("timeout"))
        return super().request(*args, **kwargs)


def test_timeout_fails(srv: ScriptedModelServer) -> None:
    """A server that takes the request and never answers: the call fails as a timeout, the
    read timeout it was sent with being the provider's setting, after that one request."""
    srv.script(ANSWER, gate=threading.Event())  # never set: no answer until the server closes
    session = TimeoutRecordingSession()
    with OpenAICompatibleProvider(srv.base_url, "k", "m", 0.3, session=session) as p:
        with pytest.raises(ModelCallFailed, match="did not answer within 0.3s") as caught:
            ask(p)
    assert caught.value.timed_out and caught.value.status is None
    assert isinstance(caught.value.__cause__, requests.ReadTimeout)
    assert session.timeouts == [0.3]
    assert len(srv.completion_requests) == 1  # no second try of its own: the job retries


def test_connection_refused_fails() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with OpenAICompatibleProvider(f"http://127.0.0.1:{port}/v1", "k", "m", 2) as p:
        with pytest.raises(ModelCallFailed, match="could not reach"):
            ask(p)


def test_parse_json_object() -> None:
    assert parse_json_object('{"a": 1}') == {"a": 1}
    assert parse_json_object('  ```\n{"a": 1}\n```  ') == {"a": 1}
    assert parse_json_object('Sure! {"a": {"b": 2}} Hope that helps.') == {"a": {"b": 2}}
    assert parse_json_object("[1]") is None
    assert parse_json_object("{not json}") is None


# --- the scripted server itself --------------------------------------------------------------


def test_server_records_concurrent_requests(srv: ScriptedModelServer) -> None:
    srv.default = lambda body: {"n": body["max_tokens"]}
    results: list[Any] = []
    lock = threading.Lock()

    def call(n: int) -> None:
        with OpenAICompatibleProvider(srv.base_url, "k", "m", 5) as p:
            data = ask(p, max_tokens=n).data
        with lock:
            results.append(data)

    threads = [threading.Thread(target=call, args=(n,)) for n in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r["n"] for r in results) == list(range(1, 9))
    assert sorted(r.body["max_tokens"] for r in srv.requests) == list(range(1, 9))
    assert srv.pending() == 0


def test_server_answers_unknown_paths_with_404(srv: ScriptedModelServer) -> None:
    assert requests.post(srv.base_url + "/rerank", json={}, timeout=5).status_code == 404
    models = requests.get(srv.base_url + "/models", timeout=5).json()
    assert models["data"][0]["id"] == srv.model
    assert [(r.method, r.path) for r in srv.requests] == [
        ("POST", "/v1/rerank"),
        ("GET", "/v1/models"),
    ]


# --- settings --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base_url", "model"),
    [("", "m"), ("http://x/v1", ""), (None, "m"), ("http://x/v1", None), ("  ", " ")],
)
def test_model_calls_are_off_without_base_url_or_model(
    base_url: str | None, model: str | None
) -> None:
    assert provider_from_settings(base_url, "k", model, 30) is None


def test_provider_from_settings(srv: ScriptedModelServer) -> None:
    provider = provider_from_settings(srv.base_url, "sk-x", "test-model", 7)
    assert isinstance(provider, OpenAICompatibleProvider)
    assert provider.timeout_seconds == 7
    srv.script(ANSWER)
    with provider:
        assert ask(provider).data == ANSWER
    assert srv.requests[0].headers["Authorization"] == "Bearer sk-x"
    assert srv.requests[0].body["model"] == "test-model"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, {}),
        ("", {}),
        ("   ", {}),
        (
            "structured_profile=64,consolidated_profile=48",
            {"structured_profile": 64, "consolidated_profile": 48},
        ),
        (" structured_profile = 64 , ", {"structured_profile": 64}),
        (
            '{"structured_profile": 64, "consolidated_profile": 48}',
            {"structured_profile": 64, "consolidated_profile": 48},
        ),
        ('{"structured_profile": "64"}', {"structured_profile": 64}),
        ("{}", {}),
    ],
)
def test_parse_max_tokens_overrides(text: str | None, expected: dict[str, int]) -> None:
    assert parse_max_tokens_overrides(text) == expected


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("structured_profile", "structured_profile"),
        ("structured_profile=abc", "structured_profile"),
        ("structured_profile=0", "structured_profile"),
        ("structured_profile=-5", "structured_profile"),
        ("structured_profile=6.5", "structured_profile"),
        ("=64", "''"),
        ("a b=3", "a b"),
        ("structured_profile=64,structured_profile=32", "twice"),
        ('{"structured_profile": true}', "structured_profile"),
        ('{"structured_profile": 6.5}', "structured_profile"),
        ('{"structured_profile": 64', "not valid JSON"),
        ('{"": 64}', "''"),
        ('["structured_profile"]', "is not of the form"),
    ],
)
def test_bad_overrides_name_the_problem(text: str, named: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_max_tokens_overrides(text)
    assert "LOOM_LLM_MAX_TOKENS_OVERRIDES" in str(caught.value)
    assert named in str(caught.value)


def test_base_max_tokens_uses_the_override() -> None:
    overrides = parse_max_tokens_overrides("structured_profile=64")
    assert base_max_tokens("structured_profile", overrides) == 64
    assert base_max_tokens("consolidated_profile", overrides) == LLM_MAX_TOKENS == 32
    assert base_max_tokens("structured_profile") == 32
    assert max_tokens_for(SCHEMA, base_max_tokens("structured_profile", overrides)) == (
        64 + max_tokens_for(SCHEMA) - 32
    )


def test_a_given_requests_session_is_used_and_left_open(srv: ScriptedModelServer) -> None:
    http = requests.Session()
    http.headers["X-Loom-Test"] = "1"
    srv.script(ANSWER)
    with OpenAICompatibleProvider(srv.base_url, "k", "m", 5, session=http) as p:
        assert ask(p).data == ANSWER
    assert srv.requests[0].headers["X-Loom-Test"] == "1"
    srv.script(ANSWER)
    assert http.post(srv.base_url + "/chat/completions", json={}, timeout=5).status_code == 200
    http.close()
