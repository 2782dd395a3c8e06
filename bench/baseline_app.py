"""The bare baseline for bench/working_memory.py: Flask + redis-py and nothing else.

Each route works on the same keys, in the same stored format, as the Loom op it stands
beside, the way a bare Flask + redis-py app would: ``/wm/get`` is one HGET; ``/wm/set`` and
``/wm/append`` are the classic optimistic read-modify-write (WATCH the scope, HGET the block,
MULTI/HSET/SADD/EXEC, again on a conflict), where Loom runs one Lua script. What it leaves out
is everything else Loom does per request: no schema, no auth, no identity checks, no registry,
no error shape. ``request.get_json()`` -> Redis -> ``jsonify``.

``/wm/append_lua`` runs Loom's own append script (imported, so the text is identical) with the
same KEYS and ARGV through EVALSHA: the same Redis work as Loom's append, for comparing the
request handling alone.

``/profile/set``, ``/profile/append`` and ``/profile/render`` (for bench/mixed.py) call Loom's
memory and activity stores straight from the view, so the Redis commands are Loom's own (the
row script, the namespace entries, the section index ranges and rows, the read's activity
record), again with nothing of Loom's request handling around them.

Serve it with ``gunicorn bench.baseline_app:app`` (REDIS_URL set, repository root on the path).
"""

from __future__ import annotations

import os
import time

import redis
from flask import Flask, jsonify, request

from app.clock import Clock
from app.job_dispatch import JobDispatcher
from app.settings import load_settings
from app.store.activity import ActivityStore
from app.store.identity import Identity
from app.store.keys import user_erasing, working_memory_scope, working_memory_scopes
from app.store.lua import source
from app.store.memory import (
    DEFAULT_PROFILE_CHAR_LIMIT,
    PROFILE_TYPE,
    Content,
    Location,
    MemoryStore,
    SectionReach,
)
from app.store.working_memory import DEFAULT_BLOCK_KEY, DEFAULT_CHAR_LIMIT

ORG = os.environ.get("LOOM_DEFAULT_ORG", "default")

app = Flask(__name__)
app.json.sort_keys = False  # type: ignore[attr-defined]
app.json.compact = True  # type: ignore[attr-defined]

r = redis.Redis.from_url(os.environ["REDIS_URL"], decode_responses=True)
append_script = r.register_script(source("working_memory_append"))


class _Services:
    """What the stores take from Loom's services (``app.store.services.StoreServices``): the
    client, the clock, settings with no embeddings endpoint (Loom's bench deploy has none
    either, so no vector job is queued) and one instance of each store another store asks for
    (a memory write asks the vector store whether embeddings are on)."""

    redis = r
    queue_redis = r
    clock = Clock()
    settings = load_settings(environ={}, overrides={"redis_url": os.environ["REDIS_URL"]})
    # The one dispatcher, as Loom's services hold it: with no embeddings endpoint it is never
    # asked to enqueue, but the vector store takes it when it is built.
    jobs = JobDispatcher(lambda: r)
    _stores: dict[type, object] = {}

    def store(self, store_class: type) -> object:
        if store_class not in self._stores:
            self._stores[store_class] = store_class(self)
        return self._stores[store_class]


memory = MemoryStore(_Services())  # type: ignore[arg-type]
activity = ActivityStore(_Services())  # type: ignore[arg-type]


def _keys(body: dict) -> tuple[str, str, str]:
    user_id = body.get("user_id", "-")
    scope = working_memory_scope(
        ORG,
        body["namespace"],
        user_id,
        body["agent"],
        body.get("session_id", "-"),
        body.get("run_id", "-"),
    )
    return (
        scope,
        working_memory_scopes(ORG, body["namespace"], user_id),
        user_erasing(ORG, body["namespace"], user_id),
    )


def _written(block_key: str, reply: list) -> tuple:
    if reply[0] != "OK":
        return jsonify({"error": reply[0], "value_length": reply[1], "char_limit": reply[2]}), 422
    return jsonify(
        {
            "block_key": block_key,
            "version": int(reply[1]),
            "char_limit": int(reply[2]),
            "value_length": int(reply[3]),
        }
    ), 200


@app.post("/wm/get")
def wm_get():
    body = request.get_json()
    block_key = body.get("block_key", DEFAULT_BLOCK_KEY)
    raw = r.hget(_keys(body)[0], block_key)
    if raw is None:
        return jsonify({"found": False, "block_key": block_key, "content": ""})
    version, char_limit, _length, content = raw.split(":", 3)
    return jsonify(
        {
            "found": True,
            "block_key": block_key,
            "content": content,
            "char_limit": int(char_limit),
            "version": int(version),
        }
    )


