"""Read every key and value of a Redis database as text, to prove what is (not) stored."""

from __future__ import annotations

import redis


def dump_everything(client: redis.Redis) -> str:
    """All keys and their values, of every type, as one string (bytes decoded leniently)."""
    raw: redis.Redis
    if isinstance(client, redis.RedisCluster):
        # A cluster client's scan visits every primary; its own keyword options stay its own.
        node = client.get_default_node()
        raw = redis.RedisCluster(host=node.host, port=node.port)  # type: ignore[assignment]
    else:
        raw = redis.Redis(connection_pool=client.connection_pool)
    parts: list[str] = []
    for key in raw.scan_iter(count=1000):
        kind = raw.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        if kind == "string":
            value = raw.get(key)
        elif kind == "hash":
            value = raw.hgetall(key)
        elif kind == "list":
            value = raw.lrange(key, 0, -1)
        elif kind == "set":
            value = raw.smembers(key)
        elif kind == "zset":
            value = raw.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            value = raw.xrange(key)
        else:
            value = kind
        parts.append(f"{key!r} => {value!r}")
    return "\n".join(parts)
