"""What a request or a job needs from the process: settings, Redis clients, the clock, stores.

One ``Services`` hangs off ``app.extensions["loom"]`` (and is built the same way by jobs).
Stores are built on first use and kept, so a plane adds a store class without touching this
module: ``services.store(WorkingMemoryStore)``.
"""

from __future__ import annotations

import threading
from typing import Any, TypeVar

import redis

from app.auth import Principal, single_user
from app.clock import Clock
from app.errors import AuthRequired
from app.settings import Settings

StoreT = TypeVar("StoreT")


class Services:
    def __init__(
        self,
        settings: Settings,
        redis_client: redis.Redis | None = None,
        clock: Clock | None = None,
        queue_redis: redis.Redis | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock or Clock()
        self.redis = redis_client or connect(settings.redis_url)
        self._queue_redis = queue_redis
        self._stores: dict[type, Any] = {}
        self._lock = threading.Lock()
        self._single_user = single_user(settings.default_org)

    @property
    def queue_redis(self) -> redis.Redis:
        """RQ's own connection (bytes, as RQ expects); built on first use."""
        if self._queue_redis is None:
            self._queue_redis = redis.Redis.from_url(self.settings.queue_redis_url)
        return self._queue_redis

    def authenticate(self, headers: Any, op: Any = None) -> Principal:
        """The caller's principal: the install's single user with auth off."""
        if self.settings.auth == "off":
            return self._single_user
        raise AuthRequired("auth is on: send Authorization: Bearer <token>")

    def store(self, store_class: type[StoreT]) -> StoreT:
        found = self._stores.get(store_class)
        if found is None:
            with self._lock:
                found = self._stores.get(store_class)
                if found is None:
                    found = store_class(self)
                    self._stores[store_class] = found
        return found


def connect(url: str) -> redis.Redis:
    if not url:
        raise RuntimeError(
            "REDIS_URL is not set: set it, or start Loom with `python -m app.local`, "
            "which runs an embedded redis-server"
        )
    return redis.Redis.from_url(url, decode_responses=True, health_check_interval=30)
