"""Working-memory blocks in Redis: one hash per (agent, user, session, run) scope.

A block is one field of its scope's hash, encoded ``<version>:<char_limit>:<length>:<content>``
(length in characters, so a script can check the cap without counting UTF-8). Every write is a
single Lua script (``app/store/lua/working_memory_*.lua``): the read, the cap check, the
version ``max(now_ns, last + 1)`` and the write happen in one round trip and cannot interleave
with another writer, so eight clients appending to one block never retry and never lose an
addition (docs/decisions.md, "Working-memory writes run as Lua"). Reads are one HGET or one
HGETALL/HMGET. Blocks have no TTL. A write answering an Idempotency-Key keeps its reply as
the key's answer in the same script step (``KeyedScript``), and ``write_of`` reads the answer
back from that reply.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.clock import iso_from_ns
from app.store import keys
from app.store.idempotency import HeldKey, KeyedScript
from app.store.identity import Identity
from app.store.lua import raise_for_status
from app.store.replies import optional_text, optional_texts, text_map, text_set
from app.store.script_interfaces import (
    WORKING_MEMORY_APPEND,
    WORKING_MEMORY_DELETE,
    WORKING_MEMORY_REPLACE,
    WORKING_MEMORY_SET,
)

if TYPE_CHECKING:
    from app.store.services import StoreServices

DEFAULT_CHAR_LIMIT = 4096
MAX_CHAR_LIMIT = 16384
DEFAULT_BLOCK_KEY = "scratchpad"
# The scripts' refusal words (app/store/lua STATUS_ERRORS).
FAMILY = "working_memory"

@dataclass(frozen=True, slots=True)
class Block:
    block_key: str
    content: str
    char_limit: int
    version: int

    @property
    def fill_ratio(self) -> float:
        return fill_ratio(len(self.content), self.char_limit)

    def as_answer(self) -> dict[str, Any]:
        return {
            "block_key": self.block_key,
            "content": self.content,
            "char_limit": self.char_limit,
            "version": self.version,
            "version_text": str(self.version),
            "updated_at": iso_from_ns(self.version),
            "fill_ratio": self.fill_ratio,
        }


@dataclass(frozen=True, slots=True)
class ScopeSummary:
    agent: str
    session_id: str
    run_id: str
    block_count: int

    def as_answer(self) -> dict[str, Any]:
        return {"agent": self.agent, "session_id": self.session_id, "run_id": self.run_id,
                "block_count": self.block_count}


@dataclass(frozen=True, slots=True)
class BlockWrite:
    block_key: str
    version: int
    char_limit: int
    value_length: int

    def as_answer(self) -> dict[str, Any]:
        return {
            "block_key": self.block_key,
            "version": self.version,
            "version_text": str(self.version),
            "char_limit": self.char_limit,
            "value_length": self.value_length,
            "fill_ratio": fill_ratio(self.value_length, self.char_limit),
        }


def fill_ratio(length: int, char_limit: int) -> float:
    return round(length / char_limit, 3)


def decode_block(block_key: str, raw: str) -> Block:
    version, char_limit, _length, content = raw.split(":", 3)
    return Block(block_key, content, int(char_limit), int(version))


class WorkingMemoryStore:
    def __init__(self, services: StoreServices) -> None:
        self.redis = services.redis
        self.clock = services.clock
        self._set = KeyedScript(self.redis, "working_memory_set", FAMILY)
        self._append = KeyedScript(self.redis, "working_memory_append", FAMILY)
        self._replace = KeyedScript(self.redis, "working_memory_replace", FAMILY)
        self._delete = KeyedScript(self.redis, "working_memory_delete", FAMILY)

    @staticmethod
    def scope_key(identity: Identity) -> str:
        return keys.working_memory_scope(
            identity.org,
            identity.namespace,
            identity.user_id,
            identity.agent,
            identity.session_id,
            identity.run_id,
        )

    @staticmethod
    def index_key(identity: Identity) -> str:
        return keys.working_memory_scopes(identity.org, identity.namespace, identity.user_id)

    def _keys(self, identity: Identity) -> dict[str, str | None]:
        """WORKING_MEMORY_KEYS by name."""
        return {
            "scope": self.scope_key(identity),
            "index": self.index_key(identity),
            "erasing": keys.user_erasing(identity.org, identity.namespace, identity.user_id),
        }

    @staticmethod
    def write_of(block_key: str, reply: list[Any]) -> BlockWrite:
        """What a write script's reply (or the copy kept for an Idempotency-Key) says."""
        raise_for_status(FAMILY, reply, block_key=block_key)
        return BlockWrite(block_key, int(reply[1]), int(reply[2]), int(reply[3]))

    def set(
        self, identity: Identity, block_key: str, content: str, char_limit: int | None,
        held: HeldKey | None = None,
    ) -> BlockWrite:
        """Replace the block. ``char_limit`` None keeps the block's cap (the default when new)."""
        reply = self._set(*WORKING_MEMORY_SET.ordered(self._keys(identity), {
            "block_key": block_key,
            "now": self.clock.now_ns(),
            "char_limit": "" if char_limit is None else char_limit,
            "content": content,
            "length": len(content),
            "default_char_limit": DEFAULT_CHAR_LIMIT,
        }), held=held)
        return self.write_of(block_key, reply)

    def append(
        self, identity: Identity, block_key: str, addition: str, separator: str,
        held: HeldKey | None = None,
    ) -> BlockWrite:
        reply = self._append(*WORKING_MEMORY_APPEND.ordered(self._keys(identity), {
            "block_key": block_key,
            "now": self.clock.now_ns(),
            "addition": addition,
            "addition_length": len(addition),
            "separator": separator,
            "separator_length": len(separator),
            "default_char_limit": DEFAULT_CHAR_LIMIT,
        }), held=held)
        return self.write_of(block_key, reply)

    def replace(self, identity: Identity, block_key: str, old: str, new: str,
                held: HeldKey | None = None) -> BlockWrite:
        reply = self._replace(*WORKING_MEMORY_REPLACE.ordered(self._keys(identity), {
            "block_key": block_key, "now": self.clock.now_ns(), "old": old,
            "old_length": len(old), "new": new, "new_length": len(new),
        }), held=held)
        return self.write_of(block_key, reply)

    def delete(self, identity: Identity, block_key: str, held: HeldKey | None = None) -> bool:
        reply = self._delete(*WORKING_MEMORY_DELETE.ordered(
            self._keys(identity), {"block_key": block_key}), held=held)
        raise_for_status(FAMILY, reply)
        return bool(reply)

    def get(self, identity: Identity, block_key: str) -> Block | None:
        raw = optional_text(self.redis.hget(self.scope_key(identity), block_key))
        return None if raw is None else decode_block(block_key, raw)

    def blocks(
        self, identity: Identity, block_keys: list[str] | None = None, limit: int | None = None
    ) -> list[Block]:
        """Live blocks of the scope in block_key order; named ones only when given."""
        scope = self.scope_key(identity)
        if block_keys:
            wanted = sorted(set(block_keys))
            found = zip(wanted, optional_texts(self.redis.hmget(scope, wanted)), strict=True)
            blocks = [decode_block(key, raw) for key, raw in found if raw is not None]
        else:
            stored = text_map(self.redis.hgetall(scope))
            blocks = [decode_block(key, raw) for key, raw in stored.items()]
            blocks.sort(key=lambda block: block.block_key)
        return blocks if limit is None else blocks[:limit]

    # builtins.set: the class's own ``set`` method would shadow the type here.
    def scopes_of_user(self, org: str, namespace: str, user_id: str) -> builtins.set[str]:
        return text_set(self.redis.smembers(keys.working_memory_scopes(org, namespace, user_id)))

    def scope_summaries(self, org: str, namespace: str, user_id: str) -> list[ScopeSummary]:
        """The user's live scopes with their block counts, in (agent, session, run) order:
        one SMEMBERS and one pipelined HLEN per scope, no content read."""
        scope_keys = sorted(self.scopes_of_user(org, namespace, user_id))
        if not scope_keys:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for key in scope_keys:
            pipe.hlen(key)
        summaries = [
            ScopeSummary(*keys.working_memory_scope_parts(key), block_count=count)
            for key, count in zip(scope_keys, pipe.execute(), strict=True)
            if count
        ]
        summaries.sort(key=lambda summary: (summary.agent, summary.session_id, summary.run_id))
        return summaries
