"""Working-memory blocks in Redis: one hash per (agent, user, session, run) scope.

A block is one field of its scope's hash, encoded ``<version>:<char_limit>:<length>:<content>``
(length in characters, so a script can check the cap without counting UTF-8). Every write is a
single Lua script: the read, the cap check, the version ``max(now_ns, last + 1)`` and the write
happen in one round trip and cannot interleave with another writer, so eight clients appending
to one block never retry and never lose an addition (docs/decisions.md, "Working-memory writes
run as Lua"). Reads are one HGET or one HGETALL/HMGET. Blocks have no TTL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.clock import iso_from_ns
from app.errors import (
    SubstringNotFound,
    UserBeingErased,
    WorkingMemoryBlockNotFound,
    WorkingMemoryLimitExceeded,
)
from app.store import keys
from app.store.identity import Identity
from app.store.lua import VERSION_LUA

if TYPE_CHECKING:
    from app.services import Services

DEFAULT_CHAR_LIMIT = 4096
MAX_CHAR_LIMIT = 16384
DEFAULT_BLOCK_KEY = "scratchpad"

# The parse shared by every write script: version, cap, length and the content's offset.
_PARSE_LUA = r"""
local function parse(raw)
  local v, l, n, pos = string.match(raw, '^(%d+):(%d+):(%d+):()')
  return v, tonumber(l), tonumber(n), pos
end
-- KEYS[3] marks the user as being erased: a write then would outlive the erasure.
local function erasing()
  return redis.call('EXISTS', KEYS[3]) == 1
end
local function store(key, index, field, version, limit, length, content)
  redis.call('HSET', key, field, version .. ':' .. limit .. ':' .. length .. ':' .. content)
  redis.call('SADD', index, key)
  return {'OK', version, limit, length}
end
"""

# KEYS: scope, index, erasing marker. ARGV: block_key, now_ns, char_limit ('' keeps the
# block's), content, content length, default char_limit.
_SET = VERSION_LUA + _PARSE_LUA + r"""
if erasing() then return {'ERASING'} end
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local last, limit = nil, tonumber(ARGV[3])
if raw then
  local v, l = parse(raw)
  last = v
  if not limit then limit = l end
end
if not limit then limit = tonumber(ARGV[6]) end
local length = tonumber(ARGV[5])
if length > limit then return {'LIMIT', length, limit} end
return store(KEYS[1], KEYS[2], ARGV[1], next_version(last, ARGV[2]), limit, length, ARGV[4])
"""

# ARGV: block_key, now_ns, addition, addition length, separator, separator length, default cap.
_APPEND = VERSION_LUA + _PARSE_LUA + r"""
if erasing() then return {'ERASING'} end
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local last, limit, length, content
if raw then
  local v, l, n, pos = parse(raw)
  last, limit = v, l
  length = n + tonumber(ARGV[6]) + tonumber(ARGV[4])
  if length > limit then return {'LIMIT', length, limit} end
  content = string.sub(raw, pos) .. ARGV[5] .. ARGV[3]
else
  limit = tonumber(ARGV[7])
  length = tonumber(ARGV[4])
  if length > limit then return {'LIMIT', length, limit} end
  content = ARGV[3]
