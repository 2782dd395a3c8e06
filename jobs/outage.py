"""How the worker and the scheduler ride out a Redis outage: wait for Redis, then start over.

RQ's worker retries only its dequeue; a failure anywhere else (its birth at start, a heartbeat,
a job's bookkeeping) ends ``work()``, and rq-scheduler ends on any Redis error, its
``register_death`` included. A supervisor under them would restart them in a loop while Redis
is away. Instead each process runs its loop under ``ride_out``: on a Redis failure it waits,
pinging with a capped backoff, for as long as the outage lasts, and runs the loop again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis

from app.store.connection import UNAVAILABLE_ERRORS

log = logging.getLogger("loom.jobs.outage")

FIRST_WAIT_SECONDS = 0.5
MAX_WAIT_SECONDS = 5.0
# A loop that ends for another reason is started again after this pause, never in a spin.
RESTART_PAUSE_SECONDS = 1.0


def wait_for_redis(connection: redis.Redis, what: str) -> None:
    """Block until ``connection`` answers PING (and has loaded its data)."""
    wait = FIRST_WAIT_SECONDS
    waited = 0.0
    while True:
        try:
            connection.ping()
        except UNAVAILABLE_ERRORS as error:
            log.warning("%s: Redis is not answering (%s: %s); trying again in %.1f s",
                        what, type(error).__name__, error, wait)
            time.sleep(wait)
            waited += wait
            wait = min(wait * 2, MAX_WAIT_SECONDS)
            continue
        if waited:
            log.info("%s: Redis answers again after %.1f s", what, waited)
        return


def ride_out(run: Callable[[], bool], connection: redis.Redis, what: str) -> None:
    """Call ``run`` until it answers True (done: stopped on request, or a burst finished),
    waiting out every Redis outage in between."""
    while True:
        wait_for_redis(connection, what)
        try:
            if run():
                return
        except UNAVAILABLE_ERRORS as error:
            log.warning("%s: Redis went away (%s: %s); waiting for it", what,
                        type(error).__name__, error)
            continue
        log.warning("%s: stopped without a stop request; starting again", what)
        time.sleep(RESTART_PAUSE_SECONDS)
