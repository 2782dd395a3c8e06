"""SCAN that reaches every primary: one server's keyspace, or each primary of a Redis Cluster.

A cluster's SCAN answers for one node only, so every search of the erasure and the census
walks each primary in turn (``RedisCluster.get_primaries()``), each with its own cursor; KEYS is
never used.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import redis


def text(value: Any) -> str:
    """A reply as text (the data plane decodes replies; the queue's client does not)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def primaries(client: Any) -> list[Any]:
    """A client per primary holding data: the client itself on one server."""
    if isinstance(client, redis.RedisCluster):
        # redis-py leaves RedisCluster.get_primaries untyped.
        nodes = client.get_primaries()  # type: ignore[no-untyped-call]
        return [client.get_redis_connection(node) for node in nodes]
    return [client]


def scan_keys(client: Any, match: str, *, count: int = 1000,
              kind: str | None = None) -> Iterator[str]:
    """Every key matching ``match`` (of type ``kind`` when given), on every primary."""
    for node in primaries(client):
        for key in node.scan_iter(match=match, count=count, _type=kind):
            yield text(key)