end
return store(KEYS[1], KEYS[2], ARGV[1], next_version(last, ARGV[2]), limit, length, content)
"""

# ARGV: block_key, now_ns, old, old length, new, new length. Every occurrence is replaced, left
# to right without overlap, as str.replace does; byte matching equals character matching for
# valid UTF-8.
_REPLACE = VERSION_LUA + _PARSE_LUA + r"""
if erasing() then return {'ERASING'} end
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return {'MISSING'} end
local v, limit, n, pos = parse(raw)
local content = string.sub(raw, pos)
local parts, count, init = {}, 0, 1
while true do
  local s, e = string.find(content, ARGV[3], init, true)
  if not s then break end
  parts[#parts + 1] = string.sub(content, init, s - 1)
  parts[#parts + 1] = ARGV[5]
  init = e + 1
  count = count + 1
end
if count == 0 then return {'ABSENT'} end
parts[#parts + 1] = string.sub(content, init)
local length = n - count * tonumber(ARGV[4]) + count * tonumber(ARGV[6])
if length > limit then return {'LIMIT', length, limit} end
return store(KEYS[1], KEYS[2], ARGV[1], next_version(v, ARGV[2]), limit, length,
  table.concat(parts))
"""

# The index entry goes with the scope's last block, so erasure lists only live scopes.
_DELETE = r"""
local removed = redis.call('HDEL', KEYS[1], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('SREM', KEYS[2], KEYS[1]) end
return removed
"""


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
    def __init__(self, services: Services) -> None:
        self.redis = services.redis
        self.clock = services.clock
        self._set = self.redis.register_script(_SET)
        self._append = self.redis.register_script(_APPEND)
        self._replace = self.redis.register_script(_REPLACE)
        self._delete = self.redis.register_script(_DELETE)

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

    def _keys(self, identity: Identity) -> list[str]:
        return [
            self.scope_key(identity),
            self.index_key(identity),
            keys.user_erasing(identity.org, identity.namespace, identity.user_id),
        ]

    def _written(self, block_key: str, reply: list[Any]) -> BlockWrite:
        status = reply[0]
        if status == "ERASING":
            raise UserBeingErased(
                "this user is being erased; write again once the erasure is done"
            )
        if status == "LIMIT":
            raise WorkingMemoryLimitExceeded(int(reply[1]), int(reply[2]))
        if status == "MISSING":
            raise WorkingMemoryBlockNotFound(
                f"no working-memory block {block_key!r} in this scope", block_key=block_key
            )
        if status == "ABSENT":
            raise SubstringNotFound(
                f"the text to replace is not in block {block_key!r}", block_key=block_key
            )
        return BlockWrite(block_key, int(reply[1]), int(reply[2]), int(reply[3]))

    def set(
        self, identity: Identity, block_key: str, content: str, char_limit: int | None
    ) -> BlockWrite:
        """Replace the block. ``char_limit`` None keeps the block's cap (the default when new)."""
        reply = self._set(
            keys=self._keys(identity),
            args=[
                block_key,
                self.clock.now_ns(),
                "" if char_limit is None else char_limit,
                content,
                len(content),
                DEFAULT_CHAR_LIMIT,
            ],
        )
        return self._written(block_key, reply)

    def append(
        self, identity: Identity, block_key: str, addition: str, separator: str
    ) -> BlockWrite:
        reply = self._append(
            keys=self._keys(identity),
            args=[
                block_key,
                self.clock.now_ns(),
                addition,
                len(addition),
                separator,
                len(separator),
                DEFAULT_CHAR_LIMIT,
            ],
        )
        return self._written(block_key, reply)

    def replace(self, identity: Identity, block_key: str, old: str, new: str) -> BlockWrite:
        reply = self._replace(
            keys=self._keys(identity),
            args=[block_key, self.clock.now_ns(), old, len(old), new, len(new)],
        )
        return self._written(block_key, reply)

    def delete(self, identity: Identity, block_key: str) -> bool:
        return bool(self._delete(keys=self._keys(identity), args=[block_key]))

    def get(self, identity: Identity, block_key: str) -> Block | None:
        raw = self.redis.hget(self.scope_key(identity), block_key)
        return None if raw is None else decode_block(block_key, raw)

    def blocks(
        self, identity: Identity, block_keys: list[str] | None = None, limit: int | None = None
    ) -> list[Block]:
        """Live blocks of the scope in block_key order; named ones only when given."""
        scope = self.scope_key(identity)
        if block_keys:
            wanted = sorted(set(block_keys))
            found = zip(wanted, self.redis.hmget(scope, wanted), strict=True)
            blocks = [decode_block(key, raw) for key, raw in found if raw is not None]
        else:
            blocks = [decode_block(key, raw) for key, raw in self.redis.hgetall(scope).items()]
            blocks.sort(key=lambda block: block.block_key)
        return blocks if limit is None else blocks[:limit]

    def scopes_of_user(self, org: str, namespace: str, user_id: str) -> set[str]:
        return self.redis.smembers(keys.working_memory_scopes(org, namespace, user_id))

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
