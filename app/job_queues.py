"""What RQ holds, read at scrape time for ``GET /metrics``: each queue's depth, the age of its
oldest waiting job, its failed jobs and its workers; the rq-scheduler processes alive and the
jobs they hold.

It reads RQ's own keys through RQ's and rq-scheduler's public classes on the queue connection,
so the web reports the queues without importing the jobs that consume them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from redis import Redis
from rq import Queue, Worker
from rq.job import Job
from rq.registry import FailedJobRegistry
from rq_scheduler import Scheduler

from app.queue_names import ALL_QUEUES

if TYPE_CHECKING:
    from app.store.services import StoreServices


@dataclass(frozen=True)
class QueueReading:
    name: str
    depth: int
    oldest_age_seconds: float
    failed: int
    workers: int


@dataclass(frozen=True)
class QueueCensus:
    queues: list[QueueReading]
    schedulers_alive: int
    scheduled_jobs: int


class JobQueueReader:
    def __init__(self, services: StoreServices) -> None:
        self.services = services

    def read(self, now: datetime, queues: Iterable[str] = ALL_QUEUES) -> QueueCensus:
        connection = self.services.queue_redis
        readings = []
        for name in queues:
            queue = Queue(name, connection=connection)
            readings.append(QueueReading(
                name=name,
                depth=queue.count,
                oldest_age_seconds=_oldest_age(queue, now),
                failed=FailedJobRegistry(queue=queue).count,
                workers=Worker.count(queue=queue),
            ))
        return QueueCensus(
            queues=readings,
            schedulers_alive=_schedulers_alive(connection),
            scheduled_jobs=int(connection.zcard(Scheduler.scheduled_jobs_key)),
        )


def _schedulers_alive(connection: Redis) -> int:
    """rq-scheduler keeps one key per process, expiring unless its heartbeat renews it, and
    marks it with a death time when the process stops cleanly."""
    alive = 0
    for key in connection.scan_iter(match=Scheduler.redis_scheduler_namespace_prefix + "*",
                                    count=100):
        if not connection.hexists(key, "death"):
            alive += 1
    return alive


def waited_seconds(job: Job | None, now: datetime) -> float:
    """How long ``job`` has been (or was) in its queue at ``now``: from RQ's enqueue time,
    which RQ writes without a zone in UTC (0 for no job, or one never enqueued)."""
    if job is None or job.enqueued_at is None:
        return 0.0
    enqueued = job.enqueued_at
    if enqueued.tzinfo is None:
        enqueued = enqueued.replace(tzinfo=UTC)
    return max(0.0, (now - enqueued).total_seconds())


def _oldest_age(queue: Queue, now: datetime) -> float:
    # The job at the head of the queue: an offset and a length (a length of 0 is no job).
    job_ids = queue.get_job_ids(0, 1)
    if not job_ids:
        return 0.0
    return waited_seconds(queue.fetch_job(job_ids[0]), now)
