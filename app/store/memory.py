"""Memory rows in Redis: facts and profile sections, their versions, and what the workers read.

A row is named by (org, namespace, user_id, agent, session_id, key) and lives under its user's
hash tag ``{org/namespace/user_id}``. Per row: a hash of its current fields, a hash of its
versions (zero-padded version -> JSON snapshot of every field at that version) and a sorted set
of those versions (all scores 0, so lex order is age order). Per user: a sorted set of the rows
(``key NUL agent NUL session_id``, for ``memory.list`` and key lookups across agents), a hash
memory_id -> row key, the set of live profile-section rows (for ``profile.render``), and the
inputs of the structured-profile worker:

* ``profile-src``: memory_id -> ``content_sha256:confidence:date_ns`` for every row that is a
  source now (a current semantic/preference/decision row, not ``high``, not a duplicate, no
  ``about:other``/``attribute:*``/``forget`` tag, not redacted, not past its ``valid_to``);
  ``date_ns`` is ``valid_at``, else the version of the row's last change.
* ``profile-digest``: ``digest`` (XOR over the sources of sha1(memory_id|entry), 40 hex),
  ``count``, ``changed_at`` (ns of the last write that moved the digest), ``removed_at`` (ns of
  the last time a source left) and ``next_expiry`` (the earliest ``valid_to`` among sources).

Every write is one Lua script over the user's slot: the row, its snapshot, the indexes and the
source digest move together or not at all, so a reader of the digest never sees it disagree
with the rows, and reading it is one HGETALL. XOR makes the digest incremental (a write takes
out the row's old entry and puts in the new one) and order-free, which costs nothing: each
entry carries its own date, so a change to the order a build reads in is a change to an entry.
Lua has no sha256, so the per-entry hash is ``redis.sha1hex``; the digest detects change, it
does not authenticate. ``source_digest_of`` computes the same value in Python.

Across slots, after the script and in one pipeline: the memory_id pointer
(``{org/namespace}``), the namespace's set of users with profile sections and its sorted set of
users whose sources changed. They are re-asserted on every write of the row; a process that dies
between the two round trips leaves them behind until the row's next write, and the structured
pass compares digests, so a lost "changed" entry is repaired by its scan (docs/decisions.md).

Content is computed in Python: ``value_length`` is the length of the value's canonical JSON
(compact, sorted keys, non-ASCII kept) and ``content_sha256`` the sha256 of it. ``append`` and
``replace`` therefore read, compute and write with a compare-and-swap on the row's version,
retrying when another writer came first, so concurrent appends lose nothing.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from app.clock import iso_from_ns
from app.errors import (
    CharLimitExceeded,
    HashMismatch,
    MemoryLocked,
    MemoryNotFound,
    MemoryPinned,
    MemoryTypeMismatch,
    ProfileSectionNotFound,
    SubstringNotFound,
    UserBeingErased,
    ValidationFailed,
    WriteContended,
)
from app.store import keys
from app.store.batching import pairs
from app.store.lua import script, source

if TYPE_CHECKING:
    from app.services import Services

SOURCE_TYPES = frozenset({"semantic", "preference", "decision"})
# The structured profile's row (agent '-', session '-') and the worker that writes it: a write
# to that row by anyone else lists the user as changed, so the worker rebuilds over it.
STRUCTURED_PROFILE_KEY = "structured_profile"
STRUCTURED_WORKER = "worker:structured_profile"
PROFILE_TYPE = "profile"
DEFAULT_PROFILE_CHAR_LIMIT = 8192
# The largest char_limit, and the cap of a row that has none.
MAX_CHAR_LIMIT = 65536
DELETE_VERSION_TRACE = "memory.delete_version:"
ZERO_DIGEST = "0" * 40
VERSION_WIDTH = 20
# A compare-and-swap write (append, replace) gives up after this long under contention.
CAS_DEADLINE_SECONDS = 5.0
NUL = "\x00"


# --------------------------------------------------------------------------------------------
# Content helpers, shared with the ops and the workers


def canonical_json(value: Any) -> str:
    """The form ``char_limit`` measures and ``content_sha256`` hashes."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def content_sha256(canonical: str) -> str:
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def format_confidence(confidence: float) -> str:
    """One spelling per number, so equal confidences give equal digest entries."""
    return repr(float(confidence))


def tags_exclude(tags: Iterable[str]) -> bool:
    """Tags that keep a fact out of every profile: about someone else, protected, forget."""
    return any(t in ("about:other", "forget") or t.startswith("attribute:") for t in tags)


def pad_version(version: int | str) -> str:
    return str(version).zfill(VERSION_WIDTH)


def source_entry(sha: str, confidence: str, date_ns: int | str) -> str:
    return f"{sha}:{confidence}:{date_ns}"


def source_digest_of(entries: Mapping[str, str]) -> str:
    """The digest the write scripts keep, computed from scratch (for builds and tests)."""
    acc = 0
    for memory_id, entry in entries.items():
        acc ^= int(hashlib.sha1(f"{memory_id}|{entry}".encode()).hexdigest(), 16)
    return f"{acc:040x}"


def new_memory_id() -> str:
    return "mem_" + secrets.token_hex(8)


# --------------------------------------------------------------------------------------------
# Lua

