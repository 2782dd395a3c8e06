"""RQ jobs whose arguments name a user, found and deleted through RQ's public API.

Every queue RQ knows (``Queue.all``, and Loom's own queues) is read with each of its
registries (started, finished, failed, deferred, scheduled, canceled) and rq-scheduler's
schedule; the jobs are read with ``Job.fetch_many`` and deleted with ``Job.delete``, which
takes them out of their queue and registry, then out of every other registry and the schedule
(a job's hash may say one status while a stale entry sits in another registry). A job is
about the user when its arguments hold the org, the namespace and the user id.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from app.store.batching import batches

if TYPE_CHECKING:
    from rq import Queue
    from rq.job import Job
    from rq.registry import BaseRegistry

BATCH = 200


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
    from rq import Queue

    from app.queue_names import ALL_QUEUES

    names = {queue.name for queue in Queue.all(connection=connection)} | set(ALL_QUEUES)
    return [Queue(name, connection=connection) for name in sorted(names)]


def _registries(queue: Queue, *, started: bool = True) -> list[BaseRegistry]:
    """The queue's registries; the started one lists running jobs, which are never deleted."""
    found: list[BaseRegistry] = [queue.started_job_registry] if started else []
    return found + [queue.finished_job_registry, queue.failed_job_registry,
                    queue.deferred_job_registry, queue.scheduled_job_registry,
                    queue.canceled_job_registry]


def _scheduler(connection: Any) -> Any:
    from rq_scheduler import Scheduler

    return Scheduler(connection=connection)


def _job_ids(connection: Any) -> list[str]:
    """Every job id a queue, a registry or rq-scheduler holds, each once."""
    found: dict[str, None] = {}
    for queue in _queues(connection):
        found.update(dict.fromkeys(queue.get_job_ids()))
        for registry in _registries(queue):
            found.update(dict.fromkeys(registry.get_job_ids(cleanup=False)))
    found.update(dict.fromkeys(job.id for job in _scheduler(connection).get_jobs()))
    return list(found)


def jobs_about(connection: Any, org: str, namespace: str,
               user_id: str) -> Iterator[tuple[Job, bool]]:
    """Every job whose arguments name (org, namespace, user_id), and whether it is running."""
    from rq.job import Job, JobStatus

    for batch in batches(_job_ids(connection), BATCH):
        try:
            jobs = Job.fetch_many(batch, connection=connection)
        except Exception:  # one unreadable hash: read them one by one
            jobs = [fetch(connection, job_id) for job_id in batch]
        for job in jobs:
            if job is not None and names_user(job, org, namespace, user_id):
                yield job, job.get_status(refresh=False) == JobStatus.STARTED


def fetch(connection: Any, job_id: str) -> Job | None:
    from rq.job import Job

    try:
        return Job.fetch(job_id, connection=connection)
    except Exception:  # gone, or not a job hash
        return None


def delete_job(connection: Any, job: Job) -> None:
    """The job's hash, its queue entry and its entry in every registry and the schedule (a job
    that is not running: a running one is left to the census)."""
    job.delete(remove_from_queue=True)
    if job.origin:
        from rq import Queue

        for registry in _registries(Queue(job.origin, connection=connection), started=False):
            registry.remove(job.id)
    scheduler = _scheduler(connection)
    if job.id in scheduler:
        scheduler.cancel(job.id)
