"""The user in what the workers keep between passes (scan lists, waits).

That state lives in no user's slot: a worker's hash holds JSON documents keyed by the
planner's namespace id (``[org, namespace]``), below which user ids appear as mapping keys and
list elements. ``scrub_user`` drops them; ``scrub_stored`` applies it to every worker's stored
state (or only counts what it would drop, for the census).
"""

from __future__ import annotations

import json
from typing import Any

from redis.exceptions import WatchError

from app.store import keys
from app.store.erasure.scanning import scan_keys, text


def _namespace_key(key: str, org: str, namespace: str) -> bool:
    """Whether a mapping key is the planner's id of this namespace (JSON ``[org, namespace]``)."""
    if not key.startswith("["):
        return False
    try:
        return bool(json.loads(key) == [org, namespace])
    except ValueError:
        return False


def scrub_user(node: Any, org: str, namespace: str, user_id: str,
               inside: bool = False) -> tuple[Any, int]:
    """``node`` without the user: below a key naming the namespace, every mapping key and
    list element equal to the user id is dropped. Answers the new node and how many went."""
    removed = 0
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if inside and key == user_id:
                removed += 1
                continue
            child, n = scrub_user(value, org, namespace, user_id,
                                  inside or _namespace_key(key, org, namespace))
            out[key] = child
            removed += n
        return out, removed
    if isinstance(node, list):
        items = []
        for value in node:
            if inside and value == user_id:
                removed += 1
                continue
            child, n = scrub_user(value, org, namespace, user_id, inside)
            items.append(child)
            removed += n
        return items, removed
    return node, 0


def scrub_stored(client: Any, org: str, namespace: str, user_id: str, *, remove: bool) -> int:
    """The user's entries in every worker's stored state: removed, or only counted."""
    return sum(_scrub_one(client, key, (org, namespace, user_id), remove)
               for key in scan_keys(client, keys.worker_state_pattern(), count=100))


def _scrub_one(client: Any, key: str, user: tuple[str, str, str], remove: bool) -> int:
    while True:
        # One key per transaction: its slot is the worker's own, on a cluster too.
        with client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key)
                if text(pipe.type(key)) != "hash":
                    return 0
                changes: dict[str, str] = {}
                found = 0
                for name, raw in pipe.hgetall(key).items():
                    try:
                        document = json.loads(raw)
                    except ValueError:
                        continue
                    scrubbed, n = scrub_user(document, *user)
                    if n:
                        found += n
                        changes[text(name)] = json.dumps(scrubbed, sort_keys=True,
                                                         separators=(",", ":"))
                if not remove or not changes:
                    return found
                pipe.multi()
                pipe.hset(key, mapping=changes)
                pipe.execute()
                return found
            except WatchError:
                # The worker saved its state meanwhile: read it again and scrub that.
                continue
