"""The append-only file after an erasure: BGREWRITEAOF, so erased data also leaves the disk.

Off unless ``LOOM_ERASURE_REWRITE_AOF`` is set. A rewrite already running was forked before
the erasure and would keep the erased data, so the erasure waits for it (up to
``AOF_WAIT_SECONDS``) and asks again. This runs at the end of the saga, in the worker that runs
it, never in a web request.
"""

from __future__ import annotations

import time
from typing import Any

from redis.exceptions import ResponseError

from app.store.erasure.scanning import primaries

AOF_WAIT_SECONDS = 30.0


def rewrite_aof(services: Any) -> str:
    """off, scheduled (every server asked) or failed."""
    settings = services.settings
    if not settings.erasure_rewrite_aof:
        return "off"
    outcomes = [_bgrewriteaof(node) for node in primaries(services.redis)]
    if settings.queue_url and settings.queue_url != settings.redis_url:
        outcomes.append(_bgrewriteaof(services.queue_redis))
    return "scheduled" if all(outcomes) else "failed"


def _bgrewriteaof(client: Any) -> bool:
    deadline = time.monotonic() + AOF_WAIT_SECONDS
    while True:
        try:
            client.bgrewriteaof()
            return True
        except ResponseError as error:
            if "already in progress" not in str(error) or time.monotonic() > deadline:
                return False
            time.sleep(0.2)
