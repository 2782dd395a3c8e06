"""The RQ queues Loom uses and the connection they share (LOOM_QUEUE_URL, else REDIS_URL)."""

from __future__ import annotations

import redis
from rq import Queue

from app.queue_names import ALL_QUEUES, BUILDS, MAINTENANCE, PASSES
from app.settings import Settings
from app.store.connection import tls_options

__all__ = ["ALL_QUEUES", "BUILDS", "MAINTENANCE", "PASSES", "queue", "queue_connection"]


def queue_connection(settings: Settings) -> redis.Redis:
    url = settings.queue_redis_url
    if not url:
        raise RuntimeError("REDIS_URL (or LOOM_QUEUE_URL) is not set")
    return redis.Redis.from_url(url, **tls_options(settings, url))


def queue(name: str, connection: redis.Redis) -> Queue:
    return Queue(name, connection=connection)