def _watched_write(body: dict, new_content) -> tuple:
    """The bare redis-py read-modify-write of one block: WATCH the scope, HGET the block, work
    out the new text here, then MULTI/HSET/SADD/EXEC, starting over when another writer got
    in between. ``new_content(old or None)`` gives the text; each retry is one more WATCH, so
    ``INFO commandstats`` counts the retries (watch calls minus writes)."""
    block_key = body.get("block_key", DEFAULT_BLOCK_KEY)
    scope, index, _erasing = _keys(body)
    retries = 0
    with r.pipeline() as pipe:
        while True:
            try:
                pipe.watch(scope)
                raw = pipe.hget(scope, block_key)
                if raw is None:
                    last, limit, old = 0, DEFAULT_CHAR_LIMIT, None
                else:
                    version, char_limit, _length, old = raw.split(":", 3)
                    last, limit = int(version), int(char_limit)
                content, limit = new_content(old, limit)
                if len(content) > limit:
                    pipe.unwatch()
                    return jsonify({"error": "LIMIT", "value_length": len(content),
                                    "char_limit": limit}), 422
                version = max(time.time_ns(), last + 1)
                pipe.multi()
                pipe.hset(scope, block_key, f"{version}:{limit}:{len(content)}:{content}")
                pipe.sadd(index, scope)
                pipe.execute()
                break
            except redis.WatchError:
                retries += 1
    return jsonify(
        {
            "block_key": block_key,
            "version": version,
            "char_limit": limit,
            "value_length": len(content),
            "retries": retries,
        }
    ), 200


@app.post("/wm/set")
def wm_set():
    body = request.get_json()
    content = body.get("content", "")
    char_limit = body.get("char_limit")
    return _watched_write(
        body, lambda _old, limit: (content, DEFAULT_CHAR_LIMIT if char_limit is None
                                   else char_limit))


@app.post("/wm/append")
def wm_append():
    body = request.get_json()
    addition = body["addition"]
    separator = body.get("separator", "\n")
    return _watched_write(
        body, lambda old, limit: (addition if old is None else old + separator + addition,
                                  limit))


@app.post("/wm/append_lua")
def wm_append_lua():
    """The append as Loom's own Lua script (the same text, KEYS and ARGV), through EVALSHA:
    the same Redis work as Loom's append, with nothing of Loom's request handling around it."""
    body = request.get_json()
    block_key = body.get("block_key", DEFAULT_BLOCK_KEY)
    addition = body["addition"]
    separator = body.get("separator", "\n")
    reply = append_script(
        keys=list(_keys(body)),
        args=[
            block_key,
            time.time_ns(),
            addition,
            len(addition),
            separator,
            len(separator),
            DEFAULT_CHAR_LIMIT,
        ],
    )
    return _written(block_key, reply)


def _location(body: dict) -> Location:
    return Location(ORG, body["namespace"], body.get("user_id", "-"), body["agent"],
                    body.get("session_id", "-"), body["label"])


def _profile_written(written) -> dict:
    row = written.row
    return jsonify({"version": row.version, "memory_id": row.memory_id,
                    "content_sha256": row.content_sha256, "label": row.key,
                    "char_limit": row.char_limit, "value_length": row.value_length})


@app.post("/profile/set")
def profile_set():
    body = request.get_json()
    content = Content(memory_type=PROFILE_TYPE, value=body["value"], actor=body["agent"])
    return _profile_written(memory.set(
        _location(body), content, written_by=body["agent"],
        default_char_limit=DEFAULT_PROFILE_CHAR_LIMIT, required_type=PROFILE_TYPE))


@app.post("/profile/append")
def profile_append():
    body = request.get_json()
    return _profile_written(memory.append(
        _location(body), body["addition"], body.get("separator", "\n"),
        written_by=body["agent"]))


@app.post("/profile/render")
def profile_render():
    """The user's sections and the namespace's (read_scope own_user), as XML."""
    body = request.get_json()
    user_id = body.get("user_id", "-")
    rows = memory.profile_sections(ORG, body["namespace"], [SectionReach("-"),
                                                           SectionReach(user_id)])
    rows.sort(key=lambda row: (row.key, row.user_id != "-", row.user_id, row.agent))
    rendered = "\n".join(f'<profile label="{row.key}">{row.value}</profile>' for row in rows)
    activity.record(Identity(ORG, body["namespace"], body["agent"], user_id),
                    request.headers.get("User-Agent", ""), "profile.render")
    return jsonify({"rendered": rendered, "section_count": len(rows),
                    "total_chars": len(rendered), "labels": [row.key for row in rows]})
