"""budget.set / budget.get: caps on the model calls and tokens an org or a namespace spends.

A budget caps model calls and tokens (prompt + completion) per rolling window of
``LOOM_MODEL_BUDGET_WINDOW_SECONDS``. The body's namespace names the namespace's budget;
``namespace: "*"`` names the org's, which caps every namespace of the org together and needs a
token that reaches the whole org (a namespace's token naming ``*`` is refused like any other
namespace outside its reach). A set replaces both caps and is audited like the schema ops.
"""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, fields, validate

from app.clock import iso_from_ns
from app.registry import Call, op
from app.schemas.common import Answer, IdentityArgs, StrictInt
from app.store import keys
from app.store.budget import BudgetStore, Window

# Large enough for any real budget, small enough to stay exact in JavaScript and in Lua.
MAX_CAP = 2**53 - 1

MAX_TIMELINE_BUCKETS = 240

_DOC_NAMESPACE = ('The namespace whose budget this is, or "*" for the org\'s budget, which caps '
                  "all its namespaces together and needs a token reaching the whole org.")


class BudgetArgs(IdentityArgs):
    class Meta(IdentityArgs.Meta):
        exclude = ("agent", "user_id", "session_id", "run_id")


def _cap_field(what: str) -> StrictInt:
    return StrictInt(
        load_default=None, allow_none=True, validate=validate.Range(min=0, max=MAX_CAP),
        metadata={"description": f"Most {what} per rolling window; null or left out: no cap. "
                                 "0 stops every call."},
    )


class BudgetGetArgs(BudgetArgs):
    timeline_buckets = StrictInt(
        load_default=0, validate=validate.Range(min=0, max=MAX_TIMELINE_BUCKETS),
        metadata={"description": "Also answer the window's calls and tokens over time, cut "
                                 "into this many equal buckets; 0 (default): no timeline."},
    )


class BudgetSetArgs(BudgetArgs):
    calls = _cap_field("model calls")
    tokens = _cap_field("tokens (prompt + completion)")


class BudgetBucket(Schema):
    start = fields.String(metadata={"description": "When the bucket starts."})
    calls = fields.Integer(metadata={"description": "Model calls made in the bucket."})
    tokens = fields.Integer(metadata={"description": "Their tokens (estimates while in flight)."})


class BudgetAnswer(Answer):
    namespace = fields.String(metadata={"description": _DOC_NAMESPACE})
    window_seconds = fields.Integer(
        metadata={"description": "The rolling window (LOOM_MODEL_BUDGET_WINDOW_SECONDS)."})
    calls = fields.Integer(allow_none=True, metadata={"description": "The calls cap; null: none."})
    tokens = fields.Integer(allow_none=True,
                            metadata={"description": "The tokens cap; null: none."})
    spent_calls = fields.Integer(metadata={"description": (
        "Model calls in the window, calls in flight included.")})
    spent_tokens = fields.Integer(metadata={"description": (
        "Tokens in the window: what finished calls reported, and the estimate of calls in "
        "flight.")})
    remaining_calls = fields.Integer(allow_none=True)
    remaining_tokens = fields.Integer(allow_none=True)
    set_by = fields.String(allow_none=True)
    set_at = fields.String(allow_none=True)
    timeline = fields.List(fields.Nested(BudgetBucket), metadata={"description": (
        "With timeline_buckets: the window's calls and tokens, oldest bucket first.")})


def _answer(call: Call, window: Window) -> dict[str, Any]:
    limits = window.limits
    return {
        "namespace": call.identity.namespace,
        "window_seconds": call.services.settings.model_budget_window_seconds,
        "calls": limits.calls,
        "tokens": limits.tokens,
        "spent_calls": window.spent_calls,
        "spent_tokens": window.spent_tokens,
        "remaining_calls": window.remaining_calls,
        "remaining_tokens": window.remaining_tokens,
        "set_by": limits.set_by or None,
        "set_at": iso_from_ns(limits.set_at) if limits.set_at is not None else None,
    }


@op("budget.set", role="admin", kind="idempotent", listed=False, mcp=False,
    args=BudgetSetArgs, answer=BudgetAnswer, needs_agent=False,
    keyed_in=lambda call: keys.org_tag(call.identity.org),
    # The caps a keyed set wrote are kept with its key; the answer reads the window again.
    replay=lambda call, _kept: _answer(call, call.services.store(BudgetStore).get(
        call.identity.org, call.identity.namespace)),
    example={"namespace": "support", "calls": 2000, "tokens": 1_000_000})
def budget_set(call: Call) -> dict[str, Any]:
    """Cap a namespace's (or, with namespace "*", the org's) model calls and tokens; audited."""
    ident = call.identity
    store = call.services.store(BudgetStore)
    # The store audits the change in the write's own step.
    store.set(ident.org, ident.namespace, call.args["calls"], call.args["tokens"],
              call.principal.actor, held=call.held_key)
    return _answer(call, store.get(ident.org, ident.namespace))


@op("budget.get", role="admin", kind="read", listed=False, mcp=False,
    args=BudgetGetArgs, answer=BudgetAnswer, needs_agent=False,
    example={"namespace": "support"})
def budget_get(call: Call) -> dict[str, Any]:
    """A namespace's (or the org's) model-call budget: caps, spent in the window, remaining."""
    ident = call.identity
    store = call.services.store(BudgetStore)
    answer = _answer(call, store.get(ident.org, ident.namespace))
    buckets = call.args["timeline_buckets"]
    if buckets:
        answer["timeline"] = [
            {"start": iso_from_ns(bucket.start_ms * 1_000_000), "calls": bucket.calls,
             "tokens": bucket.tokens}
            for bucket in store.timeline(ident.org, ident.namespace, buckets)]
    return answer
