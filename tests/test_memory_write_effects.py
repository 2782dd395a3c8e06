"""Each effect of a memory write is one include of app/store/lua/memory_write.lua, run here alone
on the real server: the row and its versions, the vector due list, the lexical recall index, the
profile digest, the keyed answer. A harness script declares the keys the include reads (as a
ScriptInterface, so the same preamble names them), includes it, and calls its functions."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import redis

from app.store.lua import _expanded, script
from app.store.memory_row import ROW_DEFAULTS
from app.store.recall_terms import row_terms
from app.store.script_interfaces import MEMORY_RELAYOUT, ScriptInterface

TAG = "{effects}"
NUL = "\0"
# What memory_write.lua defines before its includes.
PRELUDE = """local NUL = string.char(0)
local TAIL = cjson.decode(A_tail)
local VECTOR_LEFT = nil
local FIRST_SOURCE = false
"""


def _harness(client: redis.Redis, includes: list[str], keys: tuple[str, ...], body: str,
             args: tuple[str, ...] = ()) -> Any:
    interface = ScriptInterface("harness", keys=keys, args=("tail", *args))
    text = (interface.preamble() + PRELUDE
            + "".join(_expanded(name) + "\n" for name in includes) + body)
    run = client.register_script(text)

    def call(tail: dict[str, Any] | None = None, **values: Any) -> Any:
        ordered_keys, ordered_args = interface.ordered(
            {name: f"fx:{name}:{TAG}" for name in keys},
            {"tail": json.dumps(tail or {"holder": ""}), **values})
        return run(keys=ordered_keys, args=ordered_args)

    return call


def key(name: str) -> str:
    return f"fx:{name}:{TAG}"


ROW_KEYS = ("row", "versions", "version_order", "rows", "memory_ids", "sections", "live")


def test_the_row_include_writes_the_row_its_version_and_the_user_indexes(
    redis_client: redis.Redis,
) -> None:
    write = _harness(redis_client, ["memory_write_row"], ROW_KEYS,
                     "load_row()\nwrite_row(cjson.decode(A_row), A_member, A_old_type ~= '' "
                     "and A_old_type or nil)\nreturn 'ok'", args=("row", "member", "old_type"))
    member = f"persona{NUL}agent{NUL}-"
    row = {"memory_id": "m1", "version": "17", "key": "persona", "agent": "agent",
           "session_id": "-", "memory_type": "profile", "deleted": "0", "redacted": "0",
           "value": "Terse."}
    assert write(row=json.dumps(row), member=member, old_type="") == "ok"
    # The row is its first version, without the fields at their default; no snapshot repeats it.
    stored = redis_client.hgetall(key("row"))
    assert stored["value"] == "Terse." and "deleted" not in stored and "redacted" not in stored
    assert redis_client.exists(key("versions")) == 0
    padded = "17".zfill(20)
    assert redis_client.zrange(key("version_order"), 0, -1) == [padded]
    assert redis_client.zrange(key("rows"), 0, -1) == [member]
    assert redis_client.hget(key("memory_ids"), "m1") == key("row")
    assert redis_client.zcard(key("sections")) == 3
    assert set(redis_client.zrange(key("live"), 0, -1)) == {f"profile{NUL}{member}",
                                                           f"{NUL}{member}"}
    # Deleted, and of another type than before: out of the sections and the live rows; the
    # version it replaced is kept as a snapshot, the row holds the new one.
    deleted = {**row, "version": "18", "deleted": "1", "memory_type": "semantic"}
    write(row=json.dumps(deleted), member=member, old_type="profile")
    assert redis_client.zcard(key("sections")) == 0
    assert redis_client.zcard(key("live")) == 0
    assert redis_client.zrange(key("version_order"), 0, -1) == [padded, "18".zfill(20)]
    first = json.loads(redis_client.hget(key("versions"), padded) or "")
    assert first["memory_id"] == "m1" and first["value"] == "Terse." and "deleted" not in first
    assert redis_client.hkeys(key("versions")) == [padded]
    assert redis_client.hget(key("row"), "deleted") == "1"
    # Back at its default, a field leaves the row.
    write(row=json.dumps({**row, "version": "19"}), member=member, old_type="semantic")
    assert redis_client.hget(key("row"), "deleted") is None
    assert json.loads(redis_client.hget(key("versions"), "18".zfill(20)) or "")["deleted"] == "1"


VECTOR_KEYS = ("recall_vectors", "recall_vectors_generation", "recall_vector_set",
               "recall_vectors_due", "erasing", "recall_vectors_queued")


def test_the_vector_include_drops_a_stale_vector_and_marks_one_job_queued(
    redis_client: redis.Redis,
) -> None:
    drop = _harness(redis_client, ["memory_write_vectors"], VECTOR_KEYS,
                    "drop_vector(A_mid)\nlist_due(A_mid, A_due == '1')\n"
                    "return embed_job_of('OK', cjson.decode(A_row))", args=("mid", "due", "row"))
    redis_client.hset(key("recall_vectors"), "m1", "vector bytes")
    fact = json.dumps({"deleted": "0", "redacted": "0", "memory_type": "semantic"})
    tail = {"holder": "", "embed_job": "job-1", "embed_ttl": 60}
    assert drop(tail, mid="m1", due="1", row=fact) == "job-1"
    assert not redis_client.hexists(key("recall_vectors"), "m1")
    assert redis_client.hget(key("recall_vectors_generation"), "n") == "1"
    assert redis_client.zrange(key("recall_vectors_due"), 0, -1) == ["m1"]
    assert redis_client.get(key("recall_vectors_queued")) == "job-1"
    # A job is queued already: no second one; no vector left to drop: the generation stays.
    assert drop({**tail, "embed_job": "job-2"}, mid="m1", due="1", row=fact) == ""
    assert redis_client.hget(key("recall_vectors_generation"), "n") == "1"
    # No longer due (a deleted row) and no job for it.
    deleted = json.dumps({"deleted": "1", "redacted": "0", "memory_type": "semantic"})
    assert drop(tail, mid="m1", due="0", row=deleted) == ""
    assert redis_client.zcard(key("recall_vectors_due")) == 0


LEXICAL_KEYS = ("recall_docs", "recall_postings", "recall_stats", *VECTOR_KEYS)


def test_the_lexical_include_indexes_a_live_fact_and_unindexes_it_whole(
    redis_client: redis.Redis,
) -> None:
    index = _harness(redis_client, ["memory_write_vectors", "memory_write_lexical"], LEXICAL_KEYS,
                     "index_recall(cjson.decode(A_row))\nreturn 'ok'", args=("row",))
    terms = row_terms("billing", "Prefers EUR invoices.")
    fact = {"memory_id": "m1", "recall_terms": terms, "deleted": "0", "redacted": "0",
            "memory_type": "semantic"}
    index(row=json.dumps(fact))
    assert redis_client.hget(key("recall_docs"), "m1") == terms
    assert redis_client.hget(key("recall_stats"), "docs") == "1"
    assert redis_client.zcard(key("recall_postings")) > 0
    assert redis_client.zrange(key("recall_vectors_due"), 0, -1) == ["m1"]
    index(row=json.dumps({**fact, "redacted": "1"}))
    assert not redis_client.hexists(key("recall_docs"), "m1")
    assert redis_client.hget(key("recall_stats"), "docs") == "0"
    assert redis_client.hget(key("recall_stats"), "length") == "0"
    assert redis_client.zcard(key("recall_postings")) == 0
    assert redis_client.zcard(key("recall_vectors_due")) == 0


def test_the_digest_include_xors_each_source_in_and_out(redis_client: redis.Redis) -> None:
    # update_sources takes its three keys as parameters (memory_redact passes them too).
    update = _harness(
        redis_client, ["version", "memory_digest", "memory_write_digest"],
        ("sources", "digest", "source_expiry"),
        "local entry = source_entry(cjson.decode(A_row), A_now)\n"
        "local moved = update_sources(K_sources, K_digest, K_source_expiry, 'm1', entry, '', "
        "A_now)\nreturn {entry or '', moved and 1 or 0, FIRST_SOURCE and 1 or 0}",
        args=("row", "now"))
    fact = {"memory_type": "semantic", "deleted": "0", "redacted": "0", "label": "",
            "content_sha256": "abc", "confidence": "0.9", "valid_at": "5", "version": "7"}
    assert update(row=json.dumps(fact), now="9") == ["abc:0.9:5", 1, 1]
    expected = hashlib.sha1(b"m1|abc:0.9:5").hexdigest()
    assert redis_client.hmget(key("digest"), "digest", "count") == [expected, "1"]
    # The same entry again moves nothing; a deletion takes it out, back to the zero digest.
    assert update(row=json.dumps(fact), now="10")[1] == 0
    assert update(row=json.dumps({**fact, "deleted": "1"}), now="11")[:2] == ["", 1]
    assert redis_client.hmget(key("digest"), "digest", "count", "removed_at") == [
        "0" * 40, "0", "11"]
    assert not redis_client.hexists(key("sources"), "m1")


def test_the_answer_include_keeps_the_reply_without_the_text_for_the_holding_try(
    redis_client: redis.Redis,
) -> None:
    answer = _harness(redis_client, ["memory_write_answer"], ("outcome",),
                      "return answered({'OK', '1', {}, 'job', 'memory_id', 'm1', 'value', "
                      "'secret text', 'version', '7'})")
    redis_client.hset(key("outcome"), mapping={"holder": "try-1", "state": "running"})
    reply = answer({"holder": "try-1"})
    assert reply[4:] == ["memory_id", "m1", "value", "secret text", "version", "7"]
    kept = json.loads(redis_client.hget(key("outcome"), "reply") or "")
    # cjson writes the empty list of commands as an object; a replay reads no commands from it.
    assert kept == ["OK", "1", {}, "", "memory_id", "m1", "version", "7"]
    assert redis_client.hget(key("outcome"), "state") == "done"
    # The key is answered now (or held by a later try): this try writes nothing.
    assert answer({"holder": "try-1"}) == ["LEASE_LOST"]
    # No key answered: nothing kept anywhere.
    redis_client.delete(key("outcome"))
    assert answer({"holder": ""})[0] == "OK"
    assert not redis_client.exists(key("outcome"))


def test_the_row_defaults_are_one_table_in_lua_and_python() -> None:
    lua = _expanded("memory_row_form")
    table = lua[lua.index("local ROW_DEFAULTS = {"):lua.index("}\n", lua.index("ROW_DEFAULTS"))]
    assert dict(re.findall(r"(\w+) = '([^']*)'", table)) == dict(ROW_DEFAULTS)


def test_the_relayout_moves_an_earlier_row_once(redis_client: redis.Redis) -> None:
    relayout = script(redis_client, "memory_relayout")
    names = {"row": key("row"), "versions": key("versions"), "version_order": key("version_order")}
    full = {**ROW_DEFAULTS, "memory_id": "m1", "version": "18", "key": "k", "agent": "a",
            "user_id": "u", "session_id": "-", "memory_type": "semantic", "value": '"b"',
            "label": "high"}
    first = {**full, "version": "17", "value": '"a"'}
    redis_client.hset(key("row"), mapping=full)
    redis_client.hset(key("versions"), mapping={"17".zfill(20): json.dumps(first),
                                                "18".zfill(20): json.dumps(full)})
    redis_client.zadd(key("version_order"), {"17".zfill(20): 0, "18".zfill(20): 0})
    assert relayout(*MEMORY_RELAYOUT.ordered(names, {})) == 1
    # The row without its defaults (label high is no default), the current version out of the
    # snapshots, the earlier one without its defaults, the order as it was.
    assert redis_client.hgetall(key("row")) == {
        k: v for k, v in full.items() if ROW_DEFAULTS.get(k) != v}
    assert redis_client.hkeys(key("versions")) == ["17".zfill(20)]
    assert json.loads(redis_client.hget(key("versions"), "17".zfill(20)) or "") == {
        k: v for k, v in first.items() if ROW_DEFAULTS.get(k) != v}
    assert redis_client.zcard(key("version_order")) == 2
    assert relayout(*MEMORY_RELAYOUT.ordered(names, {})) == 0
