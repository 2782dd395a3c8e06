"""The recall_embeddings job: embeds a user's facts whose text changed, for recall's vector leg.

A fact write lists the row as due in the user's slot, atomically with the row (app/store/lua/
memory_write.lua), and the same script sets the user's queued marker when no job is queued,
so the store asks for one job a user (``RecallVectorStore.ask_embedding``; the sweep and the
backfill go through ``RecallVectorStore.request``) on the builds queue; neither computes anything.
``embed_user`` is that job:

* It takes down the user's queued marker first, so a write from then on enqueues a new job
  while this one runs, and no write is missed.
* It reads up to ``ROWS_PER_JOB`` due rows. A row whose vector is already of its current text
  and model (the fingerprint, app/store/recall_vectors.py) costs no call: it is taken off the
  list and counted ``skipped_unchanged``.
* The rest are embedded ``LOOM_EMBED_BATCH_SIZE`` to a call, each call under the namespace's and
  the org's model-call budgets (``app.model.budget.embed_within_budget``) and counted in the
  ledger under ``recall_embeddings``. A call out of budget or failed stops the job; its rows
  stay due for the user's next job (their next write, or a later batch of this one).
* Each vector is stored only if the row is still at the version whose text was embedded
  (``recall_vector_store.lua``): a row rewritten, deleted, redacted or erased meanwhile never
  gets a stale vector.
* With more rows due than one job takes, it enqueues the next job of the user itself.

No endpoint configured (``LOOM_EMBED_BASE_URL``/``LOOM_EMBED_MODEL``), or model calls switched
off for the org: nothing is called and the rows stay due.

``sweep`` is the periodic pass that gives those rows their vectors without a further write: the
facts written before an endpoint was configured, and those whose job failed or ran out of
budget. Every ``LOOM_RECALL_EMBED_SWEEP_INTERVAL_SECONDS`` it requests the job of at most
``LOOM_RECALL_EMBED_SWEEP_USERS_PER_PASS`` users with rows due, starting after the user the last
pass stopped at, so every user gets a turn; the jobs it enqueues are the ones a write enqueues,
with the same budgets, ledger and follow-ups. It calls no model itself. A user whose queued
marker names a job that no longer waits in its queue (its enqueue failed, or the queue's server
came back without it after a kill) gets a new job from the next pass, not after the marker's
ten-minute lifetime.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from app.job_registry import RECALL_EMBED_SWEEP, declared_job
from app.logs import pass_level
from app.model.budget import USAGE_WORKER, EmbeddingsOutOfBudget, embed_within_budget
from app.model.embeddings import DOCUMENT, embedder_for
from app.model.errors import ModelCallFailed
from app.recall_backfill import Requested, request_jobs
from app.services import Services
from app.store.memory import MemoryRow, MemoryStore
from app.store.recall_terms import row_text
from app.store.recall_vectors import RecallVectorStore, encode_vector, fingerprint
from app.store.usage import UsageStore
from jobs.context import services
from jobs.periodic import Periodic

if TYPE_CHECKING:
    from app.settings import Settings

log = logging.getLogger("loom.jobs.recall_embed")

SWEEP_FUNC = RECALL_EMBED_SWEEP.func
# Most due rows one job reads; a user with more gets a follow-up job.
ROWS_PER_JOB = 1000


@dataclass
class EmbedResult:
    embedded: int = 0
    unchanged: int = 0
    gone: int = 0
    moved: int = 0
    model_calls: int = 0
    stopped: str = ""  # why it stopped early: model_off, budget, failed, erasing

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@declared_job
def embed_user(org: str, namespace: str, user_id: str) -> dict[str, Any]:
    """The job's entry point (RQ): ``embed_due`` with the process's services."""
    return embed_due(services(), org, namespace, user_id).as_dict()


def embed_due(svc: Services, org: str, namespace: str, user_id: str,
              limit: int = ROWS_PER_JOB) -> EmbedResult:
    """Embed the user's due rows (see the module)."""
    settings = svc.settings
    vectors = svc.store(RecallVectorStore)
    usage = svc.store(UsageStore)
    result = EmbedResult()
    vectors.claim_queued(org, namespace, user_id)
    embedder = embedder_for(settings)
    if embedder is None or not usage.model_calls_enabled(org):
        if embedder is not None:
            embedder.close()
        result.stopped = "model_off"
        return result
    with embedder:
        due = vectors.due(org, namespace, user_id, limit)
        present = [d for d in due if d.row_key is not None]
        for gone in (d for d in due if d.row_key is None):
            vectors.drop_due(org, namespace, user_id, gone.memory_id)
            result.gone += 1
        rows = {row.memory_id: row for row in
                svc.store(MemoryStore).read_row_keys([d.row_key for d in present
                                                      if d.row_key is not None])}
        key_of = {d.memory_id: d.row_key for d in present if d.row_key is not None}
        wanted = [rows[d.memory_id] for d in present if d.memory_id in rows]
        texts = {row.memory_id: row_text(row.key, row.value) for row in wanted}
        made_from = {mid: fingerprint(embedder.made_by, embedder.dimensions, text)
                     for mid, text in texts.items()}
        stored = vectors.fingerprints(org, namespace, user_id, [r.memory_id for r in wanted])
        to_embed: list[MemoryRow] = []
        for row, old in zip(wanted, stored, strict=True):
            if old == made_from[row.memory_id]:
                _count(result, vectors.store(org, namespace, user_id, key_of[row.memory_id],
                                             row.memory_id, row.version, ""), unchanged=True)
            else:
                to_embed.append(row)
        if result.unchanged:
            usage.add(org, namespace, worker=USAGE_WORKER, skipped_unchanged=result.unchanged)
        step = max(1, getattr(embedder, "batch_size", len(to_embed) or 1))
        for start in range(0, len(to_embed), step):
            batch = to_embed[start:start + step]
            try:
                answer = embed_within_budget(svc, org, namespace, embedder,
                                             [texts[row.memory_id] for row in batch],
                                             purpose=DOCUMENT)
            except EmbeddingsOutOfBudget as out:
                result.stopped = "budget"
                log.info("recall_embeddings: %s/%s is out of its %s budget; rows wait",
                         org, namespace, out.scope)
                return result
            except ModelCallFailed as error:
                result.model_calls += 1
                result.stopped = "failed"
                log.warning("recall_embeddings: a call failed for a user of %s/%s: %s",
                            org, namespace, error)
                return result
            result.model_calls += answer.calls
            for row, vector in zip(batch, answer.vectors, strict=True):
                status = vectors.store(org, namespace, user_id, key_of[row.memory_id],
                                       row.memory_id, row.version,
                                       encode_vector(vector, made_from[row.memory_id]))
                _count(result, status)
                if status == "ERASING":
                    result.stopped = "erasing"
                    return result
    if len(due) >= limit and vectors.due_count(org, namespace, user_id) > 0:
        vectors.request(org, namespace, user_id)
    return result


