"""``python -m jobs.scheduler``: registers Loom's periodic jobs, then runs rq-scheduler.

Periodic jobs are data (``periodic_jobs``): each definition gets a deterministic id from a hash
of itself, registering is idempotent, and a job no longer defined is cancelled.

rq-scheduler keeps a periodic job as two things: the job's hash (``rq:job:<id>``, whose meta
holds the interval) and its entry in ``rq:scheduler:scheduled_jobs``. When it finds an entry
whose hash is gone, it removes the entry for good (``Scheduler.get_jobs``); and a finished
job's hash expires after its ``result_ttl``. So a periodic job's ``result_ttl`` is ten of its
intervals, at least an hour (``Periodic.result_ttl``: each run sets the expiry again, and RQ
logs how long it keeps the result instead of that it never expires), and every tick of the
scheduler puts back whichever half of a definition has gone missing.
"""

from __future__ import annotations

import logging
import math
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq_scheduler import Scheduler
from rq_scheduler.utils import to_unix

from app.clock import Clock
from app.job_registry import CONSOLIDATION_PASS, STRUCTURED_PASS
from app.logs import configure_logging
from app.settings import Settings, load_settings
from app.store.connection import UNAVAILABLE_ERRORS
from jobs import agent_state_sweep, erasure, recall_embed
from jobs.outage import ride_out
from jobs.periodic import JOB_ID_PREFIX, Periodic
from jobs.queues import queue_connection

__all__ = ["JOB_ID_PREFIX", "LoomScheduler", "Periodic", "periodic_jobs", "register"]

# How long the hash of a job no longer defined stays readable (its last result) once cancelled.
CANCELLED_JOB_TTL_SECONDS = 3600
# The scheduler polls at least this often, and four times per shortest interval below that,
# so a 1 s interval runs a pass about every second instead of at each of a 5 s poll, and a
# tick is late by at most a quarter of its interval.
MAX_POLL_SECONDS = 5.0
POLLS_PER_INTERVAL = 4
log = logging.getLogger("loom.jobs.scheduler")


def periodic_jobs(settings: Settings) -> list[Periodic]:
    """Every periodic job Loom runs, from the settings."""
    definitions = [
        agent_state_sweep.periodic(settings),
        erasure.periodic(settings),  # enqueues again an erasure whose worker died
        Periodic.of(STRUCTURED_PASS, settings.structured_profile_interval_seconds),
    ]
    if settings.embeddings_configured:
        # Vectors for facts no write's job embedded; with no endpoint it could call nothing.
        definitions.append(recall_embed.periodic(settings))
    if settings.profile_consolidation_enabled:
        # Off by default (seed 000): no fold is scheduled, so no fold's model call is made.
        definitions.append(Periodic.of(CONSOLIDATION_PASS,
                                       settings.profile_consolidation_interval_seconds))
    return definitions


def poll_seconds(definitions: list[Periodic]) -> float:
    """How often the scheduler looks for due jobs: a quarter of the shortest interval, at most
    5 s."""
    shortest = min((d.interval_seconds for d in definitions),
                   default=POLLS_PER_INTERVAL * MAX_POLL_SECONDS)
    return min(MAX_POLL_SECONDS, shortest / POLLS_PER_INTERVAL)


def _schedule(scheduler: Scheduler, definition: Periodic, when: datetime) -> None:
    scheduler.schedule(
        scheduled_time=when,
        func=definition.func,
        kwargs=definition.kwargs,
        interval=definition.interval_seconds,
        repeat=None,
        queue_name=definition.queue,
        id=definition.job_id,
        result_ttl=definition.result_ttl,
        timeout=definition.timeout,
    )


