"""The RQ queues Loom uses and the connection they share (LOOM_QUEUE_URL, else REDIS_URL)."""

from __future__ import annotations

import redis
from rq import Queue

from app.settings import Settings

# Passes plan and fan out; builds call the model. Separate queues let an operator scale the
# workers that call the model without starving the planner.
PASSES = "loom-passes"
BUILDS = "loom-builds"
MAINTENANCE = "loom-maintenance"
ALL_QUEUES = (PASSES, BUILDS, MAINTENANCE)


def queue_connection(settings: Settings) -> redis.Redis:
    url = settings.queue_redis_url
    if not url:
        raise RuntimeError("REDIS_URL (or LOOM_QUEUE_URL) is not set")
    return redis.Redis.from_url(url)


def queue(name: str, connection: redis.Redis) -> Queue:
    return Queue(name, connection=connection)
