"""The erasure saga of one user of a namespace, run in the background on RQ.

``ErasureStore.start`` (the ``user.erase`` op) takes the erasure's lock for a moment, sets the
user's erasure markers, so that from its answer on every write for the user is refused 409
``USER_BEING_ERASED``, keeps what the run needs in the erasure's record, asks the job dispatcher
for its run (``intents.RunErasure``, whose arguments are the org, the namespace and the
erasure id, never the user id) and answers the receipt with status ``running``.
A worker runs the steps (``STEPS``) under the lock; the lock has a short TTL renewed by a
heartbeat thread, so a worker killed mid-saga lets go of it within ``LOCK_TTL_MS``. Its record
then reads ``interrupted``, and the resume pass (each worker's start, and a periodic job of the
scheduler) enqueues the run again; every step is idempotent, so the run starts over from the
first step and the counts the marker kept stay exact.

The steps, in order:

``mark``            the user's erasure marker (``keys.user_erasing``) and one per agent-state
                    subject that is the user (``keys.agent_state_subject_erasing``); set by
                    ``start`` already, ensured again by every attempt.
``memory``          the memory_id pointers, then every row with its versions (facts, profile
                    sections, the structured profile), the user's indexes and source digest,
                    the structured build record, and the user's entries in the namespace indexes.
``working_memory``  every block of every scope of the user.
``activity``        who read the user's profile.
``agent_state``     the states of the user's subject scope and every state naming them.
``jobs``            queued jobs whose arguments name (org, namespace, user_id), found and
                    deleted by the job dispatcher (``services.jobs``); a running job is left
                    to the census.
``tokens``          the tokens pinned to the user are revoked, their claims keeping the
                    erasure id in place of the user id.
``worker_state``    the user's entries in what the workers keep between passes.
``sweep``           every primary SCANned for anything still under the user's hash tag, the
                    namespace's pointers and sets: what an index did not list.
``census``          ``census.take_census``. Anything found fails the erasure closed: status
                    ``failed``, retryable by ``user.erase``, the marker stays. Clean: the
                    receipt is written, the marker goes, and the AOF rewrite is asked for.

Keys of the user's slot are deleted by one script (``erasure_drop.lua``) that adds what they
held to the counts on the marker (same slot), so a crash neither loses nor doubles those
counts; removals in other slots are counted right after (``erasure_add_counts.lua``).

The raw user id is kept only while the erasure is due, in the record's ``run_user`` field (the
user's data is still in Redis then anyway), and leaves with the receipt's ``done``; agent-state
handles are never stored, only their keyed digests. The receipt and the audit entry hold
counts and times only.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from app.errors import ErasureNotFound, ErasureRunning, ValidationFailed
from app.keyed import keyed_digest
from app.store import keys
from app.store.agent_state import AgentStateStore
from app.store.batching import batches
from app.store.erasure import aof, leftovers
from app.store.erasure.census import kind_of, take_census
from app.store.erasure.receipt import (
    KINDS,
    RUN_FIELDS,
    STEPS,
    Census,
    receipt_of,
    zero_counts,
)
from app.store.erasure.run import PROGRESS, ErasureRun, LockLost, Progress
from app.store.erasure.scanning import text
from app.store.erasure.worker_state import scrub_stored
from app.store.intents import RunErasure
from app.store.lua import raise_for_status, script
from app.store.namespace_config import AuditLog
from app.store.recall_vectors import VECTORSET, engine_of
from app.store.script_interfaces import (
    ERASURE_ADD_COUNTS,
    ERASURE_DROP,
    RELEASE_IF_HELD,
    RENEW_IF_HELD,
)
from app.store.structured import PROFILE_KEY
from app.store.tokens import TokenStore

if TYPE_CHECKING:
    from app.store.services import StoreServices

log = logging.getLogger("loom.erasure")

# The lock outlives a dead worker by at most this much; a heartbeat renews it every fifth.
LOCK_TTL_MS = 15_000
HEARTBEAT_SECONDS = LOCK_TTL_MS / 5000
BATCH = 200
MAX_HANDLES = 20

# Versioned purpose: no other keyed digest under the same secret can equal an erasure id.
_PURPOSE = b"loom.erasure.user.v1"


def erasure_id(secret: str, org: str, namespace: str, user_id: str) -> str:
    """HMAC-SHA256 (hex) of (org, namespace, user_id): what names the erasure's record."""
    return keyed_digest(secret.encode("utf-8"), _PURPOSE, org, namespace, user_id)


