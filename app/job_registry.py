"""Every background job function, declared once with its queue, timeout, result lifetime,
failure lifetime and retry policy, as ``@op`` declares an op once (``app.registry``).

``JOBS`` holds the jobs a store asks for, keyed by the intent that asks (``app.store.intents``).
``PERIODIC`` holds the ones the scheduler enqueues every interval (``jobs.scheduler``), and
``PASS_JOBS`` the ones a structured-profile pass fans out itself; for those two, what depends on
the settings or the pass (the interval; a pass's time left) is set at enqueue by the rule their
declaration names.

The dispatcher (``app.job_dispatch``) enqueues an intent with exactly these settings; the job
function itself carries ``@declared_job``, which refuses a function no declaration names, so a
rename on either side fails at import. The function is named here by its dotted path because
the server sits below the jobs (it never imports them) and RQ runs a job by that path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from app.queue_names import BUILDS, MAINTENANCE, PASSES
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


# RQ's own default, which the periodic jobs ran under before it was declared here.
PERIODIC_TIMEOUT_SECONDS = 180


@dataclass(frozen=True, slots=True)
class PeriodicSpec:
    """A job the scheduler enqueues every interval (a setting). Its result lifetime is ten
    intervals, at least an hour (``jobs.periodic.Periodic.result_ttl``): rq-scheduler drops a
    schedule whose hash expired. Not retried: the next interval runs it again."""

    func: str
    queue: str
    timeout: int = PERIODIC_TIMEOUT_SECONDS
    retry: RetryPolicy | None = None


AGENT_STATE_SWEEP = PeriodicSpec("jobs.agent_state_sweep.sweep", MAINTENANCE)
ERASURE_RESUME = PeriodicSpec("jobs.erasure.resume_pass", MAINTENANCE)
RECALL_EMBED_SWEEP = PeriodicSpec("jobs.recall_embed.sweep", MAINTENANCE)
STRUCTURED_PASS = PeriodicSpec("jobs.structured_profile.run_pass", PASSES)
CONSOLIDATION_PASS = PeriodicSpec("jobs.consolidation.run_pass", PASSES)
PERIODIC = (AGENT_STATE_SWEEP, ERASURE_RESUME, RECALL_EMBED_SWEEP, STRUCTURED_PASS,
            CONSOLIDATION_PASS)


@dataclass(frozen=True, slots=True)
class PassJobSpec:
    """A job a structured-profile pass fans out. Its timeout is the pass's time left plus a
    grace, and its result and failure lifetimes that plus the time the closing job may take
    to read them (``jobs.structured_profile._fan_out``). Not retried: the next pass takes up a
    user whose build failed, after its backoff."""

    func: str
    queue: str
    retry: RetryPolicy | None = None


BUILD_USER = PassJobSpec("jobs.structured_profile.build_user_job", BUILDS)
END_PASS = PassJobSpec("jobs.structured_profile.end_pass", PASSES)
PASS_JOBS = (BUILD_USER, END_PASS)


def spec_for(intent: Intent) -> JobSpec:
    return JOBS[type(intent)]


def declared_functions() -> set[str]:
    return ({spec.func for spec in JOBS.values()} | {spec.func for spec in PERIODIC}
            | {spec.func for spec in PASS_JOBS})


def declared_job(func: FuncT) -> FuncT:
    """Mark a job function as the one a declaration names; a function no declaration names
    is refused when its module is imported."""
    name = f"{func.__module__}.{func.__qualname__}"
    if name not in declared_functions():
        raise LookupError(f"{name} is not declared in app.job_registry.JOBS")
    func.__dict__["loom_job"] = name
    return func