# The shared part of every write script. KEYS: 1 row, 2 versions, 3 version order, 4 the user's
# rows, 5 memory_id -> row key, 6 renderable profile sections, 7 sources, 8 digest, 9 source
# expiry, 10 the user's erasure marker, 11 live rows.
_COMMON_LUA = source("version") + r"""
local ZERO = string.rep('0', 40)
local SOURCE_TYPES = {semantic = true, preference = true, decision = true}
local NUL = string.char(0)

-- The section's three entries in the user's section index (keys.profile_sections).
local function section_members(key, agent, session_id)
  return {
    'l' .. NUL .. key .. NUL .. agent .. NUL .. session_id,
    'a' .. NUL .. agent .. NUL .. key .. NUL .. session_id,
    's' .. NUL .. session_id .. NUL .. key .. NUL .. agent,
  }
end

local function index_section(key, agent, session_id, renderable)
  local members = section_members(key, agent, session_id)
  if renderable then
    redis.call('ZADD', KEYS[6], 0, members[1], 0, members[2], 0, members[3])
  else
    redis.call('ZREM', KEYS[6], members[1], members[2], members[3])
  end
end

-- The row's entries in the user's live rows (keys.memory_live); old_type is the type it had
-- before this write (nil for a new row), whose entry goes when the type changes.
local function index_live(r, old_type, member)
  if old_type and old_type ~= r.memory_type then
    redis.call('ZREM', KEYS[11], old_type .. NUL .. member)
  end
  if r.deleted == '1' then
    redis.call('ZREM', KEYS[11], r.memory_type .. NUL .. member, NUL .. member)
  else
    redis.call('ZADD', KEYS[11], 0, r.memory_type .. NUL .. member, 0, NUL .. member)
  end
end

local function load_row()
  local flat = redis.call('HGETALL', KEYS[1])
  if #flat == 0 then return nil end
  local r = {}
  for i = 1, #flat, 2 do r[flat[i]] = flat[i + 1] end
  return r
end

local function flatten(r)
  local flat = {}
  for k, v in pairs(r) do
    flat[#flat + 1] = k
    flat[#flat + 1] = v
  end
  return flat
end

local function pad(v) return string.rep('0', 20 - #v) .. v end

local function xor_hex(a, b)
  local out = {}
  for i = 1, 40, 4 do
    local x = bit.bxor(tonumber(string.sub(a, i, i + 3), 16), tonumber(string.sub(b, i, i + 3), 16))
    out[#out + 1] = string.format('%04x', x)
  end
  return table.concat(out)
end

-- The row's entry in the user's sources, or nil when it is not a source now.
local function source_entry(r, now)
  if r.deleted == '1' or r.redacted == '1' then return nil end
  if not SOURCE_TYPES[r.memory_type] then return nil end
  if r.label == 'high' or (r.duplicate_of or '') ~= '' or r.tag_excluded == '1' then
    return nil
  end
  if (r.valid_to or '') ~= '' and not dec_gt(r.valid_to, now) then return nil end
  local date = r.valid_at or ''
  if date == '' then date = r.version end
  return r.content_sha256 .. ':' .. r.confidence .. ':' .. date
end

-- Move one source's entry in (src, dig, exp); true when the digest moved. The expiry index
-- follows valid_to even when the entry stays (a valid_at-dated fact whose valid_to moved).
local function update_sources(src, dig, exp, mid, entry, valid_to, at)
  local expiry_moved
  if entry and valid_to ~= '' then
    redis.call('ZADD', exp, valid_to, mid)
    expiry_moved = true
  else
    expiry_moved = redis.call('ZREM', exp, mid) == 1
  end
  if expiry_moved then
    local first = redis.call('ZRANGE', exp, 0, 0, 'WITHSCORES')
    redis.call('HSET', dig, 'next_expiry', first[2] or '')
  end
  local old = redis.call('HGET', src, mid)
  if old == false then old = nil end
  if old == entry then return false end
  local d = redis.call('HMGET', dig, 'digest', 'count')
  local digest = d[1] or ZERO
  local count = tonumber(d[2] or '0')
  if old then
    digest = xor_hex(digest, redis.sha1hex(mid .. '|' .. old))
    count = count - 1
  end
  if entry then
    digest = xor_hex(digest, redis.sha1hex(mid .. '|' .. entry))
    count = count + 1
    redis.call('HSET', src, mid, entry)
  else
    redis.call('HDEL', src, mid)
  end
  redis.call('HSET', dig, 'digest', digest, 'count', tostring(count), 'changed_at', at)
  if old and not entry then redis.call('HSET', dig, 'removed_at', at) end
  return true
end

-- Write r as the row's next version; returns whether the user's source digest moved.
-- old_type: the row's memory_type before the write (nil for a new row).
local function commit(r, now, member, old_type)
  local last = r.version
  if last == '' then last = nil end
  r.version = next_version(last, now)
  r.updated_at = r.version
  if (r.created_at or '') == '' then r.created_at = r.version end
  redis.call('HSET', KEYS[1], unpack(flatten(r)))
  local padded = pad(r.version)
  redis.call('HSET', KEYS[2], padded, cjson.encode(r))
  redis.call('ZADD', KEYS[3], 0, padded)
  redis.call('ZADD', KEYS[4], 0, member)
  redis.call('HSET', KEYS[5], r.memory_id, KEYS[1])
  index_section(r.key, r.agent, r.session_id,
    r.memory_type == 'profile' and r.deleted ~= '1' and r.redacted ~= '1')
  index_live(r, old_type, member)
  local entry = source_entry(r, now)
  local valid_to = ''
  if entry then valid_to = r.valid_to or '' end
  return update_sources(KEYS[7], KEYS[8], KEYS[9], r.memory_id, entry, valid_to, r.version)
end

local function done(status, moved, r)
  local reply = {status, moved and '1' or '0'}
  for _, item in ipairs(flatten(r)) do reply[#reply + 1] = item end
  return reply
end

local function target(expected_id)
  if redis.call('EXISTS', KEYS[10]) == 1 then return nil, {'ERASING'} end
  local r = load_row()
  if not r or (expected_id ~= '' and r.memory_id ~= expected_id) then
    return nil, {'MISSING'}
  end
  return r, nil
end
"""

# ARGV: 1 now, 2 memory_id for a new row, 3 rows-set member, 4 expected version ('' none, '-'
# no live row), 5 if_match sha ('' none), 6 default char_limit ('' none), 7 char_limit ('' keeps
# the row's), 8 written_by, 9 required type of a live row ('' any), 10 refuse pinned/high ('1'),
# 11.. field/value pairs of the new content.
_SET = _COMMON_LUA + r"""
if redis.call('EXISTS', KEYS[10]) == 1 then return {'ERASING'} end
local r = load_row()
local live = r and r.deleted ~= '1'
if r and r.locked == '1' then return {'LOCKED', r.memory_id} end
if ARGV[10] == '1' and live and (r.pinned == '1' or r.label == 'high') then
  return {'PINNED', r.memory_id}
end
if ARGV[9] ~= '' and live and r.memory_type ~= ARGV[9] then
  return {'TYPE', r.memory_type}
end
local expected = ARGV[4]
if expected == '-' then
  if live then return {'CONFLICT'} end
elseif expected ~= '' then
  if not live or r.version ~= expected then return {'CONFLICT'} end
end
if ARGV[5] ~= '' then
  local current = ''
  if live then current = r.content_sha256 end
  if current ~= ARGV[5] then return {'MISMATCH', current} end
end
local created = false
local old_type = r and r.memory_type
if not r then
  created = true
  r = {memory_id = ARGV[2], pinned = '0', locked = '0', version = '', created_at = ''}
end
local limit = ARGV[7]
if limit == '' then limit = r.char_limit or '' end
if limit == '' then limit = ARGV[6] end
for i = 11, #ARGV, 2 do r[ARGV[i]] = ARGV[i + 1] end
r.char_limit = limit
if limit ~= '' and tonumber(r.value_length) > tonumber(limit) then
  return {'LIMIT', r.value_length, limit}
end
r.deleted = '0'
r.redacted = '0'
r.written_by = ARGV[8]
local moved = commit(r, ARGV[1], ARGV[3], old_type)
if created then return done('CREATED', moved, r) end
return done('OK', moved, r)
"""

