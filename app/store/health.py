"""Readiness probes: does the data Redis, and the queue's Redis, answer within a deadline?

The probes use their own clients with short socket timeouts and no retries, so a hung server
costs ``/readyz`` at most the deadline instead of the data plane's longer timeouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from app.store.connection import tls_options

if TYPE_CHECKING:
    from app.store.services import StoreServices

DATA = "redis"
QUEUE = "queue_redis"


@dataclass(frozen=True)
class Check:
    part: str
    ok: bool
    detail: str


class ReadinessProbe:
    def __init__(self, services: StoreServices) -> None:
        settings = self._settings = services.settings
        self.deadline = float(settings.ready_timeout_seconds)
        self._targets = {DATA: settings.redis_url, QUEUE: settings.queue_redis_url}
        self._clients: dict[str, redis.Redis] = {}
        for part, url in self._targets.items():
            if not url:
                continue
            same = next((p for p, u in self._targets.items() if u == url and p in self._clients),
                        None)
            self._clients[part] = self._clients[same] if same else self._client(url)

    def _client(self, url: str) -> redis.Redis:
        return redis.Redis.from_url(
            url,
            socket_timeout=self.deadline,
            socket_connect_timeout=self.deadline,
            retry=Retry(NoBackoff(), 0),
            **tls_options(self._settings, url),
        )

    def check(self) -> list[Check]:
        results: dict[str, Check] = {}
        answered: dict[int, Check] = {}
        for part in self._targets:
            client = self._clients.get(part)
            if client is None:
                results[part] = Check(part, False, "no URL is set")
                continue
            earlier = answered.get(id(client))
            if earlier is not None:
                # The same server: one ping answers for both parts.
                results[part] = Check(part, earlier.ok, earlier.detail)
                continue
            try:
                client.ping()
                outcome = Check(part, True, "ok")
            except redis.TimeoutError:
                outcome = Check(part, False, f"no answer within {self.deadline:g} s")
            except redis.RedisError as error:
                outcome = Check(part, False, f"{type(error).__name__}: {error}")
            answered[id(client)] = outcome
            results[part] = outcome
        return list(results.values())
