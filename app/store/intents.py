"""Background work a store asks for, as plain data, and the port that carries it to a queue.

A store never enqueues and never reads a queue itself: it builds an intent (embed a user's
facts, refresh a user's section vectors, run an erasure) and hands it to ``services.jobs``,
the process's dispatcher (``app.job_dispatch``), which enqueues it with the settings the job
registry declares for it (``app.job_registry``). What a store needs to know about a queued
job (whether it still waits, which jobs name a user) it asks the same port, so nothing under
``app/store`` imports RQ or names a job function.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol


@dataclass(frozen=True, slots=True)
class EmbedUserFacts:
    """Embed the facts of one user that wait for a vector, as the job ``job_id``: the id the
    user's queued marker already holds, so a write and the sweep never queue two."""

    org: str
    namespace: str
    user_id: str
    job_id: str

    def args(self) -> tuple[str, ...]:
        return (self.org, self.namespace, self.user_id)


@dataclass(frozen=True, slots=True)
class RefreshProfileVectors:
    """Refresh the section vectors of one user's profile after a section was written."""

    org: str
    namespace: str
    user_id: str
    job_id: str | None = None

    def args(self) -> tuple[str, ...]:
        return (self.org, self.namespace, self.user_id)


@dataclass(frozen=True, slots=True)
class RunErasure:
    """Run an erasure's saga in the background. Its arguments name the erasure, never the user
    id; ``replaces`` is the id of an earlier job of the same erasure, deleted first."""

    org: str
    namespace: str
    erasure_id: str
    replaces: str = ""
    job_id: str | None = None

    def args(self) -> tuple[str, ...]:
        return (self.org, self.namespace, self.erasure_id)


Intent = EmbedUserFacts | RefreshProfileVectors | RunErasure


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """What a store may know of a job: its id, its status (RQ's names: queued, deferred,
    scheduled, started, finished, failed, ...), when it started (aware, UTC), and whether it
    still waits at a place in its queue."""

    id: str
    status: str
    started_at: datetime | None = None
    in_queue: bool = False

    @property
    def due(self) -> bool:
        """Waiting to run: queued, deferred or scheduled."""
        return self.status in ("queued", "deferred", "scheduled")


class JobQueues(Protocol):
    """The dispatcher's side a store uses (``app.job_dispatch.JobDispatcher``)."""

    def dispatch(self, intent: Intent) -> str:
        """Enqueue ``intent`` as its declared job; its job id. A queue that cannot be reached
        raises ``redis.RedisError`` (the store decides what a failed enqueue costs)."""
        ...

    def job(self, job_id: str) -> QueuedJob | None:
        """The job ``job_id`` (None when it is gone or unreadable)."""
        ...

    def delete(self, job_id: str) -> None:
        """Delete the job ``job_id`` and its queue entry (nothing when it is gone)."""
        ...

    def jobs_about(self, org: str, namespace: str, user_id: str) -> Iterator[QueuedJob]:
        """Every job, in any queue, registry or schedule, whose arguments name the user (each
        with its status and start; ``in_queue`` is not read for these)."""
        ...

    def purge(self, job: QueuedJob) -> None:
        """Delete a job found by ``jobs_about`` from its queue, every registry and the
        schedule (one that is not running)."""
        ...
