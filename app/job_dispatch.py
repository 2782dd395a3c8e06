"""The one dispatcher of background work: it enqueues a store's intent
(``app.store.intents``) on RQ with the settings the job registry declares for it
(``app.job_registry``), and answers what a store may ask of the queues, through RQ's public API.

Jobs about a user (the erasure's ``jobs`` step and its census): every queue RQ knows
(``Queue.all``, and Loom's own queues) is read with each of its registries (started, finished,
failed, deferred, scheduled, canceled) and rq-scheduler's schedule; the jobs are read with
``Job.fetch_many`` and deleted with ``Job.delete``, which takes them out of their queue and
registry, then out of every other registry and the schedule (a job's hash may say one status
while a stale entry sits in another registry). A job is about the user when its arguments hold
the org, the namespace and the user id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from redis import Redis
from rq import Queue, Retry
from rq.job import Job, JobStatus
from rq.registry import BaseRegistry
from rq_scheduler import Scheduler

from app.job_registry import spec_for
from app.queue_names import ALL_QUEUES
from app.store.batching import batches
from app.store.intents import Intent, QueuedJob

BATCH = 200


class JobDispatcher:
    """``services.jobs``: built by ``app.services.Services`` on RQ's connection, which it
    asks for on first use (a process that never enqueues never connects to the queues)."""

    def __init__(self, connection: Callable[[], Redis]) -> None:
        self._connection = connection

    @property
    def connection(self) -> Redis:
        return self._connection()

    def dispatch(self, intent: Intent) -> str:
        spec = spec_for(intent)
        connection = self.connection
        replaces = getattr(intent, "replaces", "")
        if replaces:
            self.delete(replaces)
        job = Queue(spec.queue, connection=connection).enqueue(
            spec.func, *intent.args(), job_id=intent.job_id,
            job_timeout=spec.timeout, result_ttl=spec.result_ttl, failure_ttl=spec.failure_ttl,
            retry=(Retry(max=spec.retry.max, interval=list(spec.retry.intervals))
                   if spec.retry else None),
            description=spec.describe(intent),
        )
        return str(job.id)

    def job(self, job_id: str) -> QueuedJob | None:
        job = fetch(self.connection, job_id)
        if job is None:
            return None
        return _queued(job)

    def delete(self, job_id: str) -> None:
        job = fetch(self.connection, job_id)
        if job is not None:
            job.delete(remove_from_queue=True)

    def jobs_about(self, org: str, namespace: str, user_id: str) -> Iterator[QueuedJob]:
        for job in jobs_about(self.connection, org, namespace, user_id):
            yield QueuedJob(job.id, _status(job), _aware(job.started_at))

    def purge(self, job: QueuedJob) -> None:
        found = fetch(self.connection, job.id)
        if found is not None:
            delete_job(self.connection, found)


def _queued(job: Job) -> QueuedJob:
    status = _status(job)
    # Its place in its queue: only a queued job has one (get_position reads the queue's list).
    in_queue = status == JobStatus.QUEUED.value and job.get_position() is not None
    return QueuedJob(job.id, status, _aware(job.started_at), in_queue)


def _status(job: Job) -> str:
    status = job.get_status(refresh=False)
    return status.value if isinstance(status, JobStatus) else str(status or "")


def _aware(moment: datetime | None) -> datetime | None:
    """RQ writes its times in UTC, without a zone in some releases."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def _strings_in(value: Any, depth: int = 0) -> Iterator[str]:
    """Every string in a job's arguments (nested lists, tuples, dicts, keys included)."""
    if depth > 8:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings_in(key, depth + 1)
            yield from _strings_in(item, depth + 1)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            yield from _strings_in(item, depth + 1)


def names_user(job: Job, org: str, namespace: str, user_id: str) -> bool:
    wanted = {org, namespace, user_id}
    try:
        strings = set(_strings_in(list(job.args))) | set(_strings_in(dict(job.kwargs)))
    except Exception:  # undecodable payload: judge by its description
        description = job.description or ""
        return all(repr(text) in description for text in wanted)
    return wanted <= strings


def _queues(connection: Any) -> list[Queue]:
    names = {queue.name for queue in Queue.all(connection=connection)} | set(ALL_QUEUES)
    return [Queue(name, connection=connection) for name in sorted(names)]


def _registries(queue: Queue, *, started: bool = True) -> list[BaseRegistry]:
    """The queue's registries; the started one lists running jobs, which are never deleted."""
    found: list[BaseRegistry] = [queue.started_job_registry] if started else []
    return found + [queue.finished_job_registry, queue.failed_job_registry,
                    queue.deferred_job_registry, queue.scheduled_job_registry,
                    queue.canceled_job_registry]


def _job_ids(connection: Any) -> list[str]:
    """Every job id a queue, a registry or rq-scheduler holds, each once."""
    found: dict[str, None] = {}
    for queue in _queues(connection):
        found.update(dict.fromkeys(queue.get_job_ids()))
        for registry in _registries(queue):
            found.update(dict.fromkeys(registry.get_job_ids(cleanup=False)))
    found.update(dict.fromkeys(job.id for job in Scheduler(connection=connection).get_jobs()))
    return list(found)


def jobs_about(connection: Any, org: str, namespace: str, user_id: str) -> Iterator[Job]:
    """Every job whose arguments name (org, namespace, user_id)."""
    for batch in batches(_job_ids(connection), BATCH):
        try:
            jobs = Job.fetch_many(batch, connection=connection)
        except Exception:  # one unreadable hash: read them one by one
            jobs = [fetch(connection, job_id) for job_id in batch]
        for job in jobs:
            if job is not None and names_user(job, org, namespace, user_id):
                yield job


def fetch(connection: Any, job_id: str) -> Job | None:
    try:
        return Job.fetch(job_id, connection=connection)
    except Exception:  # gone, or not a job hash
        return None


def delete_job(connection: Any, job: Job) -> None:
    """The job's hash, its queue entry and its entry in every registry and the schedule (a job
    that is not running: a running one is left to the census)."""
    job.delete(remove_from_queue=True)
    if job.origin:
        for registry in _registries(Queue(job.origin, connection=connection), started=False):
            registry.remove(job.id)
    scheduler = Scheduler(connection=connection)
    if job.id in scheduler:
        scheduler.cancel(job.id)