# ARGV: 1 now, 2 field (locked | pinned), 3 '0' | '1', 4 written_by, 5 rows-set member,
# 6 expected memory_id ('' any).
_FLAG = _COMMON_LUA + r"""
local r, err = target(ARGV[6])
if err then return err end
if r.deleted == '1' then return {'MISSING'} end
if r.locked == '1' and not (ARGV[2] == 'locked' and ARGV[3] == '0') then
  return {'LOCKED', r.memory_id}
end
if r[ARGV[2]] == ARGV[3] then return done('NOOP', false, r) end
r[ARGV[2]] = ARGV[3]
r.written_by = ARGV[4]
return done('OK', commit(r, ARGV[1], ARGV[5], r.memory_type), r)
"""

# ARGV: 1 now, 2 written_by, 3 rows-set member, 4 expected memory_id, 5 source_trace.
_DELETE = _COMMON_LUA + r"""
local r, err = target(ARGV[4])
if err then return err end
if r.deleted == '1' then return done('NOOP', false, r) end
if r.locked == '1' then return {'LOCKED', r.memory_id} end
r.deleted = '1'
r.value = 'null'
r.value_length = '4'
r.content_sha256 = ''
r.source_trace = ARGV[5]
r.written_by = ARGV[2]
return done('OK', commit(r, ARGV[1], ARGV[3], r.memory_type), r)
"""

# ARGV: 1 now, 2 padded version to remove, 3 written_by, 4 rows-set member, 5 expected
# memory_id, 6 the marker's source_trace. The removal is recorded as a new version carrying the
# newest remaining version's content (a tombstone when none is left) under the marker trace.
_DELETE_VERSION = _COMMON_LUA + r"""
local r, err = target(ARGV[5])
if err then return err end
if r.locked == '1' then return {'LOCKED', r.memory_id} end
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 0 then return {'NO_VERSION'} end
redis.call('HDEL', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[2])
local newest = redis.call('ZREVRANGEBYLEX', KEYS[3], '+', '-', 'LIMIT', 0, 1)
local n = {}
if newest[1] then
  for k, v in pairs(cjson.decode(redis.call('HGET', KEYS[2], newest[1]))) do n[k] = v end
else
  for k, v in pairs(r) do n[k] = v end
  n.deleted = '1'
  n.value = 'null'
  n.value_length = '4'
  n.content_sha256 = ''
end
-- Row-level facts stay the row's: its id, birth, last version and flags.
n.memory_id = r.memory_id
n.created_at = r.created_at
n.version = r.version
n.pinned = r.pinned
n.locked = r.locked
n.source_trace = ARGV[6]
n.written_by = ARGV[3]
return done('OK', commit(n, ARGV[1], ARGV[4], r.memory_type), n)
"""

# ARGV: 1 now, 2 written_by, 3 expected memory_id, 4 the number of derived rows. KEYS 12..:
# per derived row, its row key and versions key. Scrubs every version of the row in place (no
# new version: the history keeps its shape, without the text), and every profile version of a
# derived row whose source_trace names the row's memory_id, the derived row's current fields
# too when they do. Refused whole when the row or a derived row is locked, so a redact is all
# or nothing and a retry reaches the same keys.
_REDACT = _COMMON_LUA + r"""
local r, err = target(ARGV[3])
if err then return err end
if r.locked == '1' then return {'LOCKED', r.memory_id} end
local function names(trace, mid)
  for token in string.gmatch(trace or '', '[^:,]+') do
    if token == mid then return true end
  end
  return false
end
local function scrub(s)
  s.value = 'null'
  s.value_length = '4'
  s.content_sha256 = ''
  s.redacted = '1'
end
local derived = tonumber(ARGV[4])
for d = 1, derived do
  local flags = redis.call('HMGET', KEYS[10 + 2 * d], 'locked', 'key', 'memory_id')
  if flags[1] == '1' then return {'DERIVED_LOCKED', flags[2] or '', flags[3] or ''} end
end
local versions = redis.call('HGETALL', KEYS[2])
local count = 0
for i = 1, #versions, 2 do
  local s = cjson.decode(versions[i + 1])
  scrub(s)
  redis.call('HSET', KEYS[2], versions[i], cjson.encode(s))
  count = count + 1
end
scrub(r)
r.redacted_by = ARGV[2]
redis.call('HSET', KEYS[1], 'value', r.value, 'value_length', r.value_length,
  'content_sha256', '', 'redacted', '1', 'redacted_by', ARGV[2])
-- A redacted section renders nothing: it leaves the section index until it is written again.
index_section(r.key, r.agent, r.session_id, false)
local reached, rows = 0, 0
for d = 1, derived do
  local rk, vk = KEYS[10 + 2 * d], KEYS[11 + 2 * d]
  local touched = false
  local all = redis.call('HGETALL', vk)
  for i = 1, #all, 2 do
    local s = cjson.decode(all[i + 1])
    if s.memory_type == 'profile' and names(s.source_trace, r.memory_id) then
      scrub(s)
      redis.call('HSET', vk, all[i], cjson.encode(s))
      reached = reached + 1
      touched = true
    end
  end
  local current = redis.call('HMGET', rk, 'memory_type', 'source_trace', 'key', 'agent',
    'session_id')
  if current[1] == 'profile' and names(current[2], r.memory_id) then
    redis.call('HSET', rk, 'value', 'null', 'value_length', '4', 'content_sha256', '',
      'redacted', '1', 'redacted_by', ARGV[2])
    index_section(current[3], current[4], current[5], false)
    touched = true
  end
  if touched then rows = rows + 1 end
end
local moved = update_sources(KEYS[7], KEYS[8], KEYS[9], r.memory_id, nil, '', ARGV[1])
local reply = done('OK', moved, r)
reply[#reply + 1] = 'versions_redacted'
reply[#reply + 1] = tostring(count)
reply[#reply + 1] = 'derived_versions_redacted'
reply[#reply + 1] = tostring(reached)
reply[#reply + 1] = 'derived_rows_redacted'
reply[#reply + 1] = tostring(rows)
return reply
"""

# KEYS: 1 sources, 2 digest, 3 source expiry. ARGV: 1 now. Sources whose valid_to passed
# leave the digest (a fact that "passes its valid_to" changes it, with no write of its own).
_EXPIRE = r"""
local ZERO = string.rep('0', 40)
local function xor_hex(a, b)
  local out = {}
  for i = 1, 40, 4 do
    local x = bit.bxor(tonumber(string.sub(a, i, i + 3), 16), tonumber(string.sub(b, i, i + 3), 16))
    out[#out + 1] = string.format('%04x', x)
  end
  return table.concat(out)
end
local due = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[1])
if #due == 0 then return 0 end
local d = redis.call('HMGET', KEYS[2], 'digest', 'count')
local digest = d[1] or ZERO
local count = tonumber(d[2] or '0')
for _, mid in ipairs(due) do
  local old = redis.call('HGET', KEYS[1], mid)
  if old then
    digest = xor_hex(digest, redis.sha1hex(mid .. '|' .. old))
    count = count - 1
    redis.call('HDEL', KEYS[1], mid)
  end
  redis.call('ZREM', KEYS[3], mid)
end
local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
redis.call('HSET', KEYS[2], 'digest', digest, 'count', tostring(count), 'changed_at', ARGV[1],
  'removed_at', ARGV[1], 'next_expiry', first[2] or '')
return #due
"""


