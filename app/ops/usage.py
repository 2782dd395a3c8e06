"""usage.get and org.set_model_calls: what model work cost, and an org's switch to stop it."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from marshmallow import Schema, fields

from app.registry import Call, op
from app.schemas.common import Answer, IdentityArgs, StrictBool
from app.store import keys
from app.store.recall_vectors import RecallVectorStore
from app.store.usage import UsageStore


class UsageArgs(IdentityArgs):
    pass


class RecallBacklog(Schema):
    facts = fields.Integer(metadata={"description": (
        "Facts waiting for a vector: written or changed since their last embedding.")})
    users = fields.Integer(metadata={"description": "Users those facts belong to."})


class Usage(Answer):
    namespace = fields.String()
    model_calls_enabled = fields.Boolean()
    # One integer per counter of app.store.usage.COUNTERS (a test holds them equal).
    model_calls = fields.Integer()
    prompt_tokens = fields.Integer()
    completion_tokens = fields.Integer()
    builds = fields.Integer()
    skipped_unchanged = fields.Integer()
    refusals = fields.Integer()
    failures = fields.Integer()
    deferred_for_budget = fields.Integer(metadata={"description": (
        "Builds and folds not made because they would pass the namespace's or the org's "
        "budget (budget.set), once per pass that deferred them; each is made in a later pass "
        "once the window has room.")})
    by_worker = fields.Dict(
        keys=fields.String(), values=fields.Dict(keys=fields.String(), values=fields.Integer()),
        metadata={"description": (
            "The same counters for each worker apart: structured_profile (structured-profile "
            "builds), profile_consolidation (folds) and recall_embeddings (the embeddings of "
            "facts and of search queries).")})
    recall_backlog = fields.Nested(RecallBacklog, metadata={"description": (
        "The namespace's facts waiting for the embeddings job (memory.search's vector leg), "
        "which a fact's write enqueues and the periodic sweep enqueues again after a fault.")})


class ModelCallsArgs(IdentityArgs):
    enabled = StrictBool(
        required=True, metadata={"description": "False stops every model call for the org."}
    )


class ModelCalls(Answer):
    org = fields.String()
    model_calls_enabled = fields.Boolean()


@op("usage.get", role="admin", kind="read", listed=False, args=UsageArgs, answer=Usage,
    needs_agent=False, example={"namespace": "support"})
def usage_get(call: Call) -> dict[str, Any]:
    """The namespace's cost ledger (calls, tokens, builds, skips, failures) and vector backlog."""
    store = call.services.store(UsageStore)
    ident = call.identity
    return {
        "namespace": ident.namespace,
        **store.get(ident.org, ident.namespace),
        "by_worker": store.by_worker(ident.org, ident.namespace),
        "model_calls_enabled": store.model_calls_enabled(ident.org),
        "recall_backlog": asdict(call.services.store(RecallVectorStore).namespace_backlog(
            ident.org, ident.namespace)),
    }


@op("org.set_model_calls", role="admin", kind="idempotent", listed=False,
    args=ModelCallsArgs, answer=ModelCalls, needs_agent=False, needs_namespace=False,
    org_wide=True, example={"enabled": False},
    keyed_in=lambda call: keys.org_tag(call.identity.org),
    replay=lambda call, _kept: _model_calls_answer(call))
def org_set_model_calls(call: Call) -> dict[str, Any]:
    """Switch the org's model calls on or off; off, the workers never call a model for it."""
    store = call.services.store(UsageStore)
    store.set_model_calls(call.identity.org, call.args["enabled"], held=call.held_key)
    return _model_calls_answer(call)


def _model_calls_answer(call: Call) -> dict[str, Any]:
    return {"org": call.identity.org, "model_calls_enabled": call.args["enabled"]}
