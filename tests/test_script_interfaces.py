"""A script's KEYS and ARGV are declared once (app/store/script_interfaces.py): the loader names
them in a preamble, the store passes them by name, and a declared script's Lua refers to no key
or argument by position."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis

from app.store.lua import _expanded, source
from app.store.script_interfaces import (
    INTERFACES,
    MEMORY_SET,
    MEMORY_WRITE_KEYS,
    ScriptInterface,
)

ROOT = Path(__file__).resolve().parent.parent
PROBE = ScriptInterface("probe", keys=("first", "second", "third"), args=("alpha", "beta"),
                        more_args="rest")
PROBE_BODY = "return {K_first, K_second, K_third, A_alpha, A_beta, A_rest_from, #ARGV}"


def test_the_preamble_names_each_key_and_argument_where_redis_puts_it(
    redis_client: redis.Redis,
) -> None:
    probe = redis_client.register_script(PROBE.preamble() + PROBE_BODY)
    ordered_keys, ordered_args = PROBE.ordered(
        {"third": "k:{t}:3", "first": "k:{t}:1", "second": "k:{t}:2"},
        {"beta": "b", "alpha": "a"}, more_args=["r1", "r2"])
    assert probe(keys=ordered_keys, args=ordered_args) == [
        "k:{t}:1", "k:{t}:2", "k:{t}:3", "a", "b", 3, 4]


def test_an_absent_optional_key_is_the_first_key_so_it_stays_in_the_slot() -> None:
    ordered_keys, _ = PROBE.ordered({"first": "k:{t}:1", "second": None, "third": "k:{t}:3"},
                                    {"alpha": "a", "beta": "b"})
    assert ordered_keys == ["k:{t}:1", "k:{t}:1", "k:{t}:3"]


def test_a_call_missing_or_misspelling_a_name_fails_before_redis() -> None:
    with pytest.raises(TypeError, match=r"missing \['third'\]"):
        PROBE.ordered({"first": "a", "second": "b"}, {"alpha": "a", "beta": "b"})
    with pytest.raises(TypeError, match=r"not declared \['gamma'\]"):
        PROBE.ordered({"first": "a", "second": "b", "third": "c"},
                      {"alpha": "a", "beta": "b", "gamma": "c"})
    with pytest.raises(TypeError, match="first key"):
        PROBE.ordered({"first": None, "second": "b", "third": "c"}, {"alpha": "a", "beta": "b"})
    no_tail = ScriptInterface("no_tail", keys=("a",), args=())
    with pytest.raises(TypeError, match="no variable tail"):
        no_tail.ordered({"a": "k"}, {}, more_args=["x"])


def test_a_script_whose_keys_are_all_its_tail_takes_them_in_order(
    redis_client: redis.Redis,
) -> None:
    """A script reading one set of keys per user (recall_search.lua) declares no fixed key: its
    tail starts at the first key, and no first key is required."""
    tail_only = ScriptInterface("tail_only", keys=(), args=("users",), more_keys="indexes")
    probe = redis_client.register_script(
        tail_only.preamble() + "return {K_indexes_from, A_users, KEYS[K_indexes_from + 1]}")
    ordered_keys, ordered_args = tail_only.ordered({}, {"users": 2},
                                                   more_keys=["k:{t}:1", "k:{t}:2"])
    assert ordered_keys == ["k:{t}:1", "k:{t}:2"]
    assert probe(keys=ordered_keys, args=ordered_args) == [1, "2", "k:{t}:2"]


def test_a_name_declared_twice_or_not_a_lua_name_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        ScriptInterface("bad", keys=("row", "row"), args=())
    with pytest.raises(ValueError, match="no Lua name"):
        ScriptInterface("bad", keys=("row-key",), args=())


def test_the_loader_puts_the_preamble_before_the_includes() -> None:
    text = source("memory_set")
    assert text.startswith(MEMORY_SET.preamble())
    assert text.index("local A_tail = ARGV[") < text.index("cjson.decode(A_tail)")


def _code(name: str) -> str:
    """A script's Lua (includes expanded, no preamble) without its comment lines."""
    return "\n".join(line for line in _expanded(name).splitlines()
                     if not line.lstrip().startswith("--"))


