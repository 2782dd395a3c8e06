"""The section-vector job: refreshes the vectors of one user's profile sections, which
loom_search's profile leg scores by meaning (app/store/profile_vectors.py).

Enqueued after every write of a profile row (once for a burst of writes), it reads the user's
live sections, embeds those whose vector is missing or was made from other content or by
another model, and drops the vectors of sections that are gone (deleted, redacted, expired,
retyped). It is idempotent: run twice, the second run finds every fingerprint current and makes
no call. The embeddings call is one call under the namespace's and the org's budgets and in the
ledger, as every model call is (``app.model.budget.embed_within_budget``); out of budget, or with
the endpoint failing, the sections keep no vector and the search scores them lexically until a
later write enqueues the job again.
"""

from __future__ import annotations

import logging
from typing import Any

from app.job_registry import declared_job
from app.model.budget import EmbeddingsOutOfBudget, embed_within_budget
from app.model.embeddings import DOCUMENT, embedder_for
from app.model.errors import ModelCallFailed
from app.services import Services
from app.store.memory import MemoryRow, MemoryStore, SectionReach, canonical_json
from app.store.memory_row import Location
from app.store.profile_vectors import ProfileVectorStore, fingerprint
from app.store.usage import UsageStore
from jobs.context import services

log = logging.getLogger("loom.jobs.profile_vectors")


def section_embedding_text(row: MemoryRow) -> str:
    """What a section's vector is made of: its label and its text."""
    value = row.value if isinstance(row.value, str) else canonical_json(row.value)
    return f"{row.key}: {value}"


def _location(org: str, namespace: str, row: MemoryRow) -> Location:
    return Location(org, namespace, row.user_id, row.agent, row.session_id, row.key)


@declared_job
def refresh_sections(org: str, namespace: str, user_id: str,
                     svc: Services | None = None) -> dict[str, Any]:
    """The job's body (see the module); answers what it did, for the job's result."""
    svc = svc or services()
    vectors = svc.store(ProfileVectorStore)
    vectors.claim_queued(org, namespace, user_id)
    settings = svc.settings
    now = svc.clock.now_ns()
    sections = [
        row for row in svc.store(MemoryStore).profile_sections(
            org, namespace, [SectionReach(user_id)])
        if row.user_id == user_id and not row.expired(now)
    ]
    stored = vectors.fingerprints(org, namespace, user_id)
    current = {row.memory_id for row in sections}
    dropped = vectors.drop(org, namespace, user_id,
                           [memory_id for memory_id in stored if memory_id not in current])
    embedder = embedder_for(settings)
    if embedder is None:
        return {"embedded": 0, "dropped": dropped, "skipped": "no embeddings endpoint"}
    dimensions = settings.embed_dimensions or None
    due = [row for row in sections
           if stored.get(row.memory_id) != fingerprint(embedder.made_by, dimensions,
                                                        row.content_sha256)]
    if not due:
        embedder.close()
        return {"embedded": 0, "dropped": dropped}
    if not svc.store(UsageStore).model_calls_enabled(org):
        embedder.close()
        return {"embedded": 0, "dropped": dropped, "skipped": "model calls off for the org"}
    embedded = 0
    try:
        with embedder:
            for start in range(0, len(due), settings.embed_batch_size):
                batch = due[start:start + settings.embed_batch_size]
                result = embed_within_budget(svc, org, namespace, embedder,
                                             [section_embedding_text(row) for row in batch],
                                             purpose=DOCUMENT)
                for row, vector in zip(batch, result.vectors, strict=True):
                    made_from = fingerprint(embedder.made_by, dimensions, row.content_sha256)
                    if vectors.store(_location(org, namespace, row), row.memory_id,
                                     row.content_sha256, vector, made_from):
                        embedded += 1
    except EmbeddingsOutOfBudget as out:
        return {"embedded": embedded, "dropped": dropped, "deferred": out.scope}
    except ModelCallFailed as error:
        log.warning("profile vectors: embedding failed for a user of %s/%s: %s",
                    org, namespace, error)
        return {"embedded": embedded, "dropped": dropped, "failed": str(error)}
    return {"embedded": embedded, "dropped": dropped}
