"""The RQ worker a test runs jobs with in its own process: RQ's ``SimpleWorker`` (no fork),
stopping its pub/sub thread as the Loom worker does (``jobs.worker.PromptUnsubscribe``), so
that no burst run waits out the thread's 60 s poll at its end."""

from __future__ import annotations

from rq import SimpleWorker

from jobs.worker import PromptUnsubscribe


class BurstWorker(PromptUnsubscribe, SimpleWorker):
    """``BurstWorker(queues, connection=...).work(burst=True)``: every job queued, then out."""
