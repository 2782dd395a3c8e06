"""The RQ worker a test runs jobs with in its own process: RQ's ``SimpleWorker`` (no fork),
stopping its pub/sub thread as the Loom worker does (``jobs.worker.PromptUnsubscribe``), so
that no burst run waits out the thread's 60 s poll at its end; a job is bounded by a timer
thread, not SIGALRM, and no signal handler is installed, so it runs in any thread.

``run_queued(services, queue_name)`` drains one queue with it, the jobs seeing the test's own
services, as a worker process's would."""

from __future__ import annotations

from typing import Any

from rq import Queue, SimpleWorker
from rq.timeouts import TimerDeathPenalty

from jobs import context
from jobs.worker import PromptUnsubscribe


class BurstWorker(PromptUnsubscribe, SimpleWorker):
    """``BurstWorker(queues, connection=...).work(burst=True)``: every job queued, then out."""

    death_penalty_class = TimerDeathPenalty

    def _install_signal_handlers(self) -> None:
        """Signal handlers belong to the main thread, and a test may run this in another."""


class CommandlessBurstWorker(BurstWorker):
    """A burst worker with no command channel (no pub/sub thread at all): for a loop that
    starts one every few milliseconds beside a test (``erasure_worker_thread``), where each
    channel's setup would widen the moments no worker holds the job."""

    def subscribe(self) -> None:
        """No commands are sent to a test's worker (and unsubscribe then has no thread)."""


def run_queued(services: Any, queue_name: str) -> None:
    """Every job queued on ``queue_name``, run in this process with ``services``."""
    context.use_services(services)
    try:
        BurstWorker([Queue(queue_name, connection=services.queue_redis)],
                    connection=services.queue_redis).work(burst=True, logging_level="WARNING")
    finally:
        context.use_services(None)
