"""The stores' server-side Lua: one ``<name>.lua`` file per script, and what their replies mean.

A script file may start with ``--#include <name>`` lines; each is replaced by that file's text,
so shared functions (the decimal version arithmetic, a store's parse helpers) are written once.
A script declared in app/store/script_interfaces.py starts with a preamble naming its keys and
arguments (``K_row``, ``A_now``), so its Lua refers to them by name.
``script(client, name)`` registers a script once per Redis client and hands back the same
redis-py ``Script`` to every store built on that client; calling it runs EVALSHA and loads the
script again only when the server has lost it.

A script refuses a write by answering ``{'<STATUS WORD>', ...}``; ``STATUS_ERRORS`` maps every
such word, per script family, to the ``LoomError`` the caller raises, so no store decodes
status words of its own. Two words are no refusal: ``COMPARE_AND_SWAP_LOST`` tells a store to
read again and retry, and ``FENCE_LOST`` that a worker's lease no longer covers the write.

``keyed_script(client, name, family)`` is the same script made one step with an
Idempotency-Key's answer (app/idempotency.py): called with the key's record as its last key and
the try's holder as its last argument, it writes only while that try holds the key, and keeps
its reply in the record in the same step unless the reply is one of ``family``'s refusals
(which applied nothing, so a retry may run it again).
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Callable, Mapping
from functools import cache
from importlib import resources
from typing import Any

import redis
from redis.commands.core import Script

from app.errors import (
    CharLimitExceeded,
    ErasureRunning,
    HashMismatch,
    IdempotencyInProgress,
    LoomError,
    MemoryLocked,
    MemoryNotDeleted,
    MemoryNotFound,
    MemoryPinned,
    MemoryTypeMismatch,
    SubstringNotFound,
    UserBeingErased,
    ValidationFailed,
    WorkingMemoryBlockNotFound,
    WorkingMemoryLimitExceeded,
    WriteContended,
)
from app.store.script_interfaces import interface_of

_INCLUDE = re.compile(r"^--#include (\w+)[ \t]*$", re.MULTILINE)


@cache
def source(name: str) -> str:
    """The text of ``<name>.lua`` with its includes expanded (read from the installed package),
    after the preamble naming its keys and arguments when app/store/script_interfaces.py
    declares them."""
    interface = interface_of(name)
    text = _expanded(name)
    return text if interface is None else interface.preamble() + text


@cache
def _expanded(name: str) -> str:
    text = resources.files(__name__).joinpath(f"{name}.lua").read_text(encoding="utf-8")
    return _INCLUDE.sub(lambda match: _expanded(match.group(1)), text)


# Keyed by the client object itself and dropped with it: a test's throwaway client does not
# keep its scripts alive, and two clients on one server each hold their own Script objects.
_registered: weakref.WeakKeyDictionary[Any, dict[str, Script]] = weakref.WeakKeyDictionary()
_registering = threading.Lock()


def script(client: redis.Redis, name: str) -> Script:
    """The script ``<name>.lua`` registered on ``client``; the same object on every call."""
    with _registering:
        scripts = _registered.setdefault(client, {})
        found = scripts.get(name)
        if found is None:
            found = scripts[name] = client.register_script(source(name))
        return found


# What a keyed script (below) answers when its try no longer holds the key: it wrote nothing.
LEASE_LOST = "LEASE_LOST"



def keyed_script(client: redis.Redis, name: str, family: str) -> Script:
    """``name``'s script as one step with a held Idempotency-Key's answer (see the module's
    docstring); refusals are ``family``'s status words (none for a family without any), which
    it does not keep."""
    keyed_name = f"{name}+keyed:{family}"
    with _registering:
        scripts = _registered.setdefault(client, {})
        found = scripts.get(keyed_name)
        if found is None:
            found = scripts[keyed_name] = client.register_script(keyed_source(name, family))
        return found


@cache
def keyed_source(name: str, family: str) -> str:
    words = sorted({*STATUS_ERRORS.get(family, {}), COMPARE_AND_SWAP_LOST, FENCE_LOST,
                    LEASE_LOST})
    refusals = ", ".join(f"[{word!r}] = true" for word in words)
    wrapper = source("keyed_answer").replace("--[[keyed refusals]]", refusals)
    return wrapper.replace("--#keyed body", source(name))


# A factory gets the script's whole reply (status word first) and the caller's context.
ErrorFactory = Callable[[list[Any], Mapping[str, Any]], LoomError]


def _erasing(_reply: list[Any], _context: Mapping[str, Any]) -> LoomError:
    return UserBeingErased("this user is being erased; write again once the erasure is done")


def _memory_locked(reply: list[Any], context: Mapping[str, Any]) -> LoomError:
    key = context["key"]
    return MemoryLocked(
        f"row {key!r} is locked: only memory.unlock writes to it", key=key, memory_id=reply[1]
    )


def _memory_erasing(_reply: list[Any], context: Mapping[str, Any]) -> LoomError:
    user_id = context["user_id"]
    return UserBeingErased(
        f"user {user_id!r} is being erased; writes are refused", user_id=user_id
    )


def _lease_lost() -> LoomError:
    # The try answering an Idempotency-Key lost its lease on the key to a later try
    # (app/idempotency.py), checked in the write's own step: it wrote nothing, and the try
    # holding the key now answers for it.
    return IdempotencyInProgress(
        "a later try with this Idempotency-Key holds it now; this one wrote nothing",
        retry_after=1)


# Not a refusal: a compare-and-swap write found the row moved since it read it. The store
# reads again and retries (app/store/memory.py), so the word never becomes an error answer.
COMPARE_AND_SWAP_LOST = "CONFLICT"
# Not a refusal either: a worker's write under a lease's fence whose token is not the one
# there (a later pass took the user, or the fence lapsed). The store raises LeaseLost, which
# stops the worker's pass; no caller ever sees it.
FENCE_LOST = "FENCED"

STATUS_ERRORS: dict[str, dict[str, ErrorFactory]] = {
    "agent_state": {
        "ERASING": lambda _reply, _context: UserBeingErased(
            "this customer is being erased; write again once the erasure is done"),
        # The state changed since it was read: the store retries from the hash the script
        # answered, and gives up with this after its attempts.
        "CONFLICT": lambda _reply, _context: WriteContended(
            "the state kept changing under the write; try again", retry_after=1),
    },
    "erasure": {
        # The marker is gone: the erasure finished in another process meanwhile.
        "NOMARK": lambda _, context: ErasureRunning(
            "another process finished this erasure; ask erasure.status",
            erasure_id=context.get("erasure_id", ""), retry_after=5),
    },
    "working_memory": {
        "ERASING": _erasing,
        "LIMIT": lambda reply, _: WorkingMemoryLimitExceeded(int(reply[1]), int(reply[2])),
        "MISSING": lambda _, context: WorkingMemoryBlockNotFound(
            f"no working-memory block {context['block_key']!r} in this scope",
            block_key=context["block_key"],
        ),
        "ABSENT": lambda _, context: SubstringNotFound(
            f"the text to replace is not in block {context['block_key']!r}",
            block_key=context["block_key"],
        ),
    },
    # Context: key and user_id of the row; version for a delete_version and a revert.
    "memory": {
        "ERASING": _memory_erasing,
        "LOCKED": _memory_locked,
        "PINNED": lambda reply, context: MemoryPinned(
            f"row {context['key']!r} is pinned or labelled high: a worker leaves it as it is",
            key=context["key"],
            memory_id=reply[1],
        ),
        "TYPE": lambda reply, context: MemoryTypeMismatch.of(context["key"], reply[1], ""),
        "MISMATCH": lambda reply, context: HashMismatch(
            f"row {context['key']!r} changed: its content_sha256 is not the one given",
            key=context["key"],
            content_sha256=reply[1],
        ),
        "LIMIT": lambda reply, _: CharLimitExceeded(int(reply[1]), int(reply[2])),
        "MISSING": lambda _, context: MemoryNotFound(
            f"no memory row {context['key']!r} here", key=context["key"]
        ),
        "NO_VERSION": lambda _, context: MemoryNotFound(
            f"row {context['key']!r} has no version {context['version']}",
            key=context["key"],
            version_text=str(context["version"]),
        ),
        "NOT_DELETED": lambda reply, context: MemoryNotDeleted(
            f"row {context['key']!r} is not deleted: a restore brings back a deleted row",
            key=context["key"],
            memory_id=reply[1],
        ),
        "NO_CONTENT": lambda _, context: MemoryNotFound(
            f"row {context['key']!r} has no version with content to restore",
            key=context["key"],
        ),
        # A revert to a deletion or a redacted version: no content to bring back.
        "EMPTY_VERSION": lambda _, context: ValidationFailed(
            {"version": [f"version {context['version']} of row {context['key']!r} holds no "
                         "content (a deletion or a redacted version)"]},
        ),
        LEASE_LOST: lambda _reply, _context: _lease_lost(),
        "DERIVED_LOCKED": lambda reply, _: MemoryLocked(
            f"profile row {reply[1]!r}, built from this row, is locked: unlock it, then "
            "redact again",
            key=reply[1],
            memory_id=reply[2],
        ),
    },
}


def raise_for_status(family: str, reply: Any, **context: Any) -> None:
    """Raise the error a refusal of ``family``'s scripts stands for; return on any other reply."""
    if not isinstance(reply, list) or not reply or not isinstance(reply[0], str):
        return
    if reply[0] == LEASE_LOST:
        raise _lease_lost()
    factory = STATUS_ERRORS.get(family, {}).get(reply[0])
    if factory is not None:
        raise factory(reply, context)
