"""Running the erasure saga's RQ jobs inside a test process, as a worker would.

``run_erasure_jobs(services)`` drains the maintenance queue with RQ's ``SimpleWorker`` (burst,
no fork), the jobs running with the test's own services; ``erasure_worker_thread(services)``
keeps doing so in a thread for a test that waits on a background erasure (the ``erase``
command). The real worker process is exercised by tests/test_erasure_background.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rq import Queue

from app.services import Services
from jobs import context
from jobs.queues import MAINTENANCE
from tests.support.rq_worker import CommandlessBurstWorker


def run_erasure_jobs(services: Services) -> None:
    context.use_services(services)
    try:
        _drain(services)
    finally:
        context.use_services(None)


def _drain(services: Services) -> None:
    connection = services.queue_redis
    CommandlessBurstWorker([Queue(MAINTENANCE, connection=connection)],
                           connection=connection).work(burst=True, logging_level="WARNING")


def erase_now(services: Services, post: Any, **body: Any) -> dict[str, Any]:
    """user.erase through ``post``, then its run in this process: the finished receipt."""
    started = post("user.erase", **body)
    assert started["status"] in ("running", "done", "failed"), started
    run_erasure_jobs(services)
    return post("erasure.status", erasure_id=started["erasure_id"])


@contextmanager
def erasure_worker_thread(services: Services) -> Iterator[None]:
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            _drain(services)
            stop.wait(0.05)

    context.use_services(services)
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)
        context.use_services(None)
