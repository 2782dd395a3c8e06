"""The chat client: how Loom asks a model for an answer, in a worker or in ``memory.ask``.

This module owns the one interface the callers use (``ModelProvider.complete``), its
OpenAI-compatible implementation over ``requests`` (OpenAI, vLLM, Ollama, llama.cpp server,
LM Studio all speak ``POST {base_url}/chat/completions``), the settings that turn model calls on
or off, and the per-task output-cap base (``LLM_MAX_TOKENS`` and its overrides).

The embeddings client is its sibling (app/model/embeddings.py); the budgets and the ledger
every call goes through are app/model/budget.py.

Failures, drawn as a hierarchy::

    Exception
     +-- ModelCallFailed      connection error, timeout, 5xx, a refused request, an answer
                              that is not a chat completion, or content that is not a JSON
                              object (unless the model was cut off at max_tokens); for
                              embeddings, an answer without one vector per text

A cut-off answer is not an error: it comes back as a ``Completion`` with ``cut_off`` set, so the
worker can treat it as the seed says (not retried until something changes).
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import requests

from app.model.errors import ModelCallFailed
from app.model.http import OpenAICompatibleClient, int_or_none, snippet
from app.profile_schema import DEFAULT_BASE_TOKENS

# The seed's base output allowance for a model-written entry, before a schema's estimate (the
# profile schemas' estimate adds its own to the same number).
LLM_MAX_TOKENS = DEFAULT_BASE_TOKENS

# Ways of asking for JSON, strongest first. A server that refuses one is asked the next way.
MODE_JSON_SCHEMA = "json_schema"
MODE_JSON_OBJECT = "json_object"
MODE_PROMPT = "prompt"
RESPONSE_MODES = (MODE_JSON_SCHEMA, MODE_JSON_OBJECT, MODE_PROMPT)

# OpenAI's rule for a json_schema name; other servers accept at least this.
_SCHEMA_NAME_RE = re.compile(r"[^A-Za-z0-9_-]")
_FENCE_RE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n?(.*?)\n?```$", re.DOTALL)
_OVERRIDE_NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]+$")


@dataclass(frozen=True)
class Completion:
    """One model answer: the parsed JSON object (or None), the raw text, and what it cost."""

    data: dict[str, Any] | None
    text: str
    finish_reason: str | None
    cut_off: bool
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    mode: str = MODE_JSON_SCHEMA


class ModelProvider(ABC):
    """What a worker needs from a model: messages in, one (JSON) answer out."""

    @abstractmethod
    def complete(
        self,
        messages: list[dict[str, str]],
        *,
        max_tokens: int,
        json_schema: dict[str, Any] | None = None,
        schema_name: str = "structured_profile",
        expect_json: bool = True,
    ) -> Completion:
        """Ask for one answer of at most ``max_tokens`` tokens.

        With ``json_schema`` the answer is asked to follow it; with ``expect_json`` an answer
        that is not a JSON object (and was not cut off) raises ``ModelCallFailed``.
        """

    def close(self) -> None:  # noqa: B027 optional hook, most providers hold nothing
        """Release whatever the provider holds (connections)."""


class _Refused(Exception):
    """The server refused the way JSON was asked for; the next mode may work."""


class OpenAICompatibleProvider(OpenAICompatibleClient, ModelProvider):
    """``POST {base_url}/chat/completions`` with ``response_format`` and ``max_tokens``.

    JSON is asked for as ``json_schema`` first. Many self-hosted servers refuse that (or
    ``json_object``) with a 400/422; each refusal falls back one step, ending with the schema in
    the prompt only. The mode that last worked is remembered per instance, so a server that
    refuses json_schema costs one extra request, not one per call.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        model: str,
        timeout_seconds: float,
        session: requests.Session | None = None,
    ) -> None:
        super().__init__(base_url, "chat/completions", api_key, model, timeout_seconds, session)
        self._mode_index = 0

    @property
    def mode(self) -> str:
        """The response mode the next call starts with."""
        return RESPONSE_MODES[self._mode_index]

    def complete(
        self,
        messages: list[dict[str, str]],
        *,
        max_tokens: int,
        json_schema: dict[str, Any] | None = None,
        schema_name: str = "structured_profile",
        expect_json: bool = True,
    ) -> Completion:
        if not expect_json:
            return self._call(messages, max_tokens, None, MODE_PROMPT, expect_json=False)
        # Without a schema there is nothing to send as json_schema; json_object is the best ask.
        first = self._mode_index if json_schema is not None else max(self._mode_index, 1)
        last_refusal: _Refused | None = None
        for index in range(first, len(RESPONSE_MODES)):
            mode = RESPONSE_MODES[index]
            try:
                completion = self._call(
                    self._messages_for(messages, mode, json_schema),
                    max_tokens,
                    self._response_format(mode, json_schema, schema_name),
                    mode,
                    expect_json=True,
                )
            except _Refused as refusal:
                last_refusal = refusal
                continue
            # Remember only what worked: a 400 for another reason (a prompt too long) that ends
            # in a failure must not downgrade every later call for good. A call without a schema
            # that got through as json_object says nothing about json_schema, so it is kept
            # only when json_object itself was refused.
            if json_schema is not None or index == len(RESPONSE_MODES) - 1:
                self._mode_index = index
            return completion
        raise ModelCallFailed(
            f"the model server refused every response mode: {last_refusal}", status=400
        )

    # -- request building ---------------------------------------------------------------------

    @staticmethod
    def _response_format(
        mode: str, json_schema: dict[str, Any] | None, schema_name: str
    ) -> dict[str, Any] | None:
        if mode == MODE_JSON_SCHEMA and json_schema is not None:
            name = _SCHEMA_NAME_RE.sub("_", schema_name)[:64] or "answer"
            # strict mode would demand every property be required; a profile schema has no
            # required (unknown values are null), so the schema is a guide, and Loom checks
            # the answer itself afterwards.
            return {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": json_schema, "strict": False},
            }
        if mode == MODE_JSON_OBJECT:
            return {"type": "json_object"}
        return None

    @staticmethod
    def _messages_for(
        messages: list[dict[str, str]], mode: str, json_schema: dict[str, Any] | None
    ) -> list[dict[str, str]]:
        if mode == MODE_JSON_SCHEMA and json_schema is not None:
            return list(messages)
        # json_object servers (OpenAI among them) require the word JSON in the messages, and in
        # prompt-only mode the schema reaches the model only through the text.
        instruction = "Reply with one JSON object and nothing else."
        if json_schema is not None:
            instruction += " It must follow this JSON Schema: " + json.dumps(
                json_schema, separators=(",", ":"), ensure_ascii=False
            )
        return [*messages, {"role": "system", "content": instruction}]

    # -- one HTTP exchange --------------------------------------------------------------------

    def _call(
        self,
        messages: list[dict[str, str]],
        max_tokens: int,
        response_format: dict[str, Any] | None,
        mode: str,
        *,
        expect_json: bool,
    ) -> Completion:
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": max_tokens}
        if response_format is not None:
            body["response_format"] = response_format
        try:
            response = self._session.post(
                self.url, json=body, headers=self._headers(), timeout=self.timeout_seconds
            )
        except requests.Timeout as exc:
            raise ModelCallFailed(
                f"the model server did not answer within {self.timeout_seconds}s",
                timed_out=True,
            ) from exc
        except requests.RequestException as exc:
            raise ModelCallFailed(f"could not reach the model server: {exc}") from exc

        status = response.status_code
        if status >= 500:
            raise ModelCallFailed(f"the model server failed with HTTP {status}", status=status)
        if 400 <= status < 500:
            if response_format is not None and _refuses_response_format(response):
                raise _Refused(f"HTTP {status} for response_format {response_format['type']}")
            raise ModelCallFailed(
                f"the model server refused the request with HTTP {status}: "
                f"{snippet(response.text)}",
                status=status,
            )
        if status != 200:
            raise ModelCallFailed(f"unexpected HTTP {status} from the model server", status=status)
        return _read_completion(response, mode, expect_json)