@pytest.mark.parametrize("name", sorted(INTERFACES))
def test_a_declared_script_names_every_key_and_argument_it_reads(name: str) -> None:
    interface = INTERFACES[name]
    body = _code(name)
    # No position: a key or argument is read by its name (a variable tail by index from its
    # declared start).
    assert re.findall(r"(?:KEYS|ARGV)\[\d+\]|#KEYS\b", body) == []
    declared = {f"K_{n}" for n in interface.keys} | {f"A_{n}" for n in interface.args}
    if interface.more_keys:
        declared.add(f"K_{interface.more_keys}_from")
    if interface.more_args:
        declared.add(f"A_{interface.more_args}_from")
    # Every name the Lua reads is declared (a misspelt one would be a nil global at run time).
    assert set(re.findall(r"\b[KA]_\w+", body)) <= declared


# What memory_write.lua reads from its JSON tail: values only, never a key name.
TAIL_FIELDS = {"apply", "user_id", "pointer_value", "wake_member", "wakes_total",
               "namespace_json", "structured_row", "holder", "embed_job", "embed_ttl"}


MEMORY_WRITES = sorted(name for name, interface in INTERFACES.items()
                       if interface.keys[:len(MEMORY_WRITE_KEYS)] == MEMORY_WRITE_KEYS)


def test_the_memory_writes_are_the_scripts_that_include_memory_write() -> None:
    assert MEMORY_WRITES == sorted(name for name in INTERFACES
                                   if "--#include memory_write\n" in _raw(name))


def _raw(name: str) -> str:
    return (ROOT / "app" / "store" / "lua" / f"{name}.lua").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", MEMORY_WRITES)
def test_a_memory_write_takes_every_key_as_a_declared_key(name: str) -> None:
    body = _code(name)
    fields = set(re.findall(r"\b(?:TAIL|t)\.(\w+)", body))
    assert fields <= TAIL_FIELDS, fields - TAIL_FIELDS
    # No key is made by joining text onto a declared one, and none is escaped in Lua: the
    # memory_id's pointer is a field of the declared pointer hash.
    assert re.findall(r"K_\w+\s*\.\.|\.\.\s*K_\w+", body) == []
    assert "escape" not in body and "t.pointer .." not in body
    assert "{'HSET', 'pointers', r.memory_id, t.pointer_value}" in body


# --- every script is declared ------------------------------------------------------------------

LUA = ROOT / "app" / "store" / "lua"
SCRIPT_FILES = sorted(path.stem for path in LUA.glob("*.lua"))

# Files of shared functions, pulled into scripts by ``--#include``, and the keyed wrapper
# (app/store/lua keyed_source), which a write script's text is spliced into: never run alone,
# they read the names of the script that includes them.
INCLUDES = {name for path in LUA.glob("*.lua")
            for name in re.findall(r"^--#include (\w+)", path.read_text(encoding="utf-8"),
                                   re.MULTILINE)} | {"keyed_answer"}

SCRIPTS = [name for name in SCRIPT_FILES if name not in INCLUDES]


def test_the_sets_name_real_files_and_leave_scripts_to_check() -> None:
    assert INCLUDES <= set(SCRIPT_FILES)
    assert len(SCRIPTS) >= 30


def test_every_script_has_a_declaration() -> None:
    assert [name for name in SCRIPTS if name not in INTERFACES] == []
    # And nothing is declared for a script that does not exist.
    assert set(INTERFACES) <= set(SCRIPT_FILES)


@pytest.mark.parametrize("name", SCRIPT_FILES)
def test_no_script_or_include_reads_a_key_or_argument_by_its_position(name: str) -> None:
    own = "\n".join(line for line in _raw(name).splitlines()
                    if not line.lstrip().startswith("--"))
    assert re.findall(r"(?:KEYS|ARGV)\[\s*\d|#KEYS\b", own) == []
    # What is still read by index is a declared variable-length tail, from its declared start.
    interface = INTERFACES.get(name)
    if "KEYS[" in own:
        assert interface is not None and interface.more_keys, "KEYS read by index, no tail"
        assert f"K_{interface.more_keys}_from" in own
    if "ARGV[" in own:
        assert interface is not None and interface.more_args, "ARGV read by index, no tail"
        assert f"A_{interface.more_args}_from" in own
