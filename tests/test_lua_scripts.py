"""The stores' Lua lives in ``app/store/lua/*.lua``: loaded by name, registered once per client,
compiled by a real server, and its refusals decoded in one table."""

from __future__ import annotations

import json
import re
import typing
from importlib import resources
from pathlib import Path

import pytest
import redis

from app.errors import (
    IdempotencyInProgress,
    LoomError,
    MemoryLocked,
    MemoryNotFound,
    UserBeingErased,
    WorkingMemoryLimitExceeded,
)
from app.store import lua
from app.store.idempotency import HeldKey, KeyedScript
from app.store.idempotency import State as IdempotencyState
from app.store.lua import STATUS_ERRORS, raise_for_status, script, source
from app.store.recall_vectors import STORE_OUTCOMES

ROOT = Path(__file__).resolve().parent.parent
SCRIPT_NAMES = sorted(
    entry.name.removesuffix(".lua")
    for entry in resources.files(lua).iterdir()
    if entry.name.endswith(".lua")
)
# Files holding only shared functions, pulled into scripts by --#include; never run alone.
INCLUDED_ONLY = {"version", "working_memory_parse", "memory_digest", "memory_write",
                 "memory_write_row", "memory_write_vectors", "memory_write_lexical",
                 "memory_write_digest", "memory_write_answer"}


# Stores whose scripts are still Python strings; the list only shrinks.
NOT_YET_MOVED: set[str] = set()


def test_no_python_file_of_the_service_holds_lua() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for package in ("app", "jobs")
        for path in sorted((ROOT / package).rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "redis.call" in line and str(path.relative_to(ROOT)) not in NOT_YET_MOVED
    ]
    assert offenders == [], "Lua belongs in app/store/lua/<name>.lua"


def test_includes_are_expanded_and_none_is_left_dangling() -> None:
    text = source("working_memory_set")
    assert "local function next_version" in text
    assert "local function parse" in text
    for name in SCRIPT_NAMES:
        assert "--#include" not in source(name), name


def test_a_missing_script_is_an_error_not_an_empty_script() -> None:
    with pytest.raises(FileNotFoundError):
        source("no_such_script")


@pytest.mark.parametrize("name", sorted(set(SCRIPT_NAMES) - INCLUDED_ONLY))
def test_every_script_compiles_on_a_real_server(redis_client: redis.Redis, name: str) -> None:
    sha = redis_client.script_load(source(name))
    assert redis_client.script_exists(sha) == [True]


def test_a_script_is_registered_once_per_client(redis_url: str) -> None:
    first = redis.Redis.from_url(redis_url, decode_responses=True)
    second = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        assert script(first, "renew_if_held") is script(first, "renew_if_held")
        assert script(second, "renew_if_held") is not script(first, "renew_if_held")
        assert script(second, "renew_if_held").registered_client is second
    finally:
        first.close()
        second.close()


def test_a_registered_script_runs_again_after_the_server_flushed_its_scripts(
    redis_client: redis.Redis,
) -> None:
    renew = script(redis_client, "renew_if_held")
    redis_client.set("lua-test:lock", "me")
    assert renew(keys=["lua-test:lock"], args=["me", 5000]) == 1
    redis_client.script_flush()
    assert renew(keys=["lua-test:lock"], args=["someone-else", 5000]) == 0
    assert 0 < redis_client.pttl("lua-test:lock") <= 5000


def test_a_refusal_raises_the_error_its_table_names() -> None:
    with pytest.raises(WorkingMemoryLimitExceeded) as raised:
        raise_for_status("working_memory", ["LIMIT", 20, 10], block_key="notes")
    assert raised.value.details == {"value_length": 20, "char_limit": 10}
    with pytest.raises(UserBeingErased):
        raise_for_status("working_memory", ["ERASING"], block_key="notes")


def test_a_success_reply_raises_nothing() -> None:
    raise_for_status("working_memory", ["OK", 1, 2, 3], block_key="notes")
    raise_for_status("working_memory", 1)
    raise_for_status("working_memory", None)


def test_a_memory_refusal_names_the_row_it_refused() -> None:
    with pytest.raises(MemoryNotFound) as missing:
        raise_for_status("memory", ["NO_VERSION"], key="notes", user_id="u-1", version=7)
    assert missing.value.details == {"key": "notes", "version_text": "7"}
    with pytest.raises(MemoryLocked) as locked:
        raise_for_status("memory", ["DERIVED_LOCKED", "summary", "mem_1"], key="notes",
                         user_id="u-1")
    assert locked.value.details == {"key": "summary", "memory_id": "mem_1"}
    with pytest.raises(UserBeingErased) as erasing:
        raise_for_status("memory", ["ERASING"], key="notes", user_id="u-1")
    assert erasing.value.details == {"user_id": "u-1"}


