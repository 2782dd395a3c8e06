"""How Loom's processes connect to Redis, and which Redis failures mean "the store is away".

Every client is built here with bounded waits: ``LOOM_REDIS_SOCKET_TIMEOUT_SECONDS`` for a reply
and ``LOOM_REDIS_CONNECT_TIMEOUT_SECONDS`` to connect, with one immediate retry on a broken
connection (a pooled connection that a Redis restart closed) and none on a timeout, so a hung
Redis costs a request about one socket timeout instead of redis-py's default of ten retries.
``UNAVAILABLE_ERRORS`` are the failures that say nothing about the request: the web answers
them ``503 STORE_UNAVAILABLE`` with ``Retry-After``, and the pool reconnects by itself once
Redis is back.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.exceptions import ClusterDownError, ReadOnlyError, TryAgainError
from redis.retry import Retry

from app.errors import StoreUnavailable
from app.settings import Settings

# Down, refused, reset, still loading its data (BusyLoadingError is a ConnectionError), hung
# past the socket timeout, a cluster without a primary for a slot, or a replica after failover.
UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    ClusterDownError,
    TryAgainError,
    ReadOnlyError,
)
RETRY_AFTER_SECONDS = 2
# The base of every failure a Redis call raises, those above and the refusals (a script's
# error, a wrong type): what the processes count as Redis errors.
STORE_ERROR = redis.RedisError


def tls_options(settings: Settings, url: str) -> dict[str, Any]:
    """redis-py's certificate options for a ``rediss://`` URL (none for any other: a plain
    connection takes no ssl option). A platform's add-on owns REDIS_URL, so how its
    certificate is checked is set apart from it (``LOOM_REDIS_TLS_VERIFY``,
    ``LOOM_REDIS_TLS_CA_CERTS``); an ``ssl_*`` option in the URL itself still wins."""
    if urlsplit(url).scheme != "rediss":
        return {}
    if settings.redis_tls_verify == "off":
        return {"ssl_cert_reqs": "none", "ssl_check_hostname": False}
    options: dict[str, Any] = {"ssl_cert_reqs": "required"}
    if settings.redis_tls_ca_certs:
        options["ssl_ca_certs"] = settings.redis_tls_ca_certs
    return options


def client_options(settings: Settings) -> dict[str, Any]:
    """redis-py options every Loom client shares (bounded waits, one retry on a dead socket)."""
    return {
        "socket_timeout": settings.redis_socket_timeout_seconds,
        "socket_connect_timeout": settings.redis_connect_timeout_seconds,
        "retry": Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        "health_check_interval": 30,
    }


class RedisUrlMissing(RuntimeError):
    """No REDIS_URL: a process that needs the store was started without one."""


def connect(settings: Settings, url: str | None = None, *, decode: bool = True) -> redis.Redis:
    """A client for ``url`` (default the data plane's REDIS_URL)."""
    url = settings.redis_url if url is None else url
    if not url:
        raise RedisUrlMissing(
            "REDIS_URL is not set: set it, or start Loom with `python -m app.local`, "
            "which runs an embedded redis-server"
        )
    if settings.redis_cluster == "on" and url == settings.redis_url:
        # Any node will do: the client reads the slot map from it and follows MOVED/ASK.
        return redis.RedisCluster.from_url(  # type: ignore[return-value]
            url, decode_responses=decode,
            socket_timeout=settings.redis_socket_timeout_seconds,
            socket_connect_timeout=settings.redis_connect_timeout_seconds,
            **tls_options(settings, url))
    return redis.Redis.from_url(url, decode_responses=decode, **client_options(settings),
                                **tls_options(settings, url))


def store_unavailable(error: Exception) -> StoreUnavailable:
    """The 503 a Redis failure becomes; its message names the failure, never the server."""
    if isinstance(error, redis.exceptions.BusyLoadingError):
        reason = "the store is loading its data"
    elif isinstance(error, redis.TimeoutError):
        reason = "the store did not answer in time"
    else:
        reason = "the store is unreachable"
    return StoreUnavailable(f"{reason}; try again shortly", retry_after=RETRY_AFTER_SECONDS)