# --------------------------------------------------------------------------------------------
# Rows


@dataclass(frozen=True, slots=True)
class Location:
    """Where a row lives: the user's slot and the row's name inside it."""

    org: str
    namespace: str
    user_id: str
    agent: str
    session_id: str
    key: str

    @property
    def member(self) -> str:
        return self.key + NUL + self.agent + NUL + self.session_id

    @classmethod
    def from_member(cls, org: str, namespace: str, user_id: str, member: str) -> Location:
        key, agent, session_id = member.split(NUL)
        return cls(org, namespace, user_id, agent, session_id, key)

    @classmethod
    def from_section_member(
        cls, org: str, namespace: str, user_id: str, member: str
    ) -> Location:
        """The row behind an entry of the user's section index (keys.profile_sections)."""
        family, first, second, third = member.split(NUL)
        if family == "l":
            key, agent, session_id = first, second, third
        elif family == "a":
            agent, key, session_id = first, second, third
        else:
            session_id, key, agent = first, second, third
        return cls(org, namespace, user_id, agent, session_id, key)

    def row_key(self) -> str:
        return keys.memory_row(*self.parts())

    def script_keys(self) -> list[str]:
        parts = self.parts()
        user = (self.org, self.namespace, self.user_id)
        return [
            keys.memory_row(*parts),
            keys.memory_versions(*parts),
            keys.memory_version_order(*parts),
            keys.memory_keys(*user),
            keys.memory_ids(*user),
            keys.profile_sections(*user),
            keys.profile_sources(*user),
            keys.profile_source_digest(*user),
            keys.profile_source_expiry(*user),
            keys.user_erasing(*user),
            keys.memory_live(*user),
        ]

    def pointer_value(self) -> str:
        return json.dumps([self.user_id, self.agent, self.session_id, self.key])

    def parts(self) -> tuple[str, str, str, str, str, str]:
        return (self.org, self.namespace, self.user_id, self.agent, self.session_id, self.key)


def _prefix_range(*parts: str) -> tuple[bytes, bytes]:
    """The lex range of the index entries that start with these components."""
    prefix = (NUL.join(parts) + NUL).encode()
    return b"[" + prefix, b"[" + prefix + b"\xff"


def _exact_range(*parts: str) -> tuple[bytes, bytes]:
    member = b"[" + NUL.join(parts).encode()
    return member, member


@dataclass(frozen=True, slots=True)
class SectionReach:
    """One user's part of a render: the sessions it reaches (None: all of them) and the
    labels (None: all of them)."""

    user_id: str
    sessions: tuple[str, ...] | None = None
    labels: tuple[str, ...] | None = None

    def ranges(self, agent: str | None) -> list[tuple[bytes, bytes]]:
        """The ranges of the user's section index that hold exactly what this reach wants
        (by ``agent`` when given), but for a session's unlabelled sections by any agent."""
        labels = self.labels
        if self.sessions is None:
            if labels is None:
                return [_prefix_range("a", agent) if agent is not None else _prefix_range("l")]
            if agent is None:
                return [_prefix_range("l", label) for label in labels]
            return [_prefix_range("l", label, agent) for label in labels]
        found = []
        for session_id in self.sessions:
            if labels is None:
                found.append(_prefix_range("s", session_id))
            elif agent is None:
                found += [_prefix_range("s", session_id, label) for label in labels]
            else:
                found += [_exact_range("s", session_id, label, agent) for label in labels]
        return found


def _optional_ns(raw: str | None) -> int | None:
    return int(raw) if raw else None


@dataclass(frozen=True, slots=True)
class MemoryRow:
    """One row (or one version of it, from ``history``) as stored."""

    memory_id: str
    key: str
    agent: str
    user_id: str
    session_id: str
    memory_type: str
    value: Any
    value_length: int
    content_sha256: str
    confidence: float
    tags: list[str]
    label: str
    valid_at: int | None
    valid_to: int | None
    duplicate_of: str
    provenance: str
    source_trace: str
    actor: str
    written_by: str
    pinned: bool
    locked: bool
    deleted: bool
    redacted: bool
    char_limit: int | None
    version: int
    created_at: int
    updated_at: int

    @classmethod
    def from_fields(cls, f: Mapping[str, str]) -> MemoryRow:
        return cls(
            memory_id=f["memory_id"],
            key=f["key"],
            agent=f["agent"],
            user_id=f["user_id"],
            session_id=f["session_id"],
            memory_type=f["memory_type"],
            value=json.loads(f.get("value") or "null"),
            value_length=int(f.get("value_length") or 0),
            content_sha256=f.get("content_sha256", ""),
            confidence=float(f.get("confidence") or 1.0),
            tags=json.loads(f.get("tags") or "[]"),
            label=f.get("label") or "normal",
            valid_at=_optional_ns(f.get("valid_at")),
            valid_to=_optional_ns(f.get("valid_to")),
            duplicate_of=f.get("duplicate_of", ""),
            provenance=f.get("provenance") or "stated",
            source_trace=f.get("source_trace", ""),
            actor=f.get("actor", ""),
            written_by=f.get("written_by", ""),
            pinned=f.get("pinned") == "1",
            locked=f.get("locked") == "1",
            deleted=f.get("deleted") == "1",
            redacted=f.get("redacted") == "1",
            char_limit=_optional_ns(f.get("char_limit")),
            version=int(f["version"]),
            created_at=int(f.get("created_at") or f["version"]),
            updated_at=int(f.get("updated_at") or f["version"]),
        )

    @property
    def live(self) -> bool:
        return not self.deleted

    def expired(self, now_ns: int) -> bool:
        return self.valid_to is not None and self.valid_to <= now_ns

    def is_source(self, now_ns: int) -> bool:
        """The Python statement of the scripts' rule (the scripts are the authority)."""
        return (
            self.live
            and not self.redacted
            and self.memory_type in SOURCE_TYPES
            and self.label != "high"
            and not self.duplicate_of
            and not tags_exclude(self.tags)
            and not self.expired(now_ns)
        )

    def content(self) -> Content:
        return Content(
            memory_type=self.memory_type,
            value=self.value,
            confidence=self.confidence,
            tags=list(self.tags),
            label=self.label,
            valid_at=self.valid_at,
            valid_to=self.valid_to,
            duplicate_of=self.duplicate_of,
            provenance=self.provenance,
            source_trace=self.source_trace,
            actor=self.actor,
        )

    def as_answer(self) -> dict[str, Any]:
        return {
            "memory_id": self.memory_id,
            "key": self.key,
            "agent": self.agent,
            "user_id": self.user_id,
            "session_id": self.session_id,
            "memory_type": self.memory_type,
            "value": self.value,
            "value_length": self.value_length,
            "content_sha256": self.content_sha256,
            "confidence": self.confidence,
            "tags": list(self.tags),
            "label": self.label,
            "valid_at": None if self.valid_at is None else iso_from_ns(self.valid_at),
            "valid_to": None if self.valid_to is None else iso_from_ns(self.valid_to),
            "duplicate_of": self.duplicate_of,
            "provenance": self.provenance,
            "source_trace": self.source_trace,
            "actor": self.actor,
            "written_by": self.written_by,
            "pinned": self.pinned,
            "locked": self.locked,
            "deleted": self.deleted,
            "redacted": self.redacted,
            "char_limit": self.char_limit,
            "version": self.version,
            "version_text": str(self.version),
            "created_at": iso_from_ns(self.created_at),
            "updated_at": iso_from_ns(self.updated_at),
        }