def _refuses_response_format(response: requests.Response) -> bool:
    # 400 and 422 are how servers say "bad parameter"; any other 4xx counts only when it names
    # the parameter, so a 401 or 429 is reported as itself instead of quietly downgrading.
    if response.status_code in (400, 422):
        return True
    text = response.text.lower()
    return any(word in text for word in ("response_format", "json_schema", "json_object"))


def _read_completion(response: requests.Response, mode: str, expect_json: bool) -> Completion:
    try:
        payload = response.json()
    except ValueError as exc:
        raise ModelCallFailed(
            f"the model server answered with something that is not JSON: {snippet(response.text)}"
        ) from exc
    try:
        choice = payload["choices"][0]
        message = choice.get("message") or {}
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ModelCallFailed("the model server's answer has no choices") from exc
    content = message.get("content") if isinstance(message, dict) else None
    text = content if isinstance(content, str) else ""
    finish_reason = choice.get("finish_reason")
    finish_reason = finish_reason if isinstance(finish_reason, str) else None
    cut_off = finish_reason == "length"
    usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}

    prompt_tokens = int_or_none(usage.get("prompt_tokens"))
    completion_tokens = int_or_none(usage.get("completion_tokens"))
    data = parse_json_object(text) if expect_json else None
    if expect_json and data is None and not cut_off:
        raise ModelCallFailed(f"the model's answer is not a JSON object: {snippet(text)}",
                              prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
    return Completion(
        data=data,
        text=text,
        finish_reason=finish_reason,
        cut_off=cut_off,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        mode=mode,
    )


# Tokens counted for each message's framing (role, separators) on top of its text.
MESSAGE_OVERHEAD_TOKENS = 4


def estimate_call_tokens(
    messages: list[dict[str, str]], max_tokens: int, json_schema: dict[str, Any] | None = None
) -> int:
    """What one call may cost at most, for a budget's reservation: the prompt at the seed's
    two characters a token (the messages and the schema, which reaches the model either in
    ``response_format`` or in the prompt), a few tokens of framing per message, and the output
    cap ``max_tokens`` the answer cannot pass."""
    chars = sum(len(str(message.get("content", ""))) for message in messages)
    if json_schema is not None:
        chars += len(json.dumps(json_schema, separators=(",", ":"), ensure_ascii=False))
    framing = MESSAGE_OVERHEAD_TOKENS * (len(messages) + 1)
    return -(-chars // 2) + framing + max_tokens


def parse_json_object(text: str) -> dict[str, Any] | None:
    """The JSON object in a model's text, or None.

    Without a response_format, models often wrap the object in a Markdown fence or a sentence;
    the fence is unwrapped and, failing that, the outermost ``{...}`` is tried.
    """
    candidates = [text.strip()]
    fenced = _FENCE_RE.match(candidates[0])
    if fenced:
        candidates.append(fenced.group(1).strip())
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


# --- settings --------------------------------------------------------------------------------


def provider_from_settings(
    base_url: str | None, api_key: str | None, model: str | None, timeout: float
) -> OpenAICompatibleProvider | None:
    """The configured provider, or None when model calls are off (no base URL or no model)."""
    base_url = (base_url or "").strip()
    model = (model or "").strip()
    if not base_url or not model:
        return None
    return OpenAICompatibleProvider(base_url, (api_key or "").strip() or None, model, timeout)


def parse_max_tokens_overrides(text: str | None) -> dict[str, int]:
    """Read ``LOOM_LLM_MAX_TOKENS_OVERRIDES``: ``entry=tokens`` pairs, comma separated.

    ``structured_profile=64,consolidated_profile=48`` or the JSON object
    ``{"structured_profile": 64}``. Empty text means no overrides. Each value replaces
    ``LLM_MAX_TOKENS`` for that entry and must be a positive integer; anything else raises
    ``ValueError`` naming the entry, so a typo stops the process at start instead of silently
    capping answers.
    """
    if text is None or not text.strip():
        return {}
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            raw: dict[str, Any] = json.loads(stripped)
        except ValueError as exc:
            raise ValueError(f"LOOM_LLM_MAX_TOKENS_OVERRIDES is not valid JSON: {exc}") from exc
        # Text starting with "{" that parses is always an object.
        pairs = list(raw.items())
    else:
        pairs = []
        for part in stripped.split(","):
            part = part.strip()
            if not part:
                continue  # a trailing comma is harmless
            name, sep, value = part.partition("=")
            if not sep:
                raise ValueError(
                    f"LOOM_LLM_MAX_TOKENS_OVERRIDES: {part!r} is not of the form entry=tokens"
                )
            pairs.append((name.strip(), value.strip()))

    overrides: dict[str, int] = {}
    for name, value in pairs:
        if not isinstance(name, str) or not _OVERRIDE_NAME_RE.match(name):
            raise ValueError(f"LOOM_LLM_MAX_TOKENS_OVERRIDES: {name!r} is not an entry name")
        if name in overrides:
            raise ValueError(f"LOOM_LLM_MAX_TOKENS_OVERRIDES: {name} is given twice")
        overrides[name] = _positive_int(name, value)
    return overrides


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit():
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise ValueError(
            f"LOOM_LLM_MAX_TOKENS_OVERRIDES: {name}={value!r} is not a positive integer"
        )
    if number <= 0:
        raise ValueError(f"LOOM_LLM_MAX_TOKENS_OVERRIDES: {name}={value!r} must be above 0")
    return number


def base_max_tokens(entry: str, overrides: dict[str, int] | None = None) -> int:
    """The base output allowance for an entry (``structured_profile`` ...): override or 32."""
    return (overrides or {}).get(entry, LLM_MAX_TOKENS)
