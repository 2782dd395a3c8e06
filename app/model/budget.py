"""Model calls within budget: the one way Loom calls a model, chat or embeddings, in a worker
or in a request, so every call is reserved, settled and counted in the ledger
(``app.store.usage``) the same way.

``complete_within_budget`` reserves the call's estimate (``app.model.chat.estimate_call_tokens``)
against the namespace's and the org's budgets (``app.store.budget``) before the call, settles
the reservation with the usage the model reported after it, and releases it when the call
failed without a reported cost. A call that would pass a budget is not made: it raises
``OutOfBudget``, counts ``deferred_for_budget`` in the namespace's ledger, and is logged once per
namespace per window (not once per user). Out of budget is not a failure: the caller keeps the
user listed, without a backoff, for the first pass after the window has room.

``embed_within_budget`` does the same for one embeddings call (a fact's in the job, a query's in
``memory.search``), counted under the ledger's ``recall_embeddings`` worker.
"""

from __future__ import annotations

import logging
from typing import Any

from app.model.chat import Completion, ModelProvider, estimate_call_tokens
from app.model.embeddings import (
    EmbeddingProvider,
    Embeddings,
    Purpose,
    estimate_embedding_tokens,
)
from app.model.errors import ModelCallFailed
from app.services import Services
from app.store.budget import BudgetStore, Reservation
from app.store.connection import STORE_ERROR
from app.store.services import StoreServices
from app.store.usage import WORKERS, UsageStore

log = logging.getLogger("loom.model.budget")


class OutOfBudget(Exception):
    """The call would pass a budget; ``scope`` says whose: ``namespace`` or ``org``."""

    def __init__(self, org: str, namespace: str, scope: str) -> None:
        super().__init__(f"the model call would pass the {scope} budget of {org}/{namespace}")
        self.org = org
        self.namespace = namespace
        self.scope = scope


def _reported(prompt_tokens: int | None, completion_tokens: int | None) -> int | None:
    if prompt_tokens is None and completion_tokens is None:
        return None
    return (prompt_tokens or 0) + (completion_tokens or 0)


def _finish(budgets: BudgetStore, reservation: Reservation, real_tokens: int | None,
            release: bool) -> None:
    # The model's work is done; a store that cannot be reached now leaves the estimate counted
    # until the window drops it (the safe side), instead of losing the answer.
    try:
        if release:
            budgets.release(reservation)
        else:
            budgets.settle(reservation, real_tokens)
    except STORE_ERROR as error:
        log.warning("budget: could not settle a reservation for %s/%s: %s",
                    reservation.org, reservation.namespace, error)


def complete_within_budget(
    svc: Services,
    org: str,
    namespace: str,
    provider: ModelProvider,
    messages: list[dict[str, str]],
    *,
    max_tokens: int,
    json_schema: dict[str, Any] | None = None,
    schema_name: str = "structured_profile",
    worker: str = "worker",
) -> Completion:
    """``provider.complete`` under the namespace's and the org's budgets (see the module)."""
    budgets = svc.store(BudgetStore)
    estimate = estimate_call_tokens(messages, max_tokens, json_schema)
    reservation = budgets.reserve(org, namespace, estimate)
    if not reservation.granted:
        svc.store(UsageStore).add(org, namespace, deferred_for_budget=1,
                                  worker=worker if worker in WORKERS else None)
        if reservation.first_deferral:
            log.warning("%s: %s/%s is out of its %s budget; builds wait until the rolling "
                        "window of %d s has room (logged once per window)", worker, org,
                        namespace, reservation.over, budgets.window_seconds)
        raise OutOfBudget(org, namespace, reservation.over)
    try:
        completion = provider.complete(messages, max_tokens=max_tokens, json_schema=json_schema,
                                       schema_name=schema_name)
    except ModelCallFailed as error:
        real = _reported(error.prompt_tokens, error.completion_tokens)
        _finish(budgets, reservation, real, release=real is None)
        raise
    except BaseException:
        _finish(budgets, reservation, None, release=True)
        raise
    _finish(budgets, reservation,
            _reported(completion.prompt_tokens, completion.completion_tokens), release=False)
    return completion


# --- embeddings ------------------------------------------------------------------------------

# The ledger's worker for every embeddings call, a fact's (the job) or a query's (the search).
USAGE_WORKER = "recall_embeddings"


class EmbeddingsOutOfBudget(Exception):
    """The call would pass a model-call budget (budget.set); ``scope``: namespace or org."""

    def __init__(self, org: str, namespace: str, scope: str) -> None:
        super().__init__(f"the embeddings call would pass the {scope} budget of {org}/{namespace}")
        self.org = org
        self.namespace = namespace
        self.scope = scope


def embed_within_budget(
    services: StoreServices, org: str, namespace: str, embedder: EmbeddingProvider,
    texts: list[str], *, purpose: Purpose,
) -> Embeddings:
    """One embeddings call (``texts`` at most one batch, embedded as a ``purpose``: a query or
    a document) as every model call is made: one call
    and its estimate reserved against the namespace's and the org's budgets first (refused:
    ``EmbeddingsOutOfBudget``, counted ``deferred_for_budget``), settled with the tokens the
    server reported, and counted in the ledger under ``recall_embeddings`` (a failure as a
    call and a failure, then ``ModelCallFailed`` again)."""
    budgets = services.store(BudgetStore)
    usage = services.store(UsageStore)
    reservation = budgets.reserve(org, namespace, estimate_embedding_tokens(texts))
    if not reservation.granted:
        usage.add(org, namespace, worker=USAGE_WORKER, deferred_for_budget=1)
        raise EmbeddingsOutOfBudget(org, namespace, reservation.over)
    try:
        result = embedder.embed(texts, purpose=purpose)
    except ModelCallFailed as error:
        if error.prompt_tokens is None:
            budgets.release(reservation)
        else:
            budgets.settle(reservation, error.prompt_tokens)
        usage.add(org, namespace, worker=USAGE_WORKER, model_calls=1, failures=1,
                  prompt_tokens=error.prompt_tokens or 0)
        raise
    except BaseException:
        budgets.release(reservation)
        raise
    budgets.settle(reservation, result.prompt_tokens)
    usage.add(org, namespace, worker=USAGE_WORKER, model_calls=result.calls,
              prompt_tokens=result.prompt_tokens or 0)
    return result