@dataclass(frozen=True, slots=True)
class Content:
    """What a caller writes: every field of a version that is not the row's bookkeeping."""

    memory_type: str = "semantic"
    value: Any = ""
    confidence: float = 1.0
    tags: list[str] = field(default_factory=list)
    label: str = "normal"
    valid_at: int | None = None
    valid_to: int | None = None
    duplicate_of: str = ""
    provenance: str = "stated"
    source_trace: str = ""
    actor: str = ""

    def fields(self, location: Location) -> tuple[list[str], int]:
        """The flat field/value list the set script takes, and the value's length."""
        canonical = canonical_json(self.value)
        pairs = {
            "key": location.key,
            "agent": location.agent,
            "user_id": location.user_id,
            "session_id": location.session_id,
            "memory_type": self.memory_type,
            "value": canonical,
            "value_length": str(len(canonical)),
            "content_sha256": content_sha256(canonical),
            "confidence": format_confidence(self.confidence),
            "tags": json.dumps(list(self.tags), ensure_ascii=False),
            "tag_excluded": "1" if tags_exclude(self.tags) else "0",
            "label": self.label,
            "valid_at": "" if self.valid_at is None else str(self.valid_at),
            "valid_to": "" if self.valid_to is None else str(self.valid_to),
            "duplicate_of": self.duplicate_of,
            "provenance": self.provenance,
            "source_trace": self.source_trace,
            "actor": self.actor,
        }
        return [item for pair in pairs.items() for item in pair], len(canonical)


@dataclass(frozen=True, slots=True)
class Written:
    """A write's outcome: the row after it, whether it created the row, whether it wrote a
    version, and whether it moved the user's source digest."""

    row: MemoryRow
    created: bool = False
    changed: bool = True
    sources_moved: bool = False


@dataclass(frozen=True, slots=True)
class SourceDigest:
    """The O(1) summary of a user's sources a structured build records and a read compares."""

    digest: str
    count: int
    changed_at: int | None
    removed_at: int | None
    next_expiry: float | None

    @classmethod
    def from_fields(cls, f: Mapping[str, str]) -> SourceDigest:
        expiry = f.get("next_expiry")
        return cls(
            digest=f.get("digest") or ZERO_DIGEST,
            count=int(f.get("count") or 0),
            changed_at=_optional_ns(f.get("changed_at")),
            removed_at=_optional_ns(f.get("removed_at")),
            next_expiry=float(expiry) if expiry else None,
        )

    def expiry_due(self, now_ns: int) -> bool:
        """A source's valid_to has passed: call ``expire_sources`` before trusting the digest."""
        return self.next_expiry is not None and self.next_expiry <= now_ns


class VersionMoved(Exception):
    """A compare-and-swap lost to another writer; the caller re-reads and tries again."""



# --------------------------------------------------------------------------------------------
# The store