def _count(result: EmbedResult, status: str, *, unchanged: bool = False) -> None:
    if status == "OK":
        if unchanged:
            result.unchanged += 1
        else:
            result.embedded += 1
    elif status == "MOVED":
        result.moved += 1
    elif status == "GONE":
        result.gone += 1


@declared_job
def sweep() -> dict[str, Any]:
    """The sweep's entry point (RQ): ``sweep_due`` with the process's services."""
    return sweep_due(services())


def sweep_due(svc: Services) -> dict[str, Any]:
    """Request the embeddings job of the next users with rows due (see the module), through
    the loop memory.backfill and ``flask loom recall backfill`` use (app/recall_backfill.py)."""
    vectors = svc.store(RecallVectorStore)
    if not vectors.enabled:
        # No endpoint: a job could call nothing, so none is asked for and nothing is read.
        return {**Requested().counts(), "stopped": "model_off"}
    due = vectors.users_due()
    after = vectors.sweep_position()
    turn = [u for u in due if u.position > after] + [u for u in due if u.position <= after]
    totals = request_jobs(svc, turn, limit=svc.settings.recall_embed_sweep_users_per_pass)
    if totals.reached:
        vectors.set_sweep_position(totals.reached)
    counts = totals.counts()
    log.log(pass_level(counts["users_due"]),
            "recall_embeddings sweep: %(users_due)d users with rows due, %(requested)d jobs "
            "requested, %(already_queued)d already queued, %(model_off)d with model calls off",
            counts)
    return {**counts, "stopped": ""}


def periodic(settings: Settings) -> Periodic:
    """The schedule entry: every LOOM_RECALL_EMBED_SWEEP_INTERVAL_SECONDS on the maintenance
    queue (the jobs it requests run on the builds queue, as a write's do)."""
    return Periodic.of(RECALL_EMBED_SWEEP, settings.recall_embed_sweep_interval_seconds)
