"""Every background job a store asks for, declared once: its function, queue, timeout, result
lifetime, failure lifetime and retry policy, keyed by the intent that asks for it
(``app.store.intents``), as ``@op`` declares an op once (``app.registry``).

The dispatcher (``app.job_dispatch``) enqueues an intent with exactly these settings; the job
function itself carries ``@declared_job``, which refuses a function no declaration names, so a
rename on either side fails at import. The function is named here by its dotted path because
the server sits below the jobs (it never imports them) and RQ runs a job by that path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from app.queue_names import BUILDS, MAINTENANCE
from app.store.intents import EmbedUserFacts, Intent, RefreshProfileVectors, RunErasure

HOUR = 3600
DAY = 24 * HOUR

FuncT = TypeVar("FuncT", bound=Callable[..., object])


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """RQ's ``Retry``: at most ``max`` more runs, waiting ``intervals`` seconds between them."""

    max: int
    intervals: tuple[int, ...] = (0,)


@dataclass(frozen=True, slots=True)
class JobSpec:
    func: str
    queue: str
    timeout: int
    result_ttl: int
    failure_ttl: int
    retry: RetryPolicy | None
    description: str
    """A template over the intent's fields (``str.format``), shown by RQ and its dashboard."""

    def describe(self, intent: Intent) -> str:
        return self.description.format(**{name: getattr(intent, name)
                                          for name in intent.__dataclass_fields__})


JOBS: dict[type[Intent], JobSpec] = {
    # One job a user, its id held by the user's queued marker. Not retried by RQ: a failed job
    # leaves its rows due, and the sweep enqueues again for a marker whose job is gone.
    EmbedUserFacts: JobSpec(
        func="jobs.recall_embed.embed_user", queue=BUILDS, timeout=900, result_ttl=600,
        failure_ttl=DAY, retry=None, description="recall embeddings"),
    # Not retried: the user's next section write enqueues again once the marker is down.
    RefreshProfileVectors: JobSpec(
        func="jobs.profile_vectors.refresh_sections", queue=BUILDS, timeout=300,
        result_ttl=600, failure_ttl=DAY, retry=None, description="profile section vectors"),
    # A big user's run may take long: its lock, not RQ's timeout, says it is alive. Not retried
    # by RQ: a failed run is recorded failed (retryable by user.erase) and a dead one is
    # enqueued again by the resume pass.
    RunErasure: JobSpec(
        func="jobs.erasure.run_erasure", queue=MAINTENANCE, timeout=DAY, result_ttl=HOUR,
        failure_ttl=7 * DAY, retry=None, description="erasure {erasure_id:.12}"),
}


def spec_for(intent: Intent) -> JobSpec:
    return JOBS[type(intent)]


def declared_functions() -> set[str]:
    return {spec.func for spec in JOBS.values()}


def declared_job(func: FuncT) -> FuncT:
    """Mark a job function as the one a declaration names; a function no declaration names
    is refused when its module is imported."""
    name = f"{func.__module__}.{func.__qualname__}"
    if name not in declared_functions():
        raise LookupError(f"{name} is not declared in app.job_registry.JOBS")
    func.__dict__["loom_job"] = name
    return func
