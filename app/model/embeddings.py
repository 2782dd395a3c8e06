"""The embeddings client: how Loom turns text into vectors for recall's vector leg.

``EmbeddingProvider.embed`` is the interface; ``OpenAICompatibleEmbedder`` its implementation,
``POST {base_url}/embeddings`` (OpenAI, vLLM, Ollama, llama.cpp server, LM Studio, TEI) in
batches; ``embedder_from_settings`` reads the ``LOOM_EMBED_*`` settings (off when unset). Every
failure (connection, timeout, non-200, an answer without one vector per text, vectors of the
wrong length) raises ``ModelCallFailed``, as a chat call does. The workers embed facts
(jobs/recall_embed.py); ``memory.search`` embeds its query in the request.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import requests

from app.model.errors import ModelCallFailed
from app.model.http import OpenAICompatibleClient, int_or_none, snippet

if TYPE_CHECKING:
    from app.settings import Settings


# Texts sent in one POST /embeddings; OpenAI takes 2048, self-hosted servers often far fewer.
EMBED_BATCH_SIZE = 64


@dataclass(frozen=True)
class Embeddings:
    """Vectors for a list of texts, in the texts' order, and what the calls cost in tokens."""

    vectors: list[list[float]]
    prompt_tokens: int | None
    calls: int
    model: str


class EmbeddingProvider(ABC):
    """What a worker needs to embed text: texts in, one vector per text out."""

    model: str
    dimensions: int | None

    @abstractmethod
    def embed(self, texts: list[str]) -> Embeddings:
        """One vector per text, in order; raises ``ModelCallFailed`` when any batch fails."""

    def close(self) -> None:  # noqa: B027 optional hook, most providers hold nothing
        """Release whatever the provider holds (connections)."""


class OpenAICompatibleEmbedder(OpenAICompatibleClient, EmbeddingProvider):
    """``POST {base_url}/embeddings`` with ``model``, ``input`` (a list) and, when set,
    ``dimensions`` (OpenAI's text-embedding-3 models shorten their vectors on request; other
    servers are sent nothing extra so they do not refuse an unknown field).

    Texts go ``batch_size`` to a request; the answer's ``index`` fields put the vectors back in
    the texts' order (the spec allows any order). Every vector of one call must have the same
    length, and the length ``dimensions`` when that is set.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        model: str,
        timeout_seconds: float,
        *,
        dimensions: int | None = None,
        batch_size: int = EMBED_BATCH_SIZE,
        session: requests.Session | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        super().__init__(base_url, "embeddings", api_key, model, timeout_seconds, session)
        self.dimensions = dimensions
        self.batch_size = batch_size

    def embed(self, texts: list[str]) -> Embeddings:
        vectors: list[list[float]] = []
        tokens: int | None = 0
        calls = 0
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start : start + self.batch_size]
            batch_vectors, batch_tokens = self._call(batch)
            calls += 1
            vectors.extend(batch_vectors)
            tokens = None if tokens is None or batch_tokens is None else tokens + batch_tokens
        width = {len(vector) for vector in vectors}
        if len(width) > 1:
            raise ModelCallFailed(
                f"the embeddings server answered vectors of different lengths: {sorted(width)}",
                prompt_tokens=tokens,
            )
        return Embeddings(vectors=vectors, prompt_tokens=tokens, calls=calls, model=self.model)

    def _call(self, batch: list[str]) -> tuple[list[list[float]], int | None]:
        body: dict[str, Any] = {"model": self.model, "input": batch, "encoding_format": "float"}
        if self.dimensions:
            body["dimensions"] = self.dimensions
        try:
            response = self._session.post(
                self.url, json=body, headers=self._headers(), timeout=self.timeout_seconds
            )
        except requests.Timeout as exc:
            raise ModelCallFailed(
                f"the embeddings server did not answer within {self.timeout_seconds}s"
            ) from exc
        except requests.RequestException as exc:
            raise ModelCallFailed(f"could not reach the embeddings server: {exc}") from exc
        status = response.status_code
        if status != 200:
            raise ModelCallFailed(
                f"the embeddings server answered HTTP {status}: {snippet(response.text)}",
                status=status,
            )
        return _read_embeddings(response, len(batch), self.dimensions)


def _read_embeddings(
    response: requests.Response, expected: int, dimensions: int | None
) -> tuple[list[list[float]], int | None]:
    try:
        payload = response.json()
    except ValueError as exc:
        raise ModelCallFailed(
            "the embeddings server answered with something that is not JSON: "
            f"{snippet(response.text)}"
        ) from exc
    usage = payload.get("usage") if isinstance(payload, dict) else None
    tokens = int_or_none(usage.get("prompt_tokens")) if isinstance(usage, dict) else None
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list) or len(data) != expected:
        raise ModelCallFailed(
            f"the embeddings server's answer does not hold {expected} embeddings",
            prompt_tokens=tokens,
        )
    by_index: dict[int, list[float]] = {}
    for position, item in enumerate(data):
        index = item.get("index", position) if isinstance(item, dict) else None
        vector = item.get("embedding") if isinstance(item, dict) else None
        if (
            not isinstance(index, int)
            or not 0 <= index < expected
            or index in by_index
            or not isinstance(vector, list)
            or not vector
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in vector)
        ):
            raise ModelCallFailed(
                f"the embeddings server's item {position} is not an embedding",
                prompt_tokens=tokens,
            )
        if dimensions and len(vector) != dimensions:
            raise ModelCallFailed(
                f"the embeddings server answered {len(vector)} dimensions, not {dimensions}",
                prompt_tokens=tokens,
            )
        by_index[index] = [float(x) for x in vector]
    return [by_index[i] for i in range(expected)], tokens


def estimate_embedding_tokens(texts: list[str]) -> int:
    """What embedding ``texts`` may cost at most, for a budget's reservation: the seed's two
    characters a token, at least one token a text (an embedding has no output tokens)."""
    return sum(max(1, -(-len(text) // 2)) for text in texts)


def embedder_from_settings(
    base_url: str | None,
    api_key: str | None,
    model: str | None,
    timeout: float,
    dimensions: int | None = None,
    batch_size: int = EMBED_BATCH_SIZE,
) -> OpenAICompatibleEmbedder | None:
    """The configured embeddings client, or None when embeddings are off (no base URL or no
    model); ``dimensions`` 0 or None sends none and takes the model's own length."""
    base_url = (base_url or "").strip()
    model = (model or "").strip()
    if not base_url or not model:
        return None
    return OpenAICompatibleEmbedder(
        base_url,
        (api_key or "").strip() or None,
        model,
        timeout,
        dimensions=dimensions or None,
        batch_size=batch_size,
    )


def embedder_for(settings: Settings) -> OpenAICompatibleEmbedder | None:
    """``embedder_from_settings`` over a process's ``LOOM_EMBED_*`` settings."""
    return embedder_from_settings(
        settings.embed_base_url, settings.embed_api_key, settings.embed_model,
        settings.embed_timeout_seconds, settings.embed_dimensions, settings.embed_batch_size)