class MemoryStore:
    def __init__(self, services: Services) -> None:
        self.redis = services.redis
        self.clock = services.clock
        self._set = self.redis.register_script(_SET)
        self._flag = self.redis.register_script(_FLAG)
        self._delete = self.redis.register_script(_DELETE)
        self._delete_version = self.redis.register_script(_DELETE_VERSION)
        self._redact = self.redis.register_script(_REDACT)
        self._expire = self.redis.register_script(_EXPIRE)
        self._clear_changed = script(self.redis, "clear_unless_changed_since")

    # --- reads ---------------------------------------------------------------------------

    def read(self, location: Location) -> MemoryRow | None:
        """The row at ``location`` (live or a tombstone), or None."""
        found = self.redis.hgetall(location.row_key())
        return MemoryRow.from_fields(found) if found else None

    def locate(self, org: str, namespace: str, memory_id: str) -> Location | None:
        """Where ``memory_id`` lives, from its pointer in the namespace's slot."""
        raw = self.redis.get(keys.memory_pointer(org, namespace, memory_id))
        if raw is None:
            return None
        user_id, agent, session_id, key = json.loads(raw)
        return Location(org, namespace, user_id, agent, session_id, key)

    def read_by_id(self, org: str, namespace: str, memory_id: str) -> MemoryRow | None:
        location = self.locate(org, namespace, memory_id)
        if location is None:
            return None
        row = self.read(location)
        return row if row is not None and row.memory_id == memory_id else None

    def rows_with_key(
        self, org: str, namespace: str, user_id: str, key: str
    ) -> list[MemoryRow]:
        """Every row of the user named ``key``, whatever its agent and session_id."""
        low = b"[" + (key + NUL).encode()
        high = b"[" + (key + NUL).encode() + b"\xff"
        members = self.redis.zrangebylex(keys.memory_keys(org, namespace, user_id), low, high)
        locations = [Location.from_member(org, namespace, user_id, m) for m in members]
        return [row for row in self._read_many(locations) if row is not None]

    def _read_many(self, locations: Sequence[Location]) -> list[MemoryRow | None]:
        if not locations:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for location in locations:
            pipe.hgetall(location.row_key())
        return [MemoryRow.from_fields(f) if f else None for f in pipe.execute()]

    def read_row_keys(self, row_keys: Sequence[str]) -> list[MemoryRow]:
        pipe = self.redis.pipeline(transaction=False)
        for row_key in row_keys:
            pipe.hgetall(row_key)
        return [MemoryRow.from_fields(f) for f in pipe.execute() if f]

    def scan_rows(
        self,
        org: str,
        namespace: str,
        user_id: str,
        *,
        after: str | None = None,
        key_prefix: str = "",
        batch: int = 50,
        live_type: str | None = None,
    ) -> tuple[list[tuple[str, MemoryRow | None]], bool]:
        """One batch of the user's rows in key order, after the member ``after``
        (``key NUL agent NUL session_id``).

        ``live_type`` None walks every row, tombstones too; a type walks the live rows of that
        type, and ``""`` the live rows of any type (keys.memory_live), so tombstones and other
        types cost nothing. Reads ``batch`` rows at most and answers (member, row) pairs (row
        None when it vanished meanwhile) and whether more rows follow.
        """
        if live_type is None:
            index, head = keys.memory_keys(org, namespace, user_id), ""
        else:
            index, head = keys.memory_live(org, namespace, user_id), live_type + NUL
        prefix = (head + key_prefix).encode()
        low = b"(" + (head + after).encode() if after is not None else b"[" + prefix
        high = b"[" + prefix + b"\xff" if prefix else b"+"
        # One entry past the batch says whether more follow, without reading its row.
        members = self.redis.zrangebylex(index, low, high, start=0, num=batch + 1)
        more = len(members) > batch
        members = [m[len(head):] for m in members[:batch]]
        locations = [Location.from_member(org, namespace, user_id, m) for m in members]
        rows = self._read_many(locations)
        return list(zip(members, rows, strict=True)), more

    def history(
        self, location: Location, *, before: int | None = None, limit: int = 20
    ) -> tuple[list[MemoryRow], bool]:
        """Versions newest first, older than ``before``; and whether older ones remain."""
        order = keys.memory_version_order(*location.parts())
        high = "(" + pad_version(before) if before is not None else "+"
        padded = self.redis.zrevrangebylex(order, high, "-", start=0, num=limit + 1)
        more = len(padded) > limit
        padded = padded[:limit]
        if not padded:
            return [], False
        snapshots = self.redis.hmget(keys.memory_versions(*location.parts()), padded)
        rows = [MemoryRow.from_fields(json.loads(s)) for s in snapshots if s is not None]
        return rows, more

    def profile_sections(
        self, org: str, namespace: str, reaches: Iterable[SectionReach], agent: str | None = None
    ) -> list[MemoryRow]:
        """The renderable sections (live, not redacted) that ``reaches`` name, written by
        ``agent`` when it is given, in no particular order.

        Two round trips whatever the namespace holds: one pipeline of ranges over the users'
        section indexes, then one of the rows those ranges found. No row outside the ranges is
        read; the one filter left to Python (the agent of a session's unlabelled sections) is
        on index entries, not rows.
        """
        queries: list[tuple[str, bytes, bytes]] = []
        for reach in reaches:
            queries += [(reach.user_id, low, high) for low, high in reach.ranges(agent)]
        if not queries:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for user_id, low, high in queries:
            pipe.zrangebylex(keys.profile_sections(org, namespace, user_id), low, high)
        locations: dict[str, Location] = {}
        for (user_id, _, _), members in zip(queries, pipe.execute(), strict=True):
            for member in members:
                location = Location.from_section_member(org, namespace, user_id, member)
                if agent is None or location.agent == agent:
                    locations.setdefault(location.row_key(), location)
        if not locations:
            return []
        return [
            row
            for row in self.read_row_keys(list(locations))
            if row.live and not row.redacted and row.memory_type == PROFILE_TYPE
        ]

    def section_users(
        self, org: str, namespace: str, labels: Sequence[str] | None, agent: str | None
    ) -> dict[str, tuple[str, ...] | None]:
        """The namespace's users that may hold sections with these labels (None: any) by this
        agent (None: any), each with the labels it may hold (None: any). One round trip over
        the namespace's label and agent indexes; an entry may outlive its sections (it is only
        a hint), never the other way round."""
        if labels is None:
            if agent is None:
                return dict.fromkeys(self.profile_users(org, namespace))
            return dict.fromkeys(
                self.redis.smembers(keys.profile_agent_users(org, namespace, agent))
            )
        wanted = list(dict.fromkeys(labels))
        pipe = self.redis.pipeline(transaction=False)
        for label in wanted:
            label_users = keys.profile_label_users(org, namespace, label)
            if agent is None:
                pipe.smembers(label_users)
            else:
                pipe.sinter(label_users, keys.profile_agent_users(org, namespace, agent))
        held: dict[str, list[str]] = {}
        for label, users in zip(wanted, pipe.execute(), strict=True):
            for user_id in users:
                held.setdefault(user_id, []).append(label)
        return {user_id: tuple(found) for user_id, found in held.items()}

    def profile_users(self, org: str, namespace: str) -> set[str]:
        return self.redis.smembers(keys.profile_users(org, namespace))

    # --- the structured-profile inputs ---------------------------------------------------

    def source_digest(self, org: str, namespace: str, user_id: str) -> SourceDigest:
        """One HGETALL: the user's source digest, count and change times."""
        found = self.redis.hgetall(keys.profile_source_digest(org, namespace, user_id))
        return SourceDigest.from_fields(found)

    def source_entries(self, org: str, namespace: str, user_id: str) -> dict[str, str]:
        return self.redis.hgetall(keys.profile_sources(org, namespace, user_id))

    def source_rows(self, org: str, namespace: str, user_id: str) -> list[MemoryRow]:
        """The rows behind the user's current source entries (two round trips)."""
        ids = list(self.source_entries(org, namespace, user_id))
        if not ids:
            return []
        row_keys = self.redis.hmget(keys.memory_ids(org, namespace, user_id), ids)
        return self.read_row_keys([k for k in row_keys if k])

    def expire_sources(self, org: str, namespace: str, user_id: str) -> int:
        """Take sources past their valid_to out of the digest; how many left."""
        user = (org, namespace, user_id)
        now = self.clock.now_ns()
        removed = int(
            self._expire(
                keys=[
                    keys.profile_sources(*user),
                    keys.profile_source_digest(*user),
                    keys.profile_source_expiry(*user),
                ],
                args=[now],
            )
        )
        if removed:
            self.redis.zadd(keys.profile_changed_users(org, namespace), {user_id: now})
        return removed

    def changed_users(
        self, org: str, namespace: str, limit: int = 100
    ) -> list[tuple[str, int]]:
        """Users whose sources moved since the pass last cleared them, oldest change first."""
        found = self.redis.zrange(
            keys.profile_changed_users(org, namespace), 0, limit - 1, withscores=True
        )
        return [(user_id, int(score)) for user_id, score in found]

    def clear_changed(self, org: str, namespace: str, user_id: str, built_at_ns: int) -> bool:
        """Forget a user's change once a build read it; a later change keeps it listed."""
        return bool(
            self._clear_changed(
                keys=[keys.profile_changed_users(org, namespace)], args=[user_id, built_at_ns]
            )
        )

    # --- writes --------------------------------------------------------------------------

    def set(
        self,
        location: Location,
        content: Content,
        *,
        written_by: str,
        char_limit: int | None = None,
        default_char_limit: int | None = None,
        if_match_sha256: str = "",
        expected_version: str = "",
        required_type: str = "",
        refuse_pinned: bool = False,
    ) -> Written:
        """Write a new version with ``content``.

        ``char_limit`` None keeps the row's cap (``default_char_limit`` for a row without one;
        None there means only ``MAX_CHAR_LIMIT``). ``expected_version`` '' writes whatever is
        there, '-' only when there is no live row, a version only over that version.
        ``required_type`` refuses to overwrite a live row of another type. ``refuse_pinned``
        (the workers) refuses a pinned or ``high`` row, as a lock refuses everyone.
        """
        field_list, length = content.fields(location)
        if length > MAX_CHAR_LIMIT:
            raise CharLimitExceeded(length, MAX_CHAR_LIMIT)
        reply = self._set(
            keys=location.script_keys(),
            args=[
                self.clock.now_ns(),
                new_memory_id(),
                location.member,
                expected_version,
                if_match_sha256,
                "" if default_char_limit is None else default_char_limit,
                "" if char_limit is None else char_limit,
                written_by,
                required_type,
                "1" if refuse_pinned else "0",
                *field_list,
            ],
        )
        return self._finish(location, reply)

    def set_flag(
        self, location: Location, flag: str, on: bool, *, written_by: str, memory_id: str = ""
    ) -> Written:
        """lock / unlock / pin / unpin: a new version with the same content (none when the
        flag is already so)."""
        if flag not in ("locked", "pinned"):
            raise ValueError(f"unknown flag {flag}")
        reply = self._flag(
            keys=location.script_keys(),
            args=[
                self.clock.now_ns(),
                flag,
                "1" if on else "0",
                written_by,
                location.member,
                memory_id,
            ],
        )
        return self._finish(location, reply)

    def delete(
        self, location: Location, *, written_by: str, memory_id: str = "", source_trace: str = ""
    ) -> Written | None:
        """Write a tombstone version; None when there is no row. ``changed`` False: it was
        already deleted."""
        reply = self._delete(
            keys=location.script_keys(),
            args=[self.clock.now_ns(), written_by, location.member, memory_id, source_trace],
        )
        if reply[0] == "MISSING":
            return None
        return self._finish(location, reply)

    def delete_version(
        self, location: Location, version: int, *, written_by: str, memory_id: str = ""
    ) -> Written:
        """Remove one version; the removal is a new version traced ``memory.delete_version:``."""
        reply = self._delete_version(
            keys=location.script_keys(),
            args=[
                self.clock.now_ns(),
                pad_version(version),
                written_by,
                location.member,
                memory_id,
                f"{DELETE_VERSION_TRACE}{version}",
            ],
        )
        if reply[0] == "NO_VERSION":
            raise MemoryNotFound(
                f"row {location.key!r} has no version {version}",
                key=location.key,
                version_text=str(version),
            )
        return self._finish(location, reply)

    def redact(
        self,
        location: Location,
        *,
        written_by: str,
        memory_id: str = "",
        derived: Sequence[Location] = (),
    ) -> Redacted:
        """Scrub the value of every version of the row, and of every profile version of the
        ``derived`` rows whose trace names it; all or nothing."""
        script_keys = location.script_keys()
        for derived_location in derived:
            script_keys += [derived_location.row_key(),
                            keys.memory_versions(*derived_location.parts())]
        reply = self._redact(
            keys=script_keys,
            args=[self.clock.now_ns(), written_by, memory_id, len(derived)],
        )
        if reply[0] == "DERIVED_LOCKED":
            raise MemoryLocked(
                f"profile row {reply[1]!r}, built from this row, is locked: unlock it, then "
                "redact again",
                key=reply[1],
                memory_id=reply[2],
            )
        if reply[0] != "OK":
            self._raise(location, reply)
        fields = pairs(reply[2:])
        count = int(fields.pop("versions_redacted"))
        derived_versions = int(fields.pop("derived_versions_redacted"))
        derived_rows = int(fields.pop("derived_rows_redacted"))
        row = MemoryRow.from_fields(fields)
        written = Written(row, created=False, changed=True, sources_moved=reply[1] == "1")
        self._after_write(location, written, self.clock.now_ns(), redacted=True)
        return Redacted(written, count, derived_rows, derived_versions)

    def derived_rows(
        self, location: Location, memory_id: str, *, unredacted_only: bool = False
    ) -> list[Location]:
        """The user's other rows with a profile version whose source_trace names
        ``memory_id`` (as a whole ``:``/``,``-separated token). Reads every version of the
        user's rows: a redact is rare and must reach them all."""
        org, namespace, user_id = location.org, location.namespace, location.user_id
        rows_key = keys.memory_keys(org, namespace, user_id)
        found: list[Location] = []
        after = "-"
        while True:
            members = self.redis.zrangebylex(rows_key, after, "+", start=0, num=100)
            if not members:
                return found
            others = [
                other
                for other in (Location.from_member(org, namespace, user_id, m) for m in members)
                if other != location
            ]
            pipe = self.redis.pipeline(transaction=False)
            for other in others:
                pipe.hvals(keys.memory_versions(*other.parts()))
            for other, snapshots in zip(others, pipe.execute(), strict=True):
                for snapshot in snapshots:
                    version = json.loads(snapshot)
                    if (
                        version.get("memory_type") == PROFILE_TYPE
                        and trace_names(version.get("source_trace", ""), memory_id)
                        and not (unredacted_only and version.get("redacted") == "1")
                    ):
                        found.append(other)
                        break
            after = "(" + members[-1]

    def append(
        self,
        location: Location,
        addition: str,
        separator: str,
        *,
        written_by: str,
        memory_type: str = PROFILE_TYPE,
        default_char_limit: int | None = DEFAULT_PROFILE_CHAR_LIMIT,
    ) -> Written:
        """Append text to a text row, creating it when missing; compare-and-swap, retried."""

        def attempt() -> Written:
            row = self.read(location)
            if row is not None and row.live:
                if row.memory_type != memory_type:
                    raise MemoryTypeMismatch.of(location.key, row.memory_type, memory_type)
                text = _text_of(row)
                value = addition if text is None else text + separator + addition
                content = replace(row.content(), value=value, actor=written_by)
                expected = str(row.version)
            else:
                content = Content(memory_type=memory_type, value=addition, actor=written_by)
                expected = "-"
            return self._swap(
                location,
                content,
                row,
                written_by=written_by,
                default_char_limit=default_char_limit,
                expected_version=expected,
                required_type=memory_type,
            )

        return self._with_retries(attempt)

    def replace_text(
        self, location: Location, old: str, new: str, *, written_by: str,
        memory_type: str = PROFILE_TYPE,
    ) -> Written:
        """Replace every occurrence of ``old`` in a text row; compare-and-swap, retried."""

        def attempt() -> Written:
            row = self.read(location)
            if row is None or not row.live or row.memory_type != memory_type:
                raise ProfileSectionNotFound(
                    f"no profile section {location.key!r} here", label=location.key
                )
            text = row.value if isinstance(row.value, str) else ""
            if not old or old not in text:
                raise SubstringNotFound(
                    f"the text to replace is not in section {location.key!r}",
                    label=location.key,
                )
            content = replace(row.content(), value=text.replace(old, new), actor=written_by)
            return self._swap(
                location,
                content,
                row,
                written_by=written_by,
                expected_version=str(row.version),
                required_type=memory_type,
            )

        return self._with_retries(attempt)

    def _swap(
        self, location: Location, content: Content, read: MemoryRow | None, **options: Any
    ) -> Written:
        """Write computed from ``read``, only if the row still holds what was read.

        The version alone is not enough: a redact scrubs every version in place without a new
        one, so the content hash is checked too, and a row scrubbed meanwhile is read again
        rather than written back with the text the redact removed.
        """
        if read is not None and read.live and read.content_sha256:
            options["if_match_sha256"] = read.content_sha256
        try:
            return self.set(location, content, **options)
        except HashMismatch:
            raise VersionMoved() from None

    # --- internals -----------------------------------------------------------------------

    @staticmethod
    def _with_retries(attempt: Callable[[], Written]) -> Written:
        deadline = time.monotonic() + CAS_DEADLINE_SECONDS
        tries = 0
        while True:
            try:
                return attempt()
            except VersionMoved:
                # Another writer landed between our read and our write: read again. The jitter
                # keeps eight writers that lost together from colliding again in step.
                tries += 1
                if time.monotonic() > deadline:
                    raise WriteContended(
                        "too many concurrent writers on this row; try again", retry_after=1
                    ) from None
                time.sleep(random.uniform(0, 0.0005 * min(tries, 20)))

    def _raise(self, location: Location, reply: list[Any]) -> None:
        status = reply[0]
        key = location.key
        if status == "CONFLICT":
            raise VersionMoved()
        if status == "LOCKED":
            raise MemoryLocked(
                f"row {key!r} is locked: only memory.unlock writes to it",
                key=key,
                memory_id=reply[1],
            )
        if status == "PINNED":
            raise MemoryPinned(
                f"row {key!r} is pinned or labelled high: a worker leaves it as it is",
                key=key,
                memory_id=reply[1],
            )
        if status == "TYPE":
            raise MemoryTypeMismatch.of(key, reply[1], "")
        if status == "MISMATCH":
            raise HashMismatch(
                f"row {key!r} changed: its content_sha256 is not the one given",
                key=key,
                content_sha256=reply[1],
            )
        if status == "LIMIT":
            raise CharLimitExceeded(int(reply[1]), int(reply[2]))
        if status == "MISSING":
            raise MemoryNotFound(f"no memory row {key!r} here", key=key)
        if status == "ERASING":
            raise UserBeingErased(
                f"user {location.user_id!r} is being erased; writes are refused",
                user_id=location.user_id,
            )
        raise RuntimeError(f"unexpected script reply {status!r}")

    def _finish(self, location: Location, reply: list[Any]) -> Written:
        status = reply[0]
        if status not in ("OK", "CREATED", "NOOP"):
            self._raise(location, reply)
        row = MemoryRow.from_fields(pairs(reply[2:]))
        written = Written(
            row,
            created=status == "CREATED",
            changed=status != "NOOP",
            sources_moved=reply[1] == "1",
        )
        if written.changed:
            self._after_write(location, written, row.version)
        return written

    def _after_write(
        self, location: Location, written: Written, changed_at: int, *, redacted: bool = False
    ) -> None:
        """The entries in the namespace's slot, which no script over the user's slot can reach
        on Redis Cluster: re-asserted on every write, so a lost one heals at the next."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(
            keys.memory_pointer(location.org, location.namespace, written.row.memory_id),
            location.pointer_value(),
        )
        if written.row.memory_type == PROFILE_TYPE:
            pipe.sadd(keys.profile_users(location.org, location.namespace), location.user_id)
            pipe.sadd(keys.profile_label_users(location.org, location.namespace, location.key),
                      location.user_id)
            pipe.sadd(
                keys.profile_agent_users(location.org, location.namespace, location.agent),
                location.user_id,
            )
        if _is_structured_row(location) and (
            redacted or written.row.written_by != STRUCTURED_WORKER
        ):
            # A caller's write, redact or delete of the worker's row makes it read as no
            # profile (pending): list the user, or no scan would ever see the row moved.
            pipe.zadd(
                keys.profile_changed_users(location.org, location.namespace),
                {location.user_id: changed_at},
            )
        if written.sources_moved:
            pipe.zadd(
                keys.profile_changed_users(location.org, location.namespace),
                {location.user_id: changed_at},
            )
            # The consolidation fold's own change list (cleared only by the fold, never by the
            # structured worker) and the namespaces it visits: app/store/consolidation.py.
            pipe.zadd(
                keys.consolidation_changed(location.org, location.namespace),
                {location.user_id: changed_at},
            )
            pipe.sadd(keys.fact_namespaces(),
                      json.dumps([location.org, location.namespace]))
        pipe.execute()


def _is_structured_row(location: Location) -> bool:
    return (location.key == STRUCTURED_PROFILE_KEY and location.agent == "-"
            and location.session_id == "-")


def _text_of(row: MemoryRow) -> str | None:
    """A row's value as text for append; None for a redacted row, which starts over."""
    if row.redacted or row.value is None:
        return None
    if not isinstance(row.value, str):
        raise ValidationFailed(
            {"label": [f"section {row.key!r} holds a {type(row.value).__name__}, not text"]}
        )
    return row.value


