"""What is left of a user anywhere in the data plane: the searches the sweep and the census share.

Each search reaches every primary (``scanning.scan_keys``): the keys under the user's hash tag,
the namespace's memory_id pointers naming the user (its pointer hash's fields, and the earlier
layout's pointer keys), the user as a member of the namespace's
sets and sorted sets, the user's elements in the namespace's vector set, and the agent states
still naming one of the user's subjects.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from app.store import keys
from app.store.batching import batches
from app.store.erasure.run import ErasureRun
from app.store.erasure.scanning import scan_keys, text
from app.store.recall_vectors import VECTORSET, engine_of

BATCH = 200


def pointer_user(raw: Any) -> str | None:
    """The user a memory_id pointer names (its value is ``[user, agent, session, key]``)."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value[0] if isinstance(value, list) and value and isinstance(value[0], str) else None


def _hit(reply: Any) -> bool:
    """Whether a membership reply found the member: a ZSCORE of 0.0 is a hit."""
    if isinstance(reply, float):
        return True
    return bool(reply)


def user_keys(client: Any, run: ErasureRun) -> Iterator[str]:
    """Every key under the user's hash tag but the erasure's marker."""
    for key in scan_keys(client, keys.user_pattern(*run.user)):
        if key != run.marker:
            yield key


def pointers_naming(client: Any, run: ErasureRun, *, remove: bool) -> int:
    """The namespace's memory_id pointers that name the user (a full scan of the namespace's
    pointer hash and of the earlier layout's pointer keys: what the user's own indexes may have
    lost), removed or only counted."""
    total = 0
    pointers = keys.memory_pointers(run.org, run.namespace)
    for batch in batches(client.hscan_iter(pointers, count=500), 500):
        mine = [text(mid) for mid, value in batch if pointer_user(value) == run.user_id]
        if mine and remove:
            client.hdel(pointers, *mine)
        total += len(mine)
    for batch in batches(scan_keys(client, keys.memory_pointer_pattern(run.org, run.namespace)),
                         500):
        # The earlier layout's pointers share the namespace's slot: one MGET reaches them.
        values = client.mget(batch)
        mine = [k for k, v in zip(batch, values, strict=True) if pointer_user(v) == run.user_id]
        if mine and remove:
            client.delete(*mine)
        total += len(mine)
    return total


def namespace_sets(client: Any, run: ErasureRun, *, remove: bool) -> int:
    """The user as a member of any set or sorted set of the namespace's slot: the user
    indexes of every plane, including ones this package does not name (a worker's change
    list, say). Removed, or only counted. Hashes are left alone: a user id may equal a field
    name (``features``) that is no user at all."""
    org, namespace, user_id = run.user
    pattern = "*" + keys.glob_escape(keys.namespace_tag(org, namespace)) + "*"
    total = 0
    for kind in ("set", "zset"):
        for batch in batches(scan_keys(client, pattern, kind=kind), BATCH):
            pipe = client.pipeline(transaction=False)
            for key in batch:
                if kind == "set" and remove:
                    pipe.srem(key, user_id)
                elif kind == "set":
                    pipe.sismember(key, user_id)
                elif remove:
                    pipe.zrem(key, user_id)
                else:
                    pipe.zscore(key, user_id)
            total += sum(1 for hit in pipe.execute() if _hit(hit))
    return total


def namespace_vectors(client: Any, run: ErasureRun, *, remove: bool) -> int:
    """The user's elements in the namespace's vector set (named ``user NUL memory_id``),
    removed or only counted. The set is read whole (VRANDMEMBER with its size answers every
    element): the user's own indexes may have lost a memory_id."""
    if engine_of(client) != VECTORSET:
        return 0
    key = keys.recall_namespace_vector_set(run.org, run.namespace)
    size = int(client.execute_command("VCARD", key) or 0)
    if not size:
        return 0
    prefix = run.user_id + "\x00"
    mine = [name for name in map(text, client.execute_command("VRANDMEMBER", key, size))
            if name.startswith(prefix) and "\x00" not in name[len(prefix):]]
    if remove:
        for batch in batches(mine, BATCH):
            pipe = client.pipeline(transaction=False)
            for name in batch:
                pipe.execute_command("VREM", key, name)
            pipe.execute()
    return len(mine)


def agent_state_left(client: Any, run: ErasureRun) -> tuple[int, int]:
    """States still naming one of the user's subjects (found as the agent-state plane finds
    them: the subject's index and the subject scope's agents), and index entries left."""
    org, namespace = run.org, run.namespace
    states = entries = 0
    for digest in run.subjects:
        pipe = client.pipeline(transaction=False)
        pipe.zrange(keys.agent_state_subject(org, namespace, digest), 0, -1)
        pipe.hkeys(keys.agent_state_agents(org, namespace, digest))
        pipe.zscore(keys.agent_state_subjects(org, namespace), digest)
        indexed, agents, listed = pipe.execute()
        candidates = list(dict.fromkeys(
            [*map(text, indexed),
             *(keys.agent_state(org, namespace, digest, text(a)) for a in agents)]))
        if candidates:
            pipe = client.pipeline(transaction=False)
            for key in candidates:
                pipe.hget(key, "subject")
            states += sum(1 for subject in pipe.execute()
                          if subject is not None and text(subject) == digest)
        entries += len(indexed) + len(agents) + (1 if listed is not None else 0)
    return states, entries