def test_a_lost_compare_and_swap_is_no_refusal() -> None:
    # The store retries on it (tests/test_memory.py); the table must not turn it into an answer.
    assert lua.COMPARE_AND_SWAP_LOST not in STATUS_ERRORS["memory"]
    raise_for_status("memory", [lua.COMPARE_AND_SWAP_LOST], key="notes", user_id="u-1")


def test_every_factory_builds_a_loom_error() -> None:
    reply = ["WORD", 1, 2, 3, 4, 5]
    context = {"block_key": "notes", "section": "s", "memory_id": "m", "agent": "a",
               "key": "k", "user_id": "u", "version": 1}
    for family, words in STATUS_ERRORS.items():
        for word, factory in words.items():
            assert isinstance(factory([word, *reply[1:]], context), LoomError), (family, word)


def test_every_refusal_word_a_script_returns_has_an_entry() -> None:
    known = {word for words in STATUS_ERRORS.values() for word in words}
    returned = {
        word
        for name in SCRIPT_NAMES
        for word in re.findall(r"return \{'([A-Z_]+)'", source(name))
    }
    # The idempotency scripts answer a key's state, which its store reads, never a refusal.
    states = set(typing.get_args(IdempotencyState))
    # The embeddings job counts what storing a vector came to; no caller sees it.
    states |= set(STORE_OUTCOMES)
    assert returned - {"OK", lua.COMPARE_AND_SWAP_LOST, lua.FENCE_LOST} - states <= known


@pytest.mark.slow
def test_a_built_wheel_carries_every_script(tmp_path: Path) -> None:
    import subprocess
    import sys
    import zipfile

    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = tmp_path.glob("loom_server-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    assert {f"app/store/lua/{name}.lua" for name in SCRIPT_NAMES} <= shipped


SCOPE_KEYS = ["lua-test:{u}:scope", "lua-test:{u}:index", "lua-test:{u}:erasing"]


def _keyed_append(client: redis.Redis, holder: str, try_holder: str
                  ) -> tuple[str, KeyedScript, HeldKey]:
    """A key's record held by ``holder``, the keyed append, and the key ``try_holder`` holds."""
    record = "lua-test:{u}:idem"
    client.hset(record, mapping={"state": "running", "holder": holder})
    append = KeyedScript(client, "working_memory_append", "working_memory")
    return record, append, HeldKey(record, try_holder)


def test_a_keyed_script_keeps_its_reply_in_the_record_in_its_own_step(
    redis_client: redis.Redis,
) -> None:
    record, append, held = _keyed_append(redis_client, "try-1", "try-1")
    reply = append(SCOPE_KEYS, ["notes", 7, "hello", 5, "\n", 1, 100], held)
    assert reply == ["OK", "7", 100, 5] and held.answered
    assert redis_client.hget(record, "state") == "done"
    assert json.loads(redis_client.hget(record, "reply") or "") == reply
    # The key is answered now: a second run with the same holder writes nothing.
    again = append(SCOPE_KEYS, ["notes", 8, "hello", 5, "\n", 1, 100], held)
    assert again == ["LEASE_LOST"]
    assert redis_client.hget("lua-test:{u}:scope", "notes") == "7:100:5:hello"


def test_a_keyed_script_writes_nothing_for_a_try_that_lost_the_key(
    redis_client: redis.Redis,
) -> None:
    record, append, held = _keyed_append(redis_client, "later-try", "first-try")
    with pytest.raises(IdempotencyInProgress):
        raise_for_status("working_memory", append(SCOPE_KEYS, ["notes", 7, "x", 1, "\n", 1, 9],
                                                  held))
    assert not held.answered and not redis_client.exists("lua-test:{u}:scope")
    assert redis_client.hget(record, "state") == "running"


def test_a_keyed_script_keeps_no_refusal(redis_client: redis.Redis) -> None:
    record, append, held = _keyed_append(redis_client, "try-1", "try-1")
    # Over the cap: refused, nothing applied, so the key stays the try's to settle.
    assert append(SCOPE_KEYS, ["notes", 7, "too long", 8, "\n", 1, 4], held) == ["LIMIT", 8, 4]
    assert not held.answered and redis_client.hget(record, "state") == "running"
    assert not redis_client.hexists(record, "reply")