def register(scheduler: Scheduler, definitions: list[Periodic]) -> list[str]:
    """Schedule each definition once; put back one that lost its hash or its schedule entry;
    cancel Loom's periodic jobs no longer defined.

    Idempotent, and cheap when nothing is missing (one read of the schedule, one of each
    hash). Run under rq-scheduler's lock, so two scheduler processes never register at once;
    a definition's id is its only schedule entry, so even a second registration adds none.
    """
    wanted = {definition.job_id: definition for definition in definitions}
    connection = scheduler.connection
    # get_jobs drops the entries whose hash is gone: those are scheduled again below.
    existing = {
        job.id: job for job in scheduler.get_jobs() if job.id.startswith(JOB_ID_PREFIX)
    }
    for stale in set(existing) - set(wanted):
        scheduler.cancel(stale)
        connection.expire(existing[stale].key, CANCELLED_JOB_TTL_SECONDS)
    now = datetime.now(UTC)
    for job_id, definition in wanted.items():
        if job_id in existing:
            if existing[job_id].result_ttl != definition.result_ttl:
                # Scheduled by an older release: with a result_ttl that could expire the hash
                # before the next poll, or none (kept for good): this definition's from now on.
                connection.hset(existing[job_id].key, "result_ttl", definition.result_ttl)
                connection.expire(existing[job_id].key, definition.result_ttl)
            continue
        job = _fetch(scheduler, job_id)
        if job is None or job.meta.get("interval") != definition.interval_seconds:
            _schedule(scheduler, definition, now)
            continue
        # The entry went missing but the hash is whole: put the entry back without writing
        # over the hash (the job may be queued or running right now). A job waiting or
        # running comes round again an interval from now, as rq-scheduler itself would.
        busy = job.get_status(refresh=False) in (JobStatus.QUEUED, JobStatus.STARTED)
        due = now + timedelta(seconds=definition.interval_seconds) if busy else now
        connection.zadd(scheduler.scheduled_jobs_key, {job_id: to_unix(due)}, nx=True)
    return sorted(wanted)


def _fetch(scheduler: Scheduler, job_id: str) -> Job | None:
    try:
        return Job.fetch(job_id, connection=scheduler.connection)
    except NoSuchJobError:
        return None


# rq-scheduler ships no type information: its Scheduler is Any to mypy.
class LoomScheduler(Scheduler):  # type: ignore[misc]
    """rq-scheduler whose bookkeeping on the way out survives Redis being away.

    ``run()`` ends in ``remove_lock`` and ``register_death``, and so does its SIGTERM handler;
    with Redis away each raised ConnectionError, which ended the process or swallowed the stop.
    Both records expire by themselves, so a failure to write them is only logged.

    Every tick registers the periodic jobs again before enqueuing (idempotent: one read when
    nothing is missing), so a periodic job whose hash or schedule entry went missing (deleted,
    evicted, or a Redis that came back without them) is put back without anyone restarting
    the scheduler. ``clock`` places a job's next tick (a test passes a ``FrozenClock``).
    """

    def __init__(self, *args: Any, definitions: list[Periodic] | None = None,
                 clock: Clock | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.definitions = list(definitions or [])
        self.clock = clock if clock is not None else Clock()

    def enqueue_job(self, job: Job) -> None:
        """Enqueue a due job; a periodic one comes round again one interval after the time it
        was due, not after the poll that found it (rq-scheduler's own rule), so a job's ticks
        do not drift later by up to a poll each time. Ticks missed (the scheduler was down)
        are skipped, not run in a burst."""
        due = self.connection.zscore(self.scheduled_jobs_key, job.id)
        super().enqueue_job(job)
        interval = job.meta.get("interval")
        if due is None or not interval or job.meta.get("repeat") == 0:
            return
        now = self.clock.now()
        step = int(interval)
        following = float(due) + step
        if following <= now:
            following += (math.floor((now - following) / step) + 1) * step
        self.connection.zadd(self.scheduled_jobs_key, {job.id: following}, xx=True)

    def enqueue_jobs(self) -> list[Any]:
        if self.definitions:
            register(self, self.definitions)
        enqueued: list[Any] = super().enqueue_jobs()
        return enqueued

    def register_death(self) -> None:
        try:
            super().register_death()
        except UNAVAILABLE_ERRORS as error:
            log.warning("could not record the scheduler's death: %s", error)

    def remove_lock(self) -> None:
        try:
            super().remove_lock()
        except UNAVAILABLE_ERRORS as error:
            log.warning("could not release the scheduler's lock: %s", error)


def main() -> int:
    settings = load_settings()
    configure_logging(settings.log_format)
    connection = queue_connection(settings)
    definitions = periodic_jobs(settings)
    scheduler = LoomScheduler(connection=connection, interval=poll_seconds(definitions),
                              definitions=definitions)
    runs = 0

    def run() -> bool:
        nonlocal runs
        if runs:
            # The last run's birth record may have outlived the outage (AOF): it is this
            # process's own, so close it, or rq-scheduler refuses to register again.
            scheduler.register_death()
        runs += 1
        scheduler.run()
        return True

    ride_out(run, connection, "scheduler")
    return 0


if __name__ == "__main__":
    sys.exit(main())
