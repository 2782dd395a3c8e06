"""Memory rows in Redis: facts and profile sections, their versions, and what the workers read.

The row's types and codec are in app/store/memory_row.py (re-exported here, so the ops and jobs
import one module); this module is the store, and its scripts are
``app/store/lua/memory_*.lua`` (the part every write shares in ``memory_write.lua``).

A row is named by (org, namespace, user_id, agent, session_id, key) and lives under its user's
hash tag ``{org/namespace/user_id}``. Per row: a hash of its current fields (which is its
current version), a hash of its earlier versions (zero-padded version -> JSON snapshot of every
field at that version) and a sorted set of all its versions, the current one too (all scores 0,
so lex order is age order). A field at its default is stored in neither (memory_row.py
``ROW_DEFAULTS``); the earlier layout stored every field and the current version twice, and
readers take either until the release step has moved a store. Per user: a sorted set of the rows
(``key NUL agent NUL session_id``, for ``memory.list`` and key lookups across agents), a hash
memory_id -> row key, the set of live profile-section rows (for ``profile.render``), and the
inputs of the structured-profile worker:

* ``profile-src``: memory_id -> ``content_sha256:confidence:date_ns`` for every row that is a
  source now (a current semantic/preference/decision row, not ``high``, not a duplicate, no
  ``about:other``/``attribute:*``/``forget`` tag, not redacted, not past its ``valid_to``);
  ``date_ns`` is ``valid_at``, else ``updated_at``, the row's last change (a recall or a
  backfill writes a version without moving it, so it leaves the entry and the digest).
* ``profile-digest``: ``digest`` (XOR over the sources of sha1(memory_id|entry), 40 hex),
  ``count``, ``changed_at`` (ns of the last write that moved the digest), ``removed_at`` (ns of
  the last time a source left) and ``next_expiry`` (the earliest ``valid_to`` among sources).

Every write is one Lua script over the user's slot: the row, its snapshot, the indexes and the
source digest move together or not at all, so a reader of the digest never sees it disagree
with the rows, and reading it is one HGETALL. XOR makes the digest incremental (a write takes
out the row's old entry and puts in the new one) and order-free, which costs nothing: each
entry carries its own date, so a change to the order a build reads in is a change to an entry.
Lua has no sha256, so the per-entry hash is ``redis.sha1hex``; the digest detects change, it
does not authenticate. ``source_digest_of`` computes the same value in Python. A script's
refusals become errors through ``STATUS_ERRORS["memory"]`` (app/store/lua/__init__.py).

Outside the user's slot, the same script decides what a write asserts: the memory_id's field in
the namespace's pointer hash (``{org/namespace}``), the namespace's sets of users with facts or
sections, its sorted sets of users whose sources changed, and the list of fact namespaces. On
one server the script writes them itself, so a write is one round trip; on Redis Cluster, where
a script reaches one slot, it answers them as commands and the store sends them in one pipeline
after it. They are re-asserted on every write of the row; a process that dies between the two
round trips leaves them behind until the row's next write, and the structured pass compares
digests, so a lost "changed" entry is repaired by its scan (docs/decisions.md).

Content (its length and hash) is computed in Python, so ``append`` and ``replace`` read,
compute and write with a compare-and-swap on the row's version, retrying when another writer
came first, so concurrent appends lose nothing.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import redis
from redis.commands.core import Script

from app.errors import (
    CharLimitExceeded,
    HashMismatch,
    MemoryTypeMismatch,
    ProfileSectionNotFound,
    SubstringNotFound,
    UserBeingErased,
    ValidationFailed,
    WriteContended,
)
from app.store import keys
from app.store.batching import pairs
from app.store.idempotency import HeldKey
from app.store.lease import Fence, LeaseLost
from app.store.lua import COMPARE_AND_SWAP_LOST, FENCE_LOST, raise_for_status, script
from app.store.memory_row import (
    DEFAULT_PROFILE_CHAR_LIMIT,
    DELETE_VERSION_TRACE,
    MAX_CHAR_LIMIT,
    NUL,
    PROFILE_TYPE,
    SOURCE_TYPES,
    STRUCTURED_PROFILE_KEY,
    STRUCTURED_WORKER,
    VERSION_WIDTH,
    ZERO_DIGEST,
    Content,
    Location,
    MemoryRow,
    Redacted,
    SectionReach,
    SourceDigest,
    Written,
    canonical_json,
    content_sha256,
    format_confidence,
    new_memory_id,
    pad_version,
    source_digest_of,
    source_entry,
    tags_exclude,
    trace_names,
    version_snapshots,
)
from app.store.profile_schema import WAKES_TOTAL, namespace_member
from app.store.profile_vectors import ProfileVectorStore
from app.store.recall_terms import indexable, row_terms
from app.store.recall_vectors import (
    QUEUED_MARKER_SECONDS,
    VECTORSET,
    RecallVectorStore,
    engine_of,
    new_job_id,
)
from app.store.replies import optional_texts, scored, text, text_map, text_set, texts
from app.store.script_interfaces import (
    CLEAR_UNLESS_CHANGED_SINCE,
    MEMORY_DELETE,
    MEMORY_DELETE_VERSION,
    MEMORY_EXPIRE_SOURCES,
    MEMORY_FLAG,
    MEMORY_POINTER_MOVE,
    MEMORY_REDACT,
    MEMORY_RELAYOUT,
    MEMORY_REVERT,
    MEMORY_SET,
    MEMORY_TOUCH,
    MEMORY_WRITE_NAMESPACE_KEYS,
    ScriptInterface,
)

if TYPE_CHECKING:
    from app.store.services import StoreServices

# Importers of the row types keep importing them from here.
__all__ = [
    "CAS_DEADLINE_SECONDS",
    "DEFAULT_PROFILE_CHAR_LIMIT",
    "DELETE_VERSION_TRACE",
    "MAX_CHAR_LIMIT",
    "NUL",
    "PROFILE_TYPE",
    "SOURCE_TYPES",
    "STRUCTURED_PROFILE_KEY",
    "STRUCTURED_WORKER",
    "VERSION_WIDTH",
    "ZERO_DIGEST",
    "Content",
    "Location",
    "MemoryRow",
    "MemoryStore",
    "Redacted",
    "SectionReach",
    "SourceDigest",
    "VersionMoved",
    "Written",
    "canonical_json",
    "content_sha256",
    "format_confidence",
    "new_memory_id",
    "pad_version",
    "redact_row",
    "source_digest_of",
    "source_entry",
    "tags_exclude",
    "trace_names",
]

# A compare-and-swap write (append, replace) gives up after this long under contention.
CAS_DEADLINE_SECONDS = 5.0
# Where a write script's reply holds the row's fields: after its status, whether the sources
# moved, the namespace commands left to the caller and the embeddings job to enqueue.
REPLY_FIELDS = 4


class VersionMoved(Exception):
    """A compare-and-swap lost to another writer; the caller re-reads and tries again."""


# --------------------------------------------------------------------------------------------
# The store


class MemoryStore:
    def __init__(self, services: StoreServices) -> None:
        self.services = services
        self.redis = services.redis
        self.clock = services.clock
        self._set = script(self.redis, "memory_set")
        self._flag = script(self.redis, "memory_flag")
        self._delete = script(self.redis, "memory_delete")
        self._delete_version = script(self.redis, "memory_delete_version")
        self._redact = script(self.redis, "memory_redact")
        self._revert = script(self.redis, "memory_revert")
        self._touch = script(self.redis, "memory_touch")
        self._expire = script(self.redis, "memory_expire_sources")
        self._clear_changed = script(self.redis, "clear_unless_changed_since")
        self._relayout = script(self.redis, "memory_relayout")
        self._pointer_move = script(self.redis, "memory_pointer_move")
        self._section_vectors = ProfileVectorStore(services)
        self._clustered = isinstance(self.redis, redis.RedisCluster)

    # --- reads ---------------------------------------------------------------------------

    def read(self, location: Location) -> MemoryRow | None:
        """The row at ``location`` (live or a tombstone), or None."""
        found = text_map(self.redis.hgetall(location.row_key()))
        return MemoryRow.from_fields(found) if found else None

    def locate(self, org: str, namespace: str, memory_id: str) -> Location | None:
        """Where ``memory_id`` lives, from its pointer in the namespace's slot."""
        raw = self.redis.hget(keys.memory_pointers(org, namespace), memory_id)
        if raw is None:
            # The earlier layout's pointer key, until the release step moves it (a process of
            # that layout may still write one during the move).
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
        members = texts(
            self.redis.zrangebylex(keys.memory_keys(org, namespace, user_id), low, high)
        )
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
        members = texts(self.redis.zrangebylex(index, low, high, start=0, num=batch + 1))
        more = len(members) > batch
        members = [m[len(head):] for m in members[:batch]]
        locations = [Location.from_member(org, namespace, user_id, m) for m in members]
        rows = self._read_many(locations)
        return list(zip(members, rows, strict=True)), more

    def users_with_rows(self) -> Iterator[tuple[str, str, str]]:
        """(org, namespace, user_id) of every user with rows, on every node."""
        for key in self.redis.scan_iter(match=keys.memory_keys_pattern(), count=1000):
            yield keys.user_tag_parts(text(key))

    def history(
        self, location: Location, *, before: int | None = None, limit: int = 20
    ) -> tuple[list[MemoryRow], bool]:
        """Versions newest first, older than ``before``; and whether older ones remain."""
        order = keys.memory_version_order(*location.parts())
        high = "(" + pad_version(before) if before is not None else "+"
        padded = texts(self.redis.zrevrangebylex(order, high, "-", start=0, num=limit + 1))
        more = len(padded) > limit
        padded = padded[:limit]
        if not padded:
            return [], False
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(keys.memory_versions(*location.parts()), padded)
        pipe.hgetall(location.row_key())
        stored, row = pipe.execute()
        # The current version is the row (the earlier layout kept it among the snapshots too).
        versions = version_snapshots(
            text_map(row), {p: s for p, s in zip(padded, stored, strict=True) if s is not None})
        rows = [MemoryRow.from_fields(versions[p]) for p in padded if p in versions]
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
                text_set(self.redis.smembers(keys.profile_agent_users(org, namespace, agent)))
            )
        wanted = list(dict.fromkeys(labels))
        pipe = self.redis.pipeline(transaction=False)
        for label in wanted:
            label_users = keys.profile_label_users(org, namespace, label)
            if agent is None:
                pipe.smembers(label_users)
            else:
                pipe.sinter([label_users, keys.profile_agent_users(org, namespace, agent)])
        held: dict[str, list[str]] = {}
        for label, users in zip(wanted, pipe.execute(), strict=True):
            for user_id in users:
                held.setdefault(user_id, []).append(label)
        return {user_id: tuple(found) for user_id, found in held.items()}

    def profile_users(self, org: str, namespace: str) -> set[str]:
        return text_set(self.redis.smembers(keys.profile_users(org, namespace)))

    # --- the structured-profile inputs ---------------------------------------------------
    # The memory store's own: the row-write scripts keep them in the same step as the row, and
    # both workers (structured profiles, consolidation) read them (docs/decisions.md).

    def source_digest(self, org: str, namespace: str, user_id: str) -> SourceDigest:
        """One HGETALL: the user's source digest, count and change times."""
        found = self.redis.hgetall(keys.profile_source_digest(org, namespace, user_id))
        return SourceDigest.from_fields(text_map(found))

    def source_entries(self, org: str, namespace: str, user_id: str) -> dict[str, str]:
        return text_map(self.redis.hgetall(keys.profile_sources(org, namespace, user_id)))

    def source_rows(self, org: str, namespace: str, user_id: str) -> list[MemoryRow]:
        """The rows behind the user's current source entries (two round trips)."""
        ids = list(self.source_entries(org, namespace, user_id))
        if not ids:
            return []
        row_keys = optional_texts(self.redis.hmget(keys.memory_ids(org, namespace, user_id), ids))
        return self.read_row_keys([k for k in row_keys if k])

    def rows_by_id(
        self, org: str, namespace: str, user_id: str, memory_ids: list[str]
    ) -> list[MemoryRow]:
        """The user's rows with these ids, as stored now (two round trips)."""
        if not memory_ids:
            return []
        row_keys = optional_texts(
            self.redis.hmget(keys.memory_ids(org, namespace, user_id), memory_ids))
        return self.read_row_keys([k for k in row_keys if k])

    def expire_sources(self, org: str, namespace: str, user_id: str) -> int:
        """Take sources past their valid_to out of the digest; how many left."""
        user = (org, namespace, user_id)
        now = self.clock.now_ns()
        removed = int(self._expire(*MEMORY_EXPIRE_SOURCES.ordered(
            {"sources": keys.profile_sources(*user),
             "digest": keys.profile_source_digest(*user),
             "source_expiry": keys.profile_source_expiry(*user)},
            {"now": now})))
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
        return [(user_id, int(score)) for user_id, score in scored(found)]

    def clear_changed(self, org: str, namespace: str, user_id: str, built_at_ns: int) -> bool:
        """Forget a user's change once a build read it; a later change keeps it listed."""
        return bool(self._clear_changed(*CLEAR_UNLESS_CHANGED_SINCE.ordered(
            {"changed_users": keys.profile_changed_users(org, namespace)},
            {"user_id": user_id, "read_at": built_at_ns})))

    # --- the release step's move from the earlier layout (app/release.py) -----------------

    def relayout_user(self, org: str, namespace: str, user_id: str) -> int:
        """Every row of the user onto this layout (memory_relayout.lua, one step per row, so a
        write of the earlier layout landing meanwhile is moved or left for the next run, and
        readers take both forms); how many rows it rewrote, 0 when all were moved already."""
        rows_key = keys.memory_keys(org, namespace, user_id)
        moved = 0
        after = "-"
        while True:
            members = texts(self.redis.zrangebylex(rows_key, after, "+", start=0, num=100))
            if not members:
                return moved
            for member in members:
                parts = Location.from_member(org, namespace, user_id, member).parts()
                moved += int(self._relayout(*MEMORY_RELAYOUT.ordered(
                    {"row": keys.memory_row(*parts), "versions": keys.memory_versions(*parts),
                     "version_order": keys.memory_version_order(*parts)}, {})))
            after = "(" + members[-1]

    def move_pointers(self) -> int:
        """Every pointer key of the earlier layout, on every node, into its namespace's pointer
        hash (memory_pointer_move.lua, one step each); how many moved."""
        moved = 0
        for found in self.redis.scan_iter(match=keys.memory_pointers_everywhere_pattern(),
                                          count=1000):
            key = text(found)
            org, namespace, memory_id = keys.memory_pointer_parts(key)
            moved += int(self._pointer_move(*MEMORY_POINTER_MOVE.ordered(
                {"legacy_pointer": key, "pointers": keys.memory_pointers(org, namespace)},
                {"memory_id": memory_id})))
        return moved

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
        fence: Fence | None = None,
        held: HeldKey | None = None,
        record: tuple[str, Mapping[str, str | int]] | None = None,
    ) -> Written:
        """Write a new version with ``content``.

        ``char_limit`` None keeps the row's cap (``default_char_limit`` for a row without one;
        None there means only ``MAX_CHAR_LIMIT``). ``expected_version`` '' writes whatever is
        there, '-' only when there is no live row, a version only over that version.
        ``required_type`` refuses to overwrite a live row of another type. ``refuse_pinned``
        (the workers) refuses a pinned or ``high`` row, as a lock refuses everyone. With a
        ``fence`` (a worker holding a lease) the write is made only while the fence holds its
        token, checked in the same script: LeaseLost otherwise. With ``held`` (a call's
        Idempotency-Key) the script writes only while the call holds the key and keeps its
        reply there in the same step. ``record`` (a hash key in the user's slot and its fields)
        is written in the same step as the row, or not at all: a structured build's record, so
        no reader sees the row without it.
        """
        field_list, length = content.fields(location)
        if length > MAX_CHAR_LIMIT:
            raise CharLimitExceeded(length, MAX_CHAR_LIMIT)
        record_pairs: list[str | int] = []
        if record is not None:
            record_pairs = [item for pair in record[1].items() for item in pair]
        reply = self._run(
            self._set, MEMORY_SET, location, held,
            {"fence": fence.key if fence is not None else None,
             "record": record[0] if record is not None else None},
            {
                "now": self.clock.now_ns(),
                "memory_id": new_memory_id(),
                "member": location.member,
                "expected_version": expected_version,
                "if_match": if_match_sha256,
                "default_char_limit": "" if default_char_limit is None else default_char_limit,
                "char_limit": "" if char_limit is None else char_limit,
                "written_by": written_by,
                "required_type": required_type,
                "refuse_pinned": "1" if refuse_pinned else "0",
                "fence_token": fence.token if fence is not None else "",
                "record_pairs": len(record_pairs) // 2,
                "tail": self._tail(location, held),
            },
            more_args=[*record_pairs, *field_list],
        )
        return self._finish(location, reply, held)

    def set_flag(
        self, location: Location, flag: str, on: bool, *, written_by: str, memory_id: str = "",
        held: HeldKey | None = None,
    ) -> Written:
        """lock / unlock / pin / unpin: a new version with the same content (none when the
        flag is already so)."""
        if flag not in ("locked", "pinned"):
            raise ValueError(f"unknown flag {flag}")
        reply = self._run(self._flag, MEMORY_FLAG, location, held, {}, {
            "now": self.clock.now_ns(),
            "flag": flag,
            "on": "1" if on else "0",
            "written_by": written_by,
            "member": location.member,
            "memory_id": memory_id,
            "tail": self._tail(location, held),
        })
        return self._finish(location, reply, held)

    def delete(
        self, location: Location, *, written_by: str, memory_id: str = "", source_trace: str = "",
        held: HeldKey | None = None,
    ) -> Written | None:
        """Write a tombstone version; None when there is no row. ``changed`` False: it was
        already deleted."""
        reply = self._run(self._delete, MEMORY_DELETE, location, held, {}, {
            "now": self.clock.now_ns(), "written_by": written_by, "member": location.member,
            "memory_id": memory_id, "source_trace": source_trace,
            "tail": self._tail(location, held),
        })
        if reply[0] == "MISSING":
            return None
        return self._finish(location, reply, held)

    def delete_version(
        self, location: Location, version: int, *, written_by: str, memory_id: str = "",
        held: HeldKey | None = None,
    ) -> Written:
        """Remove one version; the removal is a new version traced ``memory.delete_version:``."""
        reply = self._run(self._delete_version, MEMORY_DELETE_VERSION, location, held, {}, {
            "now": self.clock.now_ns(),
            "version": pad_version(version),
            "written_by": written_by,
            "member": location.member,
            "memory_id": memory_id,
            "source_trace": f"{DELETE_VERSION_TRACE}{version}",
            "tail": self._tail(location, held),
        })
        return self._finish(location, reply, held, version=version)

    def revert(
        self, location: Location, version: int | None, *, written_by: str, memory_id: str = "",
        held: HeldKey | None = None,
    ) -> Written:
        """Bring back the content of a stored version as the row's next version: ``version``
        for a revert, None for a restore (a deleted row, with its newest version that is no
        deletion). Either is a change of the fact, dated now unless its valid_at dates it."""
        reply = self._run(self._revert, MEMORY_REVERT, location, held, {}, {
            "now": self.clock.now_ns(),
            "change": "restore" if version is None else "revert",
            "version": "" if version is None else pad_version(version),
            "written_by": written_by,
            "member": location.member,
            "memory_id": memory_id,
            "tail": self._tail(location, held),
        })
        return self._finish(location, reply, held, version=version)

    def touch(
        self,
        location: Location,
        change: str,
        *,
        written_by: str,
        memory_id: str = "",
        confidence: float | None = None,
        held: HeldKey | None = None,
    ) -> Written:
        """A new version with the row's content: ``restate`` and ``reinforce`` (which also
        counts, and raises the confidence to ``confidence`` when that is higher) date the fact
        now; ``recall`` counts the use and keeps the row's last change."""
        if change not in ("restate", "reinforce", "recall"):
            raise ValueError(f"unknown change {change}")
        reply = self._run(self._touch, MEMORY_TOUCH, location, held, {}, {
            "now": self.clock.now_ns(),
            "change": change,
            "written_by": written_by,
            "member": location.member,
            "memory_id": memory_id,
            "confidence": "" if confidence is None else format_confidence(confidence),
            "expected_version": "",
            "recall_terms": "",
            "vector_engine": "",
            "tail": self._tail(location, held),
        })
        return self._finish(location, reply, held)

    def backfill(self, location: Location, *, written_by: str, memory_id: str = "",
                 held: HeldKey | None = None, request_vectors: bool = True) -> Written:
        """Bring the row's lexical recall entry up to this release's terms and list it for a
        vector when it has none, keeping the row's content and last change; ``changed`` False
        when both were current. The terms are computed here from the row as read, and written
        only over that version (compare-and-swap, retried). ``request_vectors`` False leaves
        the user's embeddings job to the caller (app/recall_backfill.py requests it with the
        org's check)."""

        def attempt() -> Written:
            # No row (or a tombstone) goes to the script all the same: it answers an erasure
            # under way before the row's absence.
            row = self.read(location)
            terms = (
                row_terms(row.key, row.value)
                if row is not None and not row.redacted
                and indexable(row.memory_type, row.tags) else ""
            )
            reply = self._run(self._touch, MEMORY_TOUCH, location, held, {}, {
                "now": self.clock.now_ns(),
                "change": "backfill",
                "written_by": written_by,
                "member": location.member,
                "memory_id": memory_id,
                "confidence": "",
                "expected_version": "" if row is None else str(row.version),
                "recall_terms": terms,
                "vector_engine": "1" if engine_of(self.redis) == VECTORSET else "",
                "tail": self._tail(location, held, request_vectors),
            })
            return self._finish(location, reply, held, request_vectors=request_vectors)

        return self._with_retries(attempt)

    def redact(
        self,
        location: Location,
        *,
        written_by: str,
        memory_id: str = "",
        derived: Sequence[Location] = (),
        held: HeldKey | None = None,
    ) -> Redacted:
        """Scrub the value of every version of the row, and of every profile version of the
        ``derived`` rows whose trace names it; all or nothing. With ``held`` (a call's
        Idempotency-Key) the script keeps its reply there in the same step
        (``redacted_of`` reads it back)."""
        derived_keys: list[str] = []
        for derived_location in derived:
            derived_keys += [derived_location.row_key(),
                             keys.memory_versions(*derived_location.parts())]
        reply = self._run(self._redact, MEMORY_REDACT, location, held, {}, {
            "now": self.clock.now_ns(), "written_by": written_by, "memory_id": memory_id,
            "derived_count": len(derived),
            "tail": self._tail(location, held, request_vectors=False),
        }, more_keys=derived_keys)
        if reply[0] != "OK":
            self._refuse(location, reply)
        if held is not None:
            held.answered = True
        redacted = self.redacted_of(reply)
        written, row = redacted.written, redacted.written.row
        # A scrubbed section's vector goes now (what it was made from is gone), the row's and
        # those of the sections derived from it; the next refresh embeds what they hold now.
        scrubbed = [row.memory_id, *(other.memory_id for other in
                                     self.read_row_keys([d.row_key() for d in derived]))]
        self._section_vectors.drop(location.org, location.namespace, location.user_id, scrubbed)
        self._after_write(location, written, reply[2])
        return redacted

    @staticmethod
    def redacted_of(reply: list[Any]) -> Redacted:
        """What a redact script's reply (or the copy it kept for an Idempotency-Key) says."""
        fields = pairs(reply[REPLY_FIELDS:])
        count = int(fields.pop("versions_redacted"))
        derived_versions = int(fields.pop("derived_versions_redacted"))
        derived_rows = int(fields.pop("derived_rows_redacted"))
        row = MemoryRow.from_fields(fields)
        written = Written(row, created=False, changed=True, sources_moved=reply[1] == "1")
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
            members = texts(self.redis.zrangebylex(rows_key, after, "+", start=0, num=100))
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
                pipe.hmget(other.row_key(), _DERIVED_FIELDS)
            replies = pipe.execute()
            for i, other in enumerate(others):
                # The earlier versions, then the current one (the row).
                current = dict(zip(_DERIVED_FIELDS, optional_texts(replies[2 * i + 1]),
                                   strict=True))
                for version in [*map(json.loads, replies[2 * i]), current]:
                    if (
                        version.get("memory_type") == PROFILE_TYPE
                        and trace_names(version.get("source_trace") or "", memory_id)
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
        held: HeldKey | None = None,
    ) -> Written:
        """Append text to a text row, creating it when missing; compare-and-swap, retried
        (``held``: as ``set``, on the try that lands)."""

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
                held=held,
            )

        return self._with_retries(attempt)

    def replace_text(
        self, location: Location, old: str, new: str, *, written_by: str,
        memory_type: str = PROFILE_TYPE, held: HeldKey | None = None,
    ) -> Written:
        """Replace every occurrence of ``old`` in a text row; compare-and-swap, retried
        (``held``: as ``set``, on the try that lands)."""

        def attempt() -> Written:
            # While the user's erasure runs no write lands (409), whatever the section holds:
            # the refusal a caller can act on comes first, as for every other write.
            if self.redis.exists(keys.user_erasing(
                    location.org, location.namespace, location.user_id)):
                raise UserBeingErased(
                    f"user {location.user_id!r} is being erased; writes are refused",
                    user_id=location.user_id)
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
                held=held,
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

    def _refuse(self, location: Location, reply: list[Any], **context: Any) -> None:
        """Raise what a script's refusal stands for (``STATUS_ERRORS["memory"]``)."""
        if reply[0] == COMPARE_AND_SWAP_LOST:
            raise VersionMoved()
        if reply[0] == FENCE_LOST:
            raise LeaseLost(f"row {location.key!r}: the lease's fence no longer holds its token")
        raise_for_status(
            "memory", reply, key=location.key, user_id=location.user_id, **context
        )
        raise RuntimeError(f"unexpected script reply {reply[0]!r}")

    @staticmethod
    def written_of(reply: list[Any]) -> Written:
        """What a write script's reply (or the copy it kept for an Idempotency-Key) says."""
        status = reply[0]
        # A reply kept by a release before the job's slot has one element less before the
        # fields (an odd length: the fields are pairs).
        start = REPLY_FIELDS if len(reply) % 2 == REPLY_FIELDS % 2 else REPLY_FIELDS - 1
        return Written(
            MemoryRow.from_fields(pairs(reply[start:])),
            created=status == "CREATED",
            changed=status != "NOOP",
            sources_moved=reply[1] == "1",
        )

    def _finish(self, location: Location, reply: list[Any], held: HeldKey | None = None,
                *, request_vectors: bool = True, **context: Any) -> Written:
        status = reply[0]
        if status not in ("OK", "CREATED", "NOOP"):
            self._refuse(location, reply, **context)
        if held is not None:
            held.answered = True
        written = self.written_of(reply)
        if written.changed:
            self._after_write(location, written, reply[2])
            job_id = str(reply[3])
            if request_vectors and job_id:
                # The script took the user's queued marker for this job (no job was queued):
                # the rows it listed as due wait for it. A job queued already costs no step.
                self.services.store(RecallVectorStore).ask_embedding(
                    location.org, location.namespace, location.user_id, job_id)
        return written

    def _run(self, run: Script, interface: ScriptInterface, location: Location,
             held: HeldKey | None, own_keys: Mapping[str, str | None], args: Mapping[str, Any],
             *, more_keys: Sequence[str] = (), more_args: Sequence[Any] = ()) -> Any:
        """Run a memory write script: the keys every one shares (``location``'s, and the
        Idempotency-Key record the write answers, when it answers one), the script's
        ``own_keys`` and ``args`` by name, in the order ``interface`` declares."""
        ordered_keys, ordered_args = interface.ordered(
            {**location.write_keys(), "outcome": held.redis_key if held else None,
             **self._namespace_keys(location), **own_keys},
            args, more_keys, more_args)
        return run(keys=ordered_keys, args=ordered_args)

    def _namespace_keys(self, location: Location) -> Mapping[str, str | None]:
        """The namespace-slot keys of a write (MEMORY_WRITE_NAMESPACE_KEYS): none to the
        script on Redis Cluster, where its slot is the user's and the caller sends them."""
        if self._clustered:
            return dict.fromkeys(MEMORY_WRITE_NAMESPACE_KEYS)
        return location.namespace_keys()

    def _tail(self, location: Location, held: HeldKey | None = None,
              request_vectors: bool = True) -> str:
        """The last argument of every write script (memory_write.lua): the entries the write
        asserts outside the user's slot, whether the script writes them itself, and the id of
        the embeddings job it would mark queued for the caller to enqueue ('' none)."""
        org, namespace = location.org, location.namespace
        embed = request_vectors and self.services.store(RecallVectorStore).enabled
        return json.dumps({
            "embed_job": new_job_id() if embed else "",
            "embed_ttl": QUEUED_MARKER_SECONDS,
            "apply": not self._clustered,
            "user_id": location.user_id,
            "pointer_value": location.pointer_value(),
            "wake_member": namespace_member(org, namespace),
            "wakes_total": WAKES_TOTAL,
            "namespace_json": json.dumps([org, namespace]),
            "structured_row": _is_structured_row(location),
            "holder": held.holder if held is not None else "",
        })

    def _after_write(self, location: Location, written: Written, left: list[Any]) -> None:
        """What a write leaves to its caller: on Redis Cluster, the namespace-slot commands the
        script answered (one pipeline; a process that dies before it leaves them until the
        row's next write re-asserts them), and a section's vector refresh."""
        if left:
            # The script names each key by its declared name.
            named = location.namespace_keys()
            pipe = self.redis.pipeline(transaction=False)
            for word, key, *rest in left:
                # The script's own words (SET, SADD, ZADD): redis-py leaves this one untyped.
                pipe.execute_command(word, named.get(key, key), *rest)  # type: ignore[no-untyped-call]
            pipe.execute()
        if written.row.memory_type == PROFILE_TYPE:
            # loom_search's profile leg: the section's vector is refreshed off the request path.
            self._section_vectors.section_written(location.org, location.namespace,
                                                  location.user_id)


# What derived_rows reads of a row's current version.
_DERIVED_FIELDS = ("memory_type", "source_trace", "redacted")


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




def redact_row(
    store: MemoryStore, location: Location, *, written_by: str, memory_id: str = "",
    held: HeldKey | None = None,
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
    result = store.redact(location, written_by=written_by, memory_id=memory_id, derived=derived,
                          held=held)
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
