"""The OpenAI-compatible embeddings client against the scripted model server over real HTTP."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator

import pytest

from app.model.embeddings import (
    OpenAICompatibleEmbedder,
    embedder_from_settings,
    estimate_embedding_tokens,
)
from app.model.errors import ModelCallFailed
from tests.support.model_server import ScriptedModelServer, hashed_embedding


@pytest.fixture
def srv() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(synonyms={"automobile": "car"}) as server:
        yield server


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (
        math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    )


def test_request_and_vectors(srv: ScriptedModelServer) -> None:
    with OpenAICompatibleEmbedder(srv.base_url, "sk-e", "embed-model", 5) as embedder:
        result = embedder.embed(["my car is red", "an automobile that is red", "tea at noon"],
                                purpose="document")
    (request,) = srv.embedding_requests
    assert request.path == "/v1/embeddings"
    assert request.headers["Authorization"] == "Bearer sk-e"
    assert request.body["model"] == "embed-model"
    assert request.body["input"] == ["my car is red", "an automobile that is red", "tea at noon"]
    assert "dimensions" not in request.body  # only sent when asked for
    assert result.calls == 1
    assert result.prompt_tokens == 4 + 5 + 3
    assert result.model == "embed-model"
    car, automobile, tea = result.vectors
    assert len(car) == 256
    # The synonym makes the vector leg see meaning the words do not share.
    assert cosine(car, automobile) > 0.5
    assert abs(cosine(car, tea)) < 0.3


def test_batches_keep_order_and_sum_tokens(srv: ScriptedModelServer) -> None:
    texts = [f"text number {i}" for i in range(7)]
    with OpenAICompatibleEmbedder(srv.base_url, None, "m", 5, batch_size=3) as embedder:
        result = embedder.embed(texts, purpose="document")
    assert [len(r.body["input"]) for r in srv.embedding_requests] == [3, 3, 1]
    assert "Authorization" not in srv.embedding_requests[0].headers
    assert result.calls == 3
    assert result.prompt_tokens == 7 * 3
    assert result.vectors == [hashed_embedding(text) for text in texts]


def test_dimensions_are_asked_and_checked(srv: ScriptedModelServer) -> None:
    with OpenAICompatibleEmbedder(srv.base_url, None, "m", 5, dimensions=32) as embedder:
        (vector,) = embedder.embed(["short"], purpose="document").vectors
    assert srv.embedding_requests[0].body["dimensions"] == 32
    assert len(vector) == 32
    srv.script_embedding(body={"data": [{"index": 0, "embedding": [0.1, 0.2]}]})
    with OpenAICompatibleEmbedder(srv.base_url, None, "m", 5, dimensions=32) as embedder:
        with pytest.raises(ModelCallFailed, match="2 dimensions, not 32"):
            embedder.embed(["short"], purpose="document")


def test_answer_out_of_order_is_put_back_in_order(srv: ScriptedModelServer) -> None:
    srv.script_embedding(body={"data": [{"index": 1, "embedding": [0.0, 1.0]},
                                        {"index": 0, "embedding": [1.0, 0.0]}]})
    with OpenAICompatibleEmbedder(srv.base_url, None, "m", 5) as embedder:
        result = embedder.embed(["a", "b"], purpose="document")
    assert result.vectors == [[1.0, 0.0], [0.0, 1.0]]
    assert result.prompt_tokens is None  # the server reported no usage


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (500, None, "HTTP 500"),
        (429, None, "HTTP 429"),
        (200, "not json at all", "not JSON"),
        (200, {"data": []}, "does not hold 2 embeddings"),
        (200, {"data": [{"index": 0, "embedding": [1]}, {"index": 0, "embedding": [1]}]},
         "item 1 is not an embedding"),
        (200, {"data": [{"index": 0, "embedding": ["x"]}, {"index": 1, "embedding": [1]}]},
         "item 0 is not an embedding"),
        (200, {"data": [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [1.0, 2]}]},
         "different lengths"),
    ],
)
def test_failures_are_model_call_failed(
    srv: ScriptedModelServer, status: int, body: object, message: str
) -> None:
    srv.script_embedding(status=status, body=body)
    with OpenAICompatibleEmbedder(srv.base_url, None, "m", 5) as embedder:
        with pytest.raises(ModelCallFailed, match=message) as caught:
            embedder.embed(["a", "b"], purpose="document")
    if status != 200:
        assert caught.value.status == status


def test_unreachable_and_slow_servers_fail_as_model_calls(srv: ScriptedModelServer) -> None:
    srv.script_embedding(gate=threading.Event())  # never set: no answer until the server closes
    with OpenAICompatibleEmbedder(srv.base_url, None, "m", 0.2) as embedder:
        with pytest.raises(ModelCallFailed, match="did not answer"):
            embedder.embed(["a"], purpose="document")
    with OpenAICompatibleEmbedder("http://127.0.0.1:9/v1", None, "m", 1) as embedder:
        with pytest.raises(ModelCallFailed, match="could not reach"):
            embedder.embed(["a"], purpose="document")


def test_from_settings(srv: ScriptedModelServer) -> None:
    assert embedder_from_settings("", "k", "m", 5) is None
    assert embedder_from_settings(srv.base_url, "k", " ", 5) is None
    embedder = embedder_from_settings(srv.base_url + "/", " ", "m", 7, 0, 16)
    assert embedder is not None
    assert (embedder.url, embedder.dimensions, embedder.batch_size) == (
        srv.base_url + "/embeddings", None, 16)
    embedder.close()


def test_estimate_is_at_least_what_is_charged() -> None:
    assert estimate_embedding_tokens(["", "abc", "abcd"]) == 1 + 2 + 2