def _decoded(mapping: Any) -> dict[str, str]:
    return {text(k): text(v) for k, v in (mapping or {}).items()}


class _Heartbeat:
    """Renews the run's lock while the run lives: a run that stalls in one long step (a big
    scan, the AOF wait, a test's pause) keeps it, and a killed worker stops renewing."""

    def __init__(self, store: ErasureStore, run: ErasureRun) -> None:
        self.store, self.run = store, run
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="erasure-lock", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(5)

    def _beat(self) -> None:
        while not self.stopped.wait(HEARTBEAT_SECONDS):
            try:
                if not self.store.renew(self.run):
                    self.run.lost.append(True)
                    return
            except Exception as error:  # Redis away for a moment: the next beat tries again
                log.warning("could not renew an erasure's lock: %s", type(error).__name__)


class ErasureStore:
    def __init__(self, services: StoreServices) -> None:
        self.services = services
        self.redis = services.redis
        self.clock = services.clock
        self.settings = services.settings
        self.agent_states = AgentStateStore(services)
        self.audit = AuditLog(services)
        self._drop = script(self.redis, "erasure_drop")
        self._add = script(self.redis, "erasure_add_counts")
        self._renew = script(self.redis, "renew_if_held")
        self._release = script(self.redis, "release_if_held")

    # --- naming and reading -------------------------------------------------------------------

    def erasure_id(self, org: str, namespace: str, user_id: str) -> str:
        return erasure_id(self.settings.secret_key, org, namespace, user_id)

    def status(self, org: str, namespace: str, erasure: str) -> dict[str, Any]:
        """The receipt of the user's latest erasure; 404 when there is none."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(keys.erasure(org, namespace, erasure))
        pipe.exists(keys.erasure_lock(org, namespace, erasure))
        raw, locked = pipe.execute()
        record = _decoded(raw)
        if not record:
            raise ErasureNotFound("no erasure with this id in this namespace",
                                  erasure_id=erasure)
        return receipt_of(erasure, record, bool(locked) or self._job_waits(record))

    def _job_waits(self, record: dict[str, str]) -> bool:
        """Whether the record's background job is still due: queued, or started so recently
        that its run may not hold the lock yet."""
        if record.get("status") != "running" or not record.get("job_id"):
            return False
        job = self.services.jobs.job(record["job_id"])
        if job is None:
            return False
        if job.due:
            return True
        if job.status == "started" and job.started_at is not None:
            return (datetime.now(UTC) - job.started_at).total_seconds() * 1000 < LOCK_TTL_MS
        return False

    def subject_digests(self, org: str, namespace: str, user_id: str,
                        handles: Iterable[str] = ()) -> list[tuple[str, str]]:
        """The agent-state subjects that are the user, as (handle, digest): their user id read
        as a customer handle (when it is a valid one), then each other handle given (422 naming
        ``handles.<i>`` when one is not a handle). Two spellings of one handle count once."""
        found: dict[str, str] = {}
        try:
            found[self.agent_states.subject_digest(org, namespace, user_id)] = user_id
        except ValidationFailed:
            pass  # a user id that is no valid handle names no subject
        for i, handle in enumerate(handles):
            digest = self.agent_states.subject_digest(org, namespace, handle,
                                                      path=f"handles.{i}")
            found.setdefault(digest, handle)
        return [(handle, digest) for digest, handle in found.items()]

    def _new_run(self, org: str, namespace: str, user_id: str, actor: str,
                 handles: Iterable[str], progress: Progress | None = None) -> ErasureRun:
        subjects = [digest for _h, digest in
                    self.subject_digests(org, namespace, user_id, list(handles))]
        return ErasureRun(org, namespace, user_id, self.erasure_id(org, namespace, user_id),
                          subjects, actor, secrets.token_hex(16), progress)

    def _lock(self, run: ErasureRun) -> None:
        if not self.redis.set(run.lock, run.token, nx=True, px=LOCK_TTL_MS):
            raise ErasureRunning(
                "this user's erasure is running in another process; ask erasure.status",
                erasure_id=run.erasure_id, retry_after=5,
            )

    def renew(self, run: ErasureRun) -> bool:
        return bool(self._renew(*RENEW_IF_HELD.ordered(
            {"lock": run.lock}, {"holder": run.token, "ttl_ms": LOCK_TTL_MS})))

    # --- in the background ----------------------------------------------------------------------

    def start(self, org: str, namespace: str, user_id: str, *, actor: str,
              handles: Iterable[str] = ()) -> dict[str, Any]:
        """Mark the user and enqueue the erasure's run; answers the receipt (``running``).

        Asked again while a run is due or running, it answers that run's receipt and enqueues
        nothing; a failed or interrupted erasure is enqueued again (its retry)."""
        run = self._new_run(org, namespace, user_id, actor, handles)
        try:
            self._lock(run)
        except ErasureRunning:
            # A worker runs it now (or another call is starting it): that run's receipt, when
            # it has one; a lock without a record is someone else's start, still a 409.
            if _decoded(self.redis.hgetall(run.record)).get("status") == "running":
                return self.status(org, namespace, run.erasure_id)
            raise
        try:
            record = _decoded(self.redis.hgetall(run.record))
            if not (record.get("status") == "running" and self._job_waits(record)):
                self._open(run, record, attempt=False)
                self._enqueue(run, record.get("job_id", ""))
        finally:
            self._release(*RELEASE_IF_HELD.ordered({"lock": run.lock}, {"holder": run.token}))
        return self.status(org, namespace, run.erasure_id)

    def _enqueue(self, run: ErasureRun, stale_job_id: str) -> None:
        job_id = self.services.jobs.dispatch(
            RunErasure(run.org, run.namespace, run.erasure_id, replaces=stale_job_id))
        self.redis.hset(run.record, "job_id", job_id)

    def run_background(self, org: str, namespace: str, erasure: str) -> dict[str, Any] | None:
        """The job's body: run the erasure whose record is due; None when there is nothing to
        run (done or failed meanwhile) or another run holds the lock."""
        record = _decoded(self.redis.hgetall(keys.erasure(org, namespace, erasure)))
        if record.get("status") != "running" or not record.get("run_user"):
            self.redis.srem(keys.erasures_due(), _due_member(org, namespace, erasure))
            return None
        run = ErasureRun(org, namespace, record["run_user"], erasure,
                         list(json.loads(record.get("run_subjects") or "[]")),
                         record.get("run_actor", ""), secrets.token_hex(16), PROGRESS.get())
        try:
            self._lock(run)
        except ErasureRunning:
            return None
        try:
            return self._attempt(run)
        finally:
            self._release(*RELEASE_IF_HELD.ordered({"lock": run.lock}, {"holder": run.token}))

    def interrupted(self) -> list[tuple[str, str, str]]:
        """(org, namespace, erasure_id) of every erasure due whose run is dead."""
        found = []
        for member in sorted(text(m) for m in self.redis.smembers(keys.erasures_due())):
            org, namespace, erasure = json.loads(member)
            try:
                receipt = self.status(org, namespace, erasure)
            except ErasureNotFound:
                self.redis.srem(keys.erasures_due(), member)
                continue
            if receipt["status"] == "interrupted":
                found.append((org, namespace, erasure))
            elif receipt["status"] != "running":
                self.redis.srem(keys.erasures_due(), member)
        return found

    def requeue(self, org: str, namespace: str, erasure: str) -> bool:
        """Enqueue a dead run again (its record still reads interrupted under the lock)."""
        record_key = keys.erasure(org, namespace, erasure)
        probe = ErasureRun(org, namespace, "", erasure, [], "", secrets.token_hex(16))
        try:
            self._lock(probe)
        except ErasureRunning:
            return False
        try:
            record = _decoded(self.redis.hgetall(record_key))
            if record.get("status") != "running" or self._job_waits(record):
                return False
            probe.user_id = record.get("run_user", "")
            if not probe.user_id:
                return False
            self._enqueue(probe, record.get("job_id", ""))
            return True
        finally:
            self._release(*RELEASE_IF_HELD.ordered({"lock": probe.lock},
                                                   {"holder": probe.token}))

    # --- in this process ----------------------------------------------------------------------

    def erase(
        self,
        org: str,
        namespace: str,
        user_id: str,
        *,
        actor: str,
        handles: Iterable[str] = (),
        progress: Progress | None = None,
    ) -> dict[str, Any]:
        """Run (or resume) the user's erasure here and now; answers its receipt."""
        run = self._new_run(org, namespace, user_id, actor, handles,
                            progress if progress is not None else PROGRESS.get())
        self._lock(run)
        try:
            return self._attempt(run)
        finally:
            self._release(*RELEASE_IF_HELD.ordered({"lock": run.lock}, {"holder": run.token}))

    # --- one attempt ----------------------------------------------------------------------------

    def _attempt(self, run: ErasureRun) -> dict[str, Any]:
        self._open(run, _decoded(self.redis.hgetall(run.record)), attempt=True)
        with _Heartbeat(self, run):
            try:
                for step in STEPS[:-1]:
                    getattr(self, f"_step_{step}")(run)
                    self._step_done(run, step)
                census = take_census(self.services, run)
                self._step_done(run, "census")
            except LockLost:
                raise ErasureRunning(
                    "another process took this erasure over; ask erasure.status",
                    erasure_id=run.erasure_id, retry_after=5,
                ) from None
            except Exception as error:
                self._fail(run, getattr(error, "code", type(error).__name__), None)
                raise
            if not census.clean:
                self._fail(run, "CENSUS_FOUND_DATA", census)
            else:
                self._finish(run, census)
        return self.status(run.org, run.namespace, run.erasure_id)

    def _open(self, run: ErasureRun, record: dict[str, str], *, attempt: bool) -> None:
        """The record reads running and the markers are set. A new erasure (the first, or one
        of a user who wrote again since the last) starts a fresh record; a retry keeps it."""
        now = self.clock.now_ns()
        if not record or record.get("status") == "done":
            self.redis.delete(run.record)
            self.redis.hset(run.record, mapping={
                "status": "running", "step": "", "attempts": int(attempt), "started_at": now,
                "updated_at": now, "counts": json.dumps(zero_counts()), "census": "",
                "finished_at": "", "aof_rewrite": "", "error": "",
            })
        else:
            self.redis.hset(run.record, mapping={
                "status": "running", "updated_at": now, "error": "", "finished_at": "",
                "step": "",  # a new run does every step again
                "attempts": int(record.get("attempts") or 0) + int(attempt),
            })
            if not self.redis.exists(run.marker):
                # Removed by hand: start from the counts the record copied at the last step.
                saved = json.loads(record.get("counts") or "{}")
                self.redis.hset(run.marker, mapping={
                    kind: int(n) for kind, n in saved.items() if kind in KINDS and int(n)
                } or {"since": now})
        self.redis.hsetnx(run.marker, "since", now)
        for digest in run.subjects:
            self.redis.set(keys.agent_state_subject_erasing(run.org, run.namespace, digest), now)
        # Remembered so that the end of a retry given other handles lifts every marker set.
        marked = set(json.loads(self.redis.hget(run.record, "subjects_marked") or "[]"))
        marked.update(run.subjects)
        self.redis.hset(run.record, mapping={
            "subjects_marked": json.dumps(sorted(marked)),
            "run_user": run.user_id,
            "run_subjects": json.dumps(sorted(marked)),
            "run_actor": run.actor,
        })
        self.redis.sadd(keys.erasures_due(), _due_member(run.org, run.namespace,
                                                         run.erasure_id))

    def _counts(self, run: ErasureRun) -> dict[str, int]:
        counts = zero_counts()
        for kind, value in self.redis.hgetall(run.marker).items():
            if text(kind) in counts:
                counts[text(kind)] = int(value)
        return counts

    def _renew_lock(self, run: ErasureRun) -> None:
        if run.lost or not self.renew(run):
            raise LockLost()

    def _step_done(self, run: ErasureRun, step: str) -> None:
        self._renew_lock(run)
        counts = self._counts(run)
        self.redis.hset(run.record, mapping={
            "step": step, "updated_at": self.clock.now_ns(), "counts": json.dumps(counts),
        })
        if run.progress is not None:
            run.progress(step, counts)
        pause = self.settings.erasure_step_pause_seconds
        if pause and step != STEPS[-1]:
            time.sleep(pause)

    def _drop_keys(self, run: ErasureRun, found: Iterable[str]) -> None:
        """Delete keys of the user's slot, counting what they held on the marker."""
        for batch in batches((k for k in found if k != run.marker), BATCH):
            reply = self._drop(*ERASURE_DROP.ordered(
                {"marker": run.marker}, {"structured_key": PROFILE_KEY},
                more_keys=batch, more_args=[kind_of(k) for k in batch]))
            try:
                raise_for_status("erasure", reply, erasure_id=run.erasure_id)
            except ErasureRunning:
                raise LockLost() from None
            self._renew_lock(run)

    def _count(self, run: ErasureRun, **counts: int) -> None:
        pairs = [item for kind, n in counts.items() if n for item in (kind, n)]
        if pairs:
            self._add(*ERASURE_ADD_COUNTS.ordered({"marker": run.marker}, {}, more_args=pairs))

    # --- steps ----------------------------------------------------------------------------------

    def _step_mark(self, run: ErasureRun) -> None:
        """Done by ``_open`` (the marker exists from then on); kept as a step for progress."""

    def _step_memory(self, run: ErasureRun) -> None:
        user = run.user
        # Pointers first: the id index still lists every row's memory_id until it is dropped.
        removed = 0
        ids = (text(mid) for mid, _ in self.redis.hscan_iter(keys.memory_ids(*user), count=500))
        pointers = keys.memory_pointers(run.org, run.namespace)
        for batch in batches(ids, BATCH):
            values = self.redis.hmget(pointers, batch)
            doomed = [mid for mid, v in zip(batch, values, strict=True)
                      if leftovers.pointer_user(v) == run.user_id]
            if doomed:
                removed += self.redis.hdel(pointers, *doomed)
            # The earlier layout's pointer keys, until the release step has moved them.
            legacy = [keys.memory_pointer(run.org, run.namespace, mid) for mid in batch]
            values = self.redis.mget(legacy)
            doomed = [p for p, v in zip(legacy, values, strict=True)
                      if leftovers.pointer_user(v) == run.user_id]
            if doomed:
                removed += self.redis.delete(*doomed)
        self._count(run, index_entries=removed)
        self._count(run, index_entries=self._remove_namespace_vectors(run))
        rows_key = keys.memory_keys(*user)
        # The names the user's rows had, whose namespace label and agent indexes list the user.
        names: set[str] = set()
        writers: set[str] = set()
        after = "-"
        while True:
            members = [text(m) for m in
                       self.redis.zrangebylex(rows_key, after, "+", start=0, num=BATCH)]
            if not members:
                break
            found = []
            for member in members:
                key, agent, session_id = member.split("\x00")
                names.add(key)
                writers.add(agent)
                found += [keys.memory_row(*user, agent, session_id, key),
                          keys.memory_versions(*user, agent, session_id, key),
                          keys.memory_version_order(*user, agent, session_id, key)]
            self._drop_keys(run, found)
            after = "(" + members[-1]
        self._drop_keys(run, [
            rows_key,
            keys.memory_ids(*user),
            keys.profile_sections(*user),
            keys.memory_live(*user),
            keys.profile_sources(*user),
            keys.profile_source_digest(*user),
            keys.profile_source_expiry(*user),
            keys.structured_meta(*user),
            keys.recall_docs(*user),
            keys.recall_postings(*user),
            keys.recall_stats(*user),
            keys.recall_vectors(*user),
            keys.recall_vectors_due(*user),
            keys.recall_vectors_queued(*user),
            keys.recall_vectors_generation(*user),
            keys.recall_vector_set(*user),
            keys.profile_vector_set(*user),
        ])
        self._count(run, index_entries=self._remove_namespace_entries(run, names, writers))

    def _remove_namespace_vectors(self, run: ErasureRun) -> int:
        """The user's facts' elements in the namespace's vector set, named from the user's
        vector hash (every fact with a vector has its fingerprint there); the sweep reads the
        set whole for any the hash lost."""
        if engine_of(self.redis) != VECTORSET:
            return 0
        namespace_set = keys.recall_namespace_vector_set(run.org, run.namespace)
        removed = 0
        ids = (text(mid) for mid, _ in
               self.redis.hscan_iter(keys.recall_vectors(*run.user), count=500))
        for batch in batches(ids, BATCH):
            pipe = self.redis.pipeline(transaction=False)
            for mid in batch:
                cast(Any, pipe).execute_command("VREM", namespace_set,
                                     keys.recall_namespace_element(run.user_id, mid))
            removed += sum(int(n or 0) for n in pipe.execute())
        return removed

    def _remove_namespace_entries(self, run: ErasureRun, labels: set[str],
                                  agents: set[str]) -> int:
        """The user's entries in the memory plane's namespace indexes (changed users, users
        with sections, users with a structured profile, users per section label and per
        section writer); the sweep finds any other plane's, and any an earlier try lost."""
        org, namespace, user_id = run.user
        indexes = [
            keys.profile_users(org, namespace),
            keys.structured_users(org, namespace),
            keys.recall_users(org, namespace),
            *(keys.profile_label_users(org, namespace, label) for label in sorted(labels)),
            *(keys.profile_agent_users(org, namespace, agent) for agent in sorted(agents)),
        ]
        removed = int(self.redis.zrem(keys.profile_changed_users(org, namespace), user_id))
        for batch in batches(indexes, BATCH):
            pipe = self.redis.pipeline(transaction=False)
            for index in batch:
                pipe.srem(index, user_id)
            removed += sum(pipe.execute())
        return removed

    def _step_working_memory(self, run: ErasureRun) -> None:
        index = keys.working_memory_scopes(*run.user)
        scopes = sorted(text(s) for s in self.redis.smembers(index))
        self._drop_keys(run, [*scopes, index])

    def _step_activity(self, run: ErasureRun) -> None:
        self._drop_keys(run, [keys.profile_reads(*run.user), keys.profile_reads_meta(*run.user)])

    def _step_agent_state(self, run: ErasureRun) -> None:
        erased = 0
        for digest in run.subjects:
            erased += self.agent_states.erase_subject_digest(run.org, run.namespace, digest)
        self._count(run, agent_states=erased)

    def _step_jobs(self, run: ErasureRun) -> None:
        deleted = 0
        for job in list(self.services.jobs.jobs_about(*run.user)):
            if job.status == "started":
                continue  # deleting a running job's hash under its worker: the census waits
            self.services.jobs.purge(job)
            deleted += 1
        self._count(run, jobs=deleted)

    def _step_tokens(self, run: ErasureRun) -> None:
        revoked = self.services.store(TokenStore).revoke_pinned_to(
            run.org, run.namespace, run.user_id, f"erased:{run.erasure_id}")
        self._count(run, tokens=revoked)

    def _step_worker_state(self, run: ErasureRun) -> None:
        self._count(run, index_entries=scrub_stored(self.redis, *run.user, remove=True))

    def _step_sweep(self, run: ErasureRun) -> None:
        self._drop_keys(run, list(leftovers.user_keys(self.redis, run)))
        removed = leftovers.pointers_naming(self.redis, run, remove=True)
        removed += leftovers.namespace_sets(self.redis, run, remove=True)
        removed += leftovers.namespace_vectors(self.redis, run, remove=True)
        self._count(run, index_entries=removed)

    # --- the end --------------------------------------------------------------------------------

    def _fail(self, run: ErasureRun, error: str, census: Census | None) -> None:
        now = self.clock.now_ns()
        counts = self._counts(run)
        self.redis.hset(run.record, mapping={
            "status": "failed", "error": error, "updated_at": now, "counts": json.dumps(counts),
            **({"census": json.dumps(census.as_dict())} if census is not None else {}),
        })
        # Failed is retried by asking again (user.erase), not by the resume pass.
        self.redis.srem(keys.erasures_due(), _due_member(run.org, run.namespace, run.erasure_id))
        self.audit.record(run.org, run.namespace, run.actor, "user.erase", status="failed",
                          counts=counts)

    def _finish(self, run: ErasureRun, census: Census) -> None:
        self._renew_lock(run)
        counts = self._counts(run)
        now = self.clock.now_ns()
        # The receipt first, then the marker: a crash between the two leaves a done receipt and
        # writes still refused, and running the erasure again clears the marker.
        pipe = self.redis.pipeline(transaction=True)  # one key: one slot on a cluster too
        pipe.hset(run.record, mapping={
            "status": "done", "step": "census", "counts": json.dumps(counts),
            "census": json.dumps(census.as_dict()), "finished_at": now, "updated_at": now,
            "error": "",
        })
        pipe.hdel(run.record, *RUN_FIELDS)
        pipe.execute()
        self.redis.srem(keys.erasures_due(), _due_member(run.org, run.namespace, run.erasure_id))
        self.redis.delete(run.marker)
        marked = json.loads(self.redis.hget(run.record, "subjects_marked") or "[]")
        for digest in marked:
            self.redis.delete(keys.agent_state_subject_erasing(run.org, run.namespace, digest))
        self.redis.hdel(run.record, "subjects_marked")
        self.audit.record(run.org, run.namespace, run.actor, "user.erase", status="done",
                          counts=counts)
        # In the worker: the rewrite may wait up to aof.AOF_WAIT_SECONDS for one running.
        self.redis.hset(run.record, "aof_rewrite", aof.rewrite_aof(self.services))


def _due_member(org: str, namespace: str, erasure: str) -> str:
    return json.dumps([org, namespace, erasure], separators=(",", ":"))
