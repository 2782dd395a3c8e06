"""The erasure saga's jobs: the background run of one erasure, and the resume pass.

``run_erasure(org, namespace, erasure_id)`` is what ``user.erase`` enqueues on the maintenance
queue; its arguments never name the user (the erasure's record holds what the run needs while
it is due). The saga's outcome is its receipt, read with ``erasure.status``; the job itself
ends without an exception whatever the outcome, so no traceback naming the user's keys lands in
RQ's failed registry.

``resume_interrupted`` enqueues again every erasure whose run died (a worker killed mid-saga:
its lock expired, its job no longer runs). Each worker calls it when it starts, and the
scheduler runs ``resume_pass`` every ``LOOM_ERASURE_RESUME_INTERVAL_SECONDS``; the saga's steps
are idempotent, so the new run starts over and its counts stay exact.
"""

from __future__ import annotations

import logging

from app.errors import ErasureRunning
from app.job_registry import ERASURE_RESUME, declared_job
from app.services import Services
from app.settings import Settings
from app.store.erasure import ErasureStore
from jobs.context import services as job_services
from jobs.periodic import Periodic

log = logging.getLogger("loom.jobs.erasure")

RESUME_FUNC = ERASURE_RESUME.func


@declared_job
def run_erasure(org: str, namespace: str, erasure_id: str) -> str:
    store = job_services().store(ErasureStore)
    try:
        receipt = store.run_background(org, namespace, erasure_id)
    except ErasureRunning:
        return "taken over"
    except Exception as error:  # recorded failed (retryable) by the saga itself
        log.warning("erasure %s failed: %s", erasure_id[:12], type(error).__name__)
        return "failed"
    return "nothing to run" if receipt is None else str(receipt["status"])


def resume_interrupted(services: Services) -> int:
    """Enqueue every interrupted erasure again; how many were."""
    store = services.store(ErasureStore)
    resumed = 0
    for org, namespace, erasure_id in store.interrupted():
        if store.requeue(org, namespace, erasure_id):
            log.info("erasure %s resumed", erasure_id[:12])
            resumed += 1
    return resumed


@declared_job
def resume_pass() -> int:
    return resume_interrupted(job_services())


def periodic(settings: Settings) -> Periodic:
    return Periodic.of(ERASURE_RESUME, settings.erasure_resume_interval_seconds)
