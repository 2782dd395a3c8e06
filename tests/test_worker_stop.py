"""An RQ worker's end never waits out its pub/sub thread's 60 s poll (jobs.worker
PromptUnsubscribe), whichever thread runs first after the unsubscribe is sent.

RQ sends the unsubscribe, then stops the thread, and redis-py's stop waits for it: a thread
that reads the unsubscribe's reply before its running flag is cleared loops into a read that
waits out the poll. These tests make that ordering certain (the worker's own thread pauses
right after sending the unsubscribe, as a busy machine pauses it) against a real server.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from rq import Queue, SimpleWorker

from jobs.worker import LoomWorker, PromptUnsubscribe
from tests.support.rq_worker import BurstWorker

pytestmark = pytest.mark.real

# RQ polls every 60 s; these workers poll every 8 s, so that the run that waits the poll out
# (RQ's own order) costs the suite 8 s, not a minute.
POLL = 8.0
WELL_UNDER_THE_POLL = 6.0


class _PausesAfterUnsubscribing:
    """RQ's subscribe with a shorter poll; after the unsubscribe is on the wire, the worker's
    own thread sleeps, so the pub/sub thread reads the reply first."""

    connection: Any
    pubsub: Any
    pubsub_thread: Any
    pubsub_channel_name: str
    handle_payload: Any
    _pubsub_exception_handler: Any

    def subscribe(self) -> None:
        pubsub = self.pubsub = self.connection.pubsub()
        pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = pubsub.run_in_thread(
            sleep_time=POLL, daemon=True, exception_handler=self._pubsub_exception_handler)
        send = pubsub.unsubscribe

        def unsubscribe_then_pause(*args: Any, **kwargs: Any) -> Any:
            answer = send(*args, **kwargs)
            time.sleep(0.5)
            return answer

        pubsub.unsubscribe = unsubscribe_then_pause


class _PausingBurstWorker(_PausesAfterUnsubscribing, BurstWorker):
    pass


class _PausingRqWorker(_PausesAfterUnsubscribing, SimpleWorker):
    pass


def _burst(worker_class: type, queue_url: str) -> tuple[float, Any]:
    connection = redis.Redis.from_url(queue_url)
    queue = Queue("stop-test", connection=connection)
    queue.enqueue(sum, [1, 2])
    worker = worker_class([queue], connection=connection)
    began = time.monotonic()
    worker.work(burst=True, logging_level="WARNING")
    return time.monotonic() - began, worker


def test_a_burst_run_ends_without_waiting_out_the_poll(queue_url):
    took, worker = _burst(_PausingBurstWorker, queue_url)
    assert took < WELL_UNDER_THE_POLL, f"the burst run took {took:.1f} s"
    assert worker.pubsub_thread is not None and not worker.pubsub_thread.is_alive()


def test_the_pause_does_hold_rqs_own_order_for_the_poll(queue_url):
    """The pause reproduces what PromptUnsubscribe fixes: with RQ's own order the same run
    outlives the bound (the thread is a daemon; it ends at its poll)."""
    took, _worker = _burst(_PausingRqWorker, queue_url)
    assert took >= POLL - 0.5, f"RQ's order ended in {took:.1f} s"


def test_the_loom_worker_stops_its_thread_the_same_way():
    assert issubclass(LoomWorker, PromptUnsubscribe)
    assert LoomWorker.unsubscribe is PromptUnsubscribe.unsubscribe
