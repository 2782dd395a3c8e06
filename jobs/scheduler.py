"""``python -m jobs.scheduler``: registers Loom's periodic jobs, then runs rq-scheduler.

Periodic jobs are data (``PERIODIC``): each definition gets a deterministic id from a hash of
itself, registering is idempotent, and a job no longer defined is cancelled.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rq_scheduler import Scheduler

from app.logs import configure_logging
from app.settings import Settings, load_settings
from app.store.connection import UNAVAILABLE_ERRORS
from jobs.outage import ride_out
from jobs.queues import queue_connection

JOB_ID_PREFIX = "loom-periodic-"
log = logging.getLogger("loom.jobs.scheduler")


@dataclass(frozen=True)
class Periodic:
    func: str
    queue: str
    interval_seconds: int
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def job_id(self) -> str:
        spec = json.dumps(
            [self.func, self.queue, self.interval_seconds, self.kwargs], sort_keys=True
        )
        return JOB_ID_PREFIX + hashlib.sha256(spec.encode()).hexdigest()[:16]


def periodic_jobs(settings: Settings) -> list[Periodic]:
    """Every periodic job Loom runs, from the settings."""
    from jobs import agent_state_sweep, consolidation
    from jobs.queues import PASSES
    from jobs.structured_profile import PASS_FUNC

    definitions = [
        agent_state_sweep.periodic(settings),
        Periodic(PASS_FUNC, PASSES, settings.structured_profile_interval_seconds),
    ]
    if settings.profile_consolidation_enabled:
        # Off by default (seed 000): no fold is scheduled, so no fold's model call is made.
        definitions.append(Periodic(consolidation.PASS_FUNC, PASSES,
                                    settings.profile_consolidation_interval_seconds))
    return definitions


def register(scheduler: Scheduler, definitions: list[Periodic]) -> list[str]:
    """Schedule each definition once; cancel Loom's periodic jobs no longer defined."""
    wanted = {definition.job_id: definition for definition in definitions}
    existing = {
        job.id for job in scheduler.get_jobs() if job.id.startswith(JOB_ID_PREFIX)
    }
    for stale in existing - set(wanted):
        scheduler.cancel(stale)
    for job_id, definition in wanted.items():
        if job_id in existing:
            continue
        scheduler.schedule(
            scheduled_time=datetime.now(UTC),
            func=definition.func,
            kwargs=definition.kwargs,
            interval=definition.interval_seconds,
            repeat=None,
            queue_name=definition.queue,
            id=job_id,
            result_ttl=definition.interval_seconds * 2,
        )
    return sorted(wanted)


class LoomScheduler(Scheduler):
    """rq-scheduler whose bookkeeping on the way out survives Redis being away.

    ``run()`` ends in ``remove_lock`` and ``register_death``, and so does its SIGTERM handler;
    with Redis away each raised ConnectionError, which ended the process or swallowed the stop.
    Both records expire by themselves, so a failure to write them is only logged.

    Every tick registers the periodic jobs again before enqueuing (idempotent: one read when
    nothing is missing), so a Redis that came back without them (restarted past its fsync
    window, or empty) gets its schedule back without anyone restarting the scheduler.
    """

    def __init__(self, *args: Any, definitions: list[Periodic] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.definitions = list(definitions or [])

    def enqueue_jobs(self) -> list[Any]:
        if self.definitions:
            register(self, self.definitions)
        return super().enqueue_jobs()

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
    scheduler = LoomScheduler(connection=connection, interval=5,
                              definitions=periodic_jobs(settings))
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
