"""memory.ask (seed 000, "Unified search"): a question answered by one model call over the facts
memory.search finds, citing the memory ids it used.

Retrieval is memory.search's own (``app.ops.recall.search_rows`` with the same read scope and
filters), so a fact ask can cite is exactly one search would return. Working memory is not
recall: when the call names a ``run_id``, that run's blocks (inside the read scope) go into the
prompt beside the hits, never ranked. The model is asked for ``{"answer", "citations"}``; a
citation is kept only when it names a memory id that was in the prompt, and any other id the
model writes is dropped and listed under ``uncited_ids``, so an answer never points at a row
the caller was not shown. With no hit and no block there is nothing to answer from, and no
model call is made.

The call is made inside the request, so it is bounded by ``LOOM_ASK_TIMEOUT_SECONDS``. It runs
as every model call does: refused with 409 ``MODEL_CALLS_OFF`` when no model is configured or
the org switched calls off, reserved against the namespace's and the org's budgets before it
is made (429 ``MODEL_BUDGET_EXCEEDED`` when it would pass one), settled with what the model
reported, and counted in the ledger under the worker name ``memory_ask``. A model failure is a
502 ``MODEL_CALL_FAILED``, a timeout a 504 ``MODEL_TIMEOUT``; neither is ever a 500.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from marshmallow import Schema, fields

from app.errors import ModelBudgetExceeded, ModelCallError, ModelCallsOff, ModelTimedOut
from app.model.budget import OutOfBudget, complete_within_budget
from app.model.chat import base_max_tokens, parse_max_tokens_overrides, provider_from_settings
from app.model.errors import ModelCallFailed
from app.ops.memory import read_scope_for
from app.ops.recall import (
    MemorySearchArgs,
    ScratchpadBlock,
    SearchHit,
    search_answer,
    search_call_cost,
)
from app.profile_schema import max_tokens_for
from app.registry import Call, op
from app.schemas.common import Answer
from app.store.usage import UsageStore

log = logging.getLogger("loom.ops.ask")

# The ledger's name for these calls (usage.get by_worker) and the entry of
# LOOM_LLM_MAX_TOKENS_OVERRIDES that sizes their output cap.
USAGE_WORKER = "memory_ask"
ANSWER_MAX_CHARS = 2000
# The longest block or fact text the prompt carries; a longer one is cut with a marker, so one
# large block cannot crowd the facts out of the model's context.
PROMPT_TEXT_MAX = 4000
ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "answer": {
            "type": "string",
            "maxLength": ANSWER_MAX_CHARS,
            "description": "The answer to the question, from the facts and notes given.",
        },
        "citations": {
            "type": "array",
            "items": {"type": "string"},
            "description": "The ids of the facts the answer rests on.",
        },
    },
    "required": ["answer", "citations"],
    "additionalProperties": False,
}
_WHO = {"namespace": "support", "agent": "triage-bot", "user_id": "u-42"}
ASK_ERRORS = ("MODEL_CALLS_OFF", "MODEL_BUDGET_EXCEEDED", "MODEL_CALL_FAILED", "MODEL_TIMEOUT")


class MemoryAskArgs(MemorySearchArgs):
    pass


class MemoryAskAnswer(Answer):
    answer = fields.String(
        allow_none=True,
        metadata={"description": "The model's answer; null when nothing was found to answer "
                                 "from (no model call was made)."})
    citations = fields.List(fields.String(), metadata={
        "description": "The memory ids the answer cites, each one of the hits given."})
    uncited_ids = fields.List(fields.String(), metadata={
        "description": "Ids the model cited that were not in its prompt: dropped from "
                       "citations."})
    hits = fields.List(fields.Nested(SearchHit), metadata={
        "description": "The facts the prompt carried, as memory.search answers them."})
    run_blocks = fields.List(fields.Nested(ScratchpadBlock), metadata={
        "description": "The named run's working-memory blocks the prompt carried."})
    read_scope = fields.String()
    model_called = fields.Boolean()
    cut_off = fields.Boolean(metadata={
        "description": "The answer reached its output cap and may be incomplete."})
    usage = fields.Nested(Schema.from_dict({
        "prompt_tokens": fields.Integer(allow_none=True),
        "completion_tokens": fields.Integer(allow_none=True),
    }, name="MemoryAskUsage"))


def _clip(text: str) -> str:
    return text if len(text) <= PROMPT_TEXT_MAX else text[:PROMPT_TEXT_MAX] + " [...]"


def _fact_text(value: Any) -> str:
    return _clip(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))


def prompt_messages(question: str, hits: list[dict[str, Any]],
                    blocks: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The synthesis prompt: the instructions, the run's blocks, the facts, the question."""
    facts = "\n".join(
        json.dumps({"id": hit["memory_id"], "key": hit["key"], "type": hit["memory_type"],
                    "fact": _fact_text(hit["value"])}, ensure_ascii=False)
        for hit in hits)
    parts = []
    if blocks:
        notes = "\n".join(
            json.dumps({"block": block["block_key"], "content": _clip(block["content"])},
                       ensure_ascii=False)
            for block in blocks)
        parts.append("Working notes of the current run (not facts; never cite them), one "
                     "JSON object per line:\n" + notes)
    parts.append("Facts, best match first, one JSON object per line:\n" + (facts or "(none)"))
    parts.append("Question: " + question)
    return [
        {"role": "system", "content": (
            "Answer the question from the facts and notes given, and from nothing else. If "
            "they do not answer it, say so. Cite the id of every fact the answer rests on; "
            f"cite only ids given. At most {ANSWER_MAX_CHARS} characters of plain text. "
            'Answer with one JSON object: {"answer": "<text>", "citations": ["<id>", ...]}.')},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


_PARTIAL_ANSWER = re.compile(r'"answer"\s*:\s*"((?:[^"\\]|\\.)*)')


def _partial_answer(text: str) -> str:
    """The ``answer`` string of a JSON object cut off mid-way, as far as it got."""
    match = _PARTIAL_ANSWER.search(text)
    if match is None:
        return ""
    written = match.group(1)
    for end in range(len(written), max(len(written) - 6, -1), -1):
        try:
            decoded = json.loads('"' + written[:end] + '"')
        except ValueError:
            continue
        return decoded if isinstance(decoded, str) else ""
    return written


def _citations(data: dict[str, Any] | None, given: list[str]) -> tuple[list[str], list[str]]:
    """The model's citations split into those given (in the model's order, once each) and the
    rest."""
    cited = (data or {}).get("citations")
    named = [item for item in cited if isinstance(item, str)] if isinstance(cited, list) else []
    allowed = set(given)
    kept = [mid for mid in dict.fromkeys(named) if mid in allowed]
    other = [mid for mid in dict.fromkeys(named) if mid not in allowed]
    return kept, other


@op("memory.ask", role="viewer", kind="read",
    cost=search_call_cost,
    args=MemoryAskArgs, answer=MemoryAskAnswer, raises=ASK_ERRORS,
    example={**_WHO, "query": "which currency should the invoice use",
             "read_scope": "own_user"})
def memory_ask(call: Call) -> dict[str, Any]:
    """Answer a question from the facts memory.search finds, with one model call that cites them."""
    a = call.args
    svc = call.services
    settings = svc.settings
    identity = call.identity
    # The read scope is refused (403) before anything else, as memory.search refuses it.
    read_scope_for(call, a["read_scope"])
    provider = provider_from_settings(settings.llm_base_url, settings.llm_api_key,
                                      settings.llm_model, settings.ask_timeout_seconds)
    usage = svc.store(UsageStore)
    if provider is None:
        raise ModelCallsOff("no model is configured (LOOM_LLM_BASE_URL and LOOM_LLM_MODEL)",
                            reason="no_model")
    if not usage.model_calls_enabled(identity.org):
        provider.close()
        raise ModelCallsOff(f"model calls are switched off for org {identity.org} "
                            "(org.set_model_calls)", reason="org_off")
    try:
        searched = search_answer(call, count_pending=False)
    except BaseException:
        provider.close()
        raise
    hits = searched["hits"]
    blocks = [block for block in searched["scratchpad"] if block["layer"] == "run"]
    answer: dict[str, Any] = {
        "answer": None, "citations": [], "uncited_ids": [],
        "hits": hits, "run_blocks": blocks,
        "read_scope": searched["read_scope"], "model_called": False, "cut_off": False,
        "usage": {"prompt_tokens": 0, "completion_tokens": 0},
    }
    if not hits and not blocks:
        provider.close()
        return answer
    overrides = parse_max_tokens_overrides(settings.llm_max_tokens_overrides)
    max_tokens = max_tokens_for(ANSWER_SCHEMA, base_max_tokens(USAGE_WORKER, overrides))
    org, namespace = identity.org, identity.namespace
    try:
        with provider:
            completion = complete_within_budget(
                svc, org, namespace, provider, prompt_messages(a["query"], hits, blocks),
                max_tokens=max_tokens, json_schema=ANSWER_SCHEMA, schema_name=USAGE_WORKER,
                worker=USAGE_WORKER)
    except OutOfBudget as out:
        raise ModelBudgetExceeded(
            f"the model call would pass the {out.scope} budget (budget.set); ask again once "
            "its rolling window has room", budget=out.scope) from None
    except ModelCallFailed as error:
        usage.add(org, namespace, worker=USAGE_WORKER, model_calls=1, failures=1,
                  prompt_tokens=error.prompt_tokens or 0,
                  completion_tokens=error.completion_tokens or 0)
        log.warning("memory.ask: the model call failed for %s/%s: %s", org, namespace, error)
        if error.timed_out:
            raise ModelTimedOut(
                f"the model server did not answer within {settings.ask_timeout_seconds}s "
                "(LOOM_ASK_TIMEOUT_SECONDS)", timeout_seconds=settings.ask_timeout_seconds,
            ) from None
        raise ModelCallError(f"the model call failed: {error.message}",
                             model_status=error.status) from None
    usage.add(org, namespace, worker=USAGE_WORKER, model_calls=1,
              prompt_tokens=completion.prompt_tokens or 0,
              completion_tokens=completion.completion_tokens or 0)
    text = (completion.data or {}).get("answer")
    if not isinstance(text, str):
        if not completion.cut_off:
            usage.add(org, namespace, worker=USAGE_WORKER, failures=1)
            raise ModelCallError('the model\'s answer has no "answer" text', model_status=200)
        # Cut off before its JSON closed: the answer text written so far, marked as cut.
        text = _partial_answer(completion.text)
    kept, other = _citations(completion.data, [hit["memory_id"] for hit in hits])
    answer.update({
        "answer": text.strip(), "citations": kept, "uncited_ids": other,
        "model_called": True, "cut_off": completion.cut_off,
        "usage": {"prompt_tokens": completion.prompt_tokens,
                  "completion_tokens": completion.completion_tokens},
    })
    return answer