def trace_names(source_trace: str, memory_id: str) -> bool:
    """Whether a source_trace names a memory id (``profile.fold:<label>:<id>,<id>``): as one of
    its ``:``/``,``-separated tokens. ``profile.fold:<label>`` alone names none."""
    return bool(memory_id) and memory_id in re.split(r"[:,]", source_trace)


@dataclass(frozen=True, slots=True)
class Redacted:
    """A redact's outcome: the row, its versions scrubbed, and the derived profile rows and
    versions it reached."""

    written: Written
    versions: int
    derived_rows: int = 0
    derived_versions: int = 0


def redact_row(
    store: MemoryStore, location: Location, *, written_by: str, memory_id: str = ""
) -> Redacted:
    """Scrub every version of one row, and every profile version of the user whose
    source_trace names it (seed 000, Erasure): the derived text goes with its source.

    Refused whole (409 ``MEMORY_LOCKED``) when the row or one of those profile rows is locked.
    The reach is found from the traces, which a redact leaves in place, so a retry after a
    failure reaches the same profile keys. A profile version whose trace names no memory id
    (``profile.fold:<label>`` alone) is not reached: it keeps its text until the user is erased.
    """
    row = store.read(location)
    target = memory_id or (row.memory_id if row is not None else "")
    derived = store.derived_rows(location, target) if target else []
    result = store.redact(location, written_by=written_by, memory_id=memory_id, derived=derived)
    # A profile row first written between the scan and the script (a build that read the row
    # before the redact) is not among ``derived``. The row is no source now, so no later build
    # names it: one more scan reaches what the first missed.
    late = store.derived_rows(location, result.written.row.memory_id, unredacted_only=True)
    if late:
        again = store.redact(location, written_by=written_by, memory_id=memory_id, derived=late)
        result = replace(
            again,
            derived_rows=result.derived_rows + again.derived_rows,
            derived_versions=result.derived_versions + again.derived_versions,
        )
    return result
