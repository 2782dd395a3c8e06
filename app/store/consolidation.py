"""The profile_consolidation fold in Redis: which users to fold, what a fold read, and its record.

The fold's output is the user's profile section ``consolidated_profile`` (agent ``-``,
session_id ``-``), an ordinary memory row written through ``MemoryStore.set``; this store owns only
the fold's bookkeeping around it:

* ``fold-changed`` (namespace slot): users whose sources moved since their last fold. Every
  write that moves a user's sources adds them (``MemoryStore._after_write``, next to the
  structured worker's list); only the fold removes them, and only when no write came after
  what it read, so the two workers never consume each other's changes.
* ``fact-namespaces``: every namespace a source fact was written in, what a pass rotates over.
  It is never pruned: a namespace leaves no trace worth the race of removing it beside a write.
* ``fold-meta`` (user slot): the fold digest of the facts the last fold read (an unchanged
  digest costs no model call), the content hash it wrote, when, and the fingerprint of the
  last refused or cut-off fold, which is not tried again until the facts or the section move.
* ``fold-expiry`` (namespace slot): the earliest ``valid_to`` among the facts a fold read, so
  a fact that passes its ``valid_to`` without any write still brings its user back.

What a fold reads: the user's current source facts (``profile-src``, the filter every profile
fold shares: no ``high`` row, duplicate, ``about:other``, ``attribute:*`` or ``forget`` tag,
redacted or expired row) narrowed to the ``preference`` and ``decision`` types. Their fold
digest is a sha256 over (memory_id, type, source entry), so an edit, a type change, a changed
confidence or date, a new or a removed fact all change it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.store import keys
from app.store.lua import script
from app.store.memory import Location, MemoryRow
from app.store.replies import optional_texts, text_map
from app.store.script_interfaces import CLEAR_UNLESS_CHANGED_SINCE

if TYPE_CHECKING:
    from app.store.services import StoreServices

SECTION_KEY = "consolidated_profile"
WORKER = "worker:profile_consolidation"
TRACE_PREFIX = f"profile.fold:{SECTION_KEY}:"
FOLD_TYPES = frozenset({"preference", "decision"})


def section_location(org: str, namespace: str, user_id: str) -> Location:
    return Location(org, namespace, user_id, "-", "-", SECTION_KEY)


def fold_digest(facts: Sequence[tuple[MemoryRow, str]]) -> str:
    """sha256 over the folded facts' (memory_id, type, source entry), in id order."""
    items = sorted([row.memory_id, row.memory_type, entry] for row, entry in facts)
    return hashlib.sha256(json.dumps(items, separators=(",", ":")).encode()).hexdigest()


def refusal_fingerprint(digest: str, section_version: int) -> str:
    """What a refused or cut-off fold waits on: the facts and the section's version."""
    return f"{digest}:{section_version}"


@dataclass(frozen=True)
class FoldRecord:
    digest: str
    content_sha256: str
    folded_at: int
    refused: str
    refused_at: int = 0  # ns: when the refusal was recorded (it is retried after a while)
    failures: int = 0  # failed folds in a row since the last one that settled the section
    retry_at: int = 0  # ns: a failed fold waits until then

    @classmethod
    def from_fields(cls, f: dict[str, str]) -> FoldRecord | None:
        if not f:
            return None
        return cls(f.get("digest", ""), f.get("content_sha256", ""),
                   int(f.get("folded_at") or 0), f.get("refused", ""),
                   int(f.get("refused_at") or 0), int(f.get("failures") or 0),
                   int(f.get("retry_at") or 0))


@dataclass(frozen=True)
class FoldSources:
    """The facts a fold reads, each with its source entry, and whether the read was torn."""

    facts: list[tuple[MemoryRow, str]]
    entries: dict[str, str]
    torn: bool
    # The user's whole source digest (every source type) when the entries were read.
    source_digest: str | None = None

    @property
    def digest(self) -> str:
        return fold_digest(self.facts)

    def next_expiry(self) -> int | None:
        ends = [row.valid_to for row, _ in self.facts if row.valid_to is not None]
        return min(ends) if ends else None


class ConsolidationStore:
    def __init__(self, services: StoreServices) -> None:
        self.redis = services.redis
        self.clock = services.clock
        self._clear_changed = script(self.redis, "clear_unless_changed_since")

    # --- which users ---------------------------------------------------------------------

    def namespaces(self) -> list[tuple[str, str]]:
        """Every namespace with source facts, in a stable order."""
        return sorted(tuple(json.loads(raw)) for raw in self.redis.smembers(keys.fact_namespaces()))

    def users_to_fold(self, org: str, namespace: str, now_ns: int, limit: int) -> list[str]:
        """Listed users, oldest change first, then users a folded fact of which has passed its
        ``valid_to`` (one round trip)."""
        if limit <= 0:
            return []
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrange(keys.consolidation_changed(org, namespace), 0, limit - 1)
        pipe.zrangebyscore(keys.consolidation_expiry(org, namespace), "-inf", now_ns,
                           start=0, num=limit)
        changed, expired = pipe.execute()
        return list(dict.fromkeys([*changed, *expired]))[:limit]

    def clear_changed(
        self, org: str, namespace: str, user_id: str, read_at_ns: int, seen_digest: str | None
    ) -> bool:
        """Unlist a user once a fold read their facts; a write after ``read_at_ns`` keeps them.

        A write stamps its version before its script runs, so one that took its time before
        ``read_at_ns`` can still commit after the fold read, and its listing would be removed
        here. The source digest read again after the removal catches it: when it moved since
        ``seen_digest`` (read with the facts), the user is listed again. A write committing
        after that re-read lists the user itself, after this removal.
        """
        changed = keys.consolidation_changed(org, namespace)
        removed = bool(self._clear_changed(*CLEAR_UNLESS_CHANGED_SINCE.ordered(
            {"changed_users": changed}, {"user_id": user_id, "read_at": read_at_ns})))
        if removed:
            now = self.redis.hget(keys.profile_source_digest(org, namespace, user_id), "digest")
            # No digest at all: the user's slot was emptied (an erasure), nothing to list.
            if now is not None and now != seen_digest:
                self.redis.zadd(changed, {user_id: self.clock.now_ns()}, nx=True)
                return False
        return removed

    def requeue(self, org: str, namespace: str, user_id: str, now_ns: int) -> None:
        """Move a listed user to the back of the list (a fold that will be tried again)."""
        self.redis.zadd(keys.consolidation_changed(org, namespace), {user_id: now_ns}, xx=True)

    def cursor(self) -> tuple[str, str] | None:
        raw = self.redis.get(keys.consolidation_cursor())
        return tuple(json.loads(raw)) if raw else None

    def set_cursor(self, namespace: tuple[str, str] | None) -> None:
        if namespace is None:
            self.redis.delete(keys.consolidation_cursor())
        else:
            self.redis.set(keys.consolidation_cursor(), json.dumps(list(namespace)))

    # --- what a fold reads ---------------------------------------------------------------

    def sources(self, org: str, namespace: str, user_id: str, now_ns: int) -> FoldSources:
        """The user's preference and decision sources, as served now (three round trips).

        The rows are read after the entries, so a write landing between the two reads is seen
        as a row whose content no longer matches its entry: ``torn``, and the fold waits for
        the next pass (that write lists the user again).
        """
        # One transaction over the user's slot: the entries and the digest they add up to.
        pipe = self.redis.pipeline(transaction=True)
        pipe.hgetall(keys.profile_sources(org, namespace, user_id))
        pipe.hget(keys.profile_source_digest(org, namespace, user_id), "digest")
        entries, source_digest = pipe.execute()
        if not entries:
            return FoldSources([], {}, False, source_digest)
        ids = sorted(entries)
        row_keys = self.redis.hmget(keys.memory_ids(org, namespace, user_id), ids)
        pipe = self.redis.pipeline(transaction=False)
        for row_key in row_keys:
            if row_key:
                pipe.hgetall(row_key)
        replies = iter(pipe.execute())
        facts, torn = [], False
        for memory_id, row_key in zip(ids, row_keys, strict=True):
            found = next(replies) if row_key else None
            row = MemoryRow.from_fields(found) if found else None
            entry = entries[memory_id]
            if (row is None or row.memory_id != memory_id or not row.is_source(now_ns)
                    or row.content_sha256 != entry.split(":", 1)[0]):
                torn = True
                continue
            if row.memory_type in FOLD_TYPES:
                facts.append((row, entry))
        return FoldSources(facts, entries, torn, source_digest)

    def current_entries(self, org: str, namespace: str, user_id: str,
                        memory_ids: Sequence[str]) -> dict[str, str | None]:
        """The source entries of these facts now (None: no longer a source)."""
        if not memory_ids:
            return {}
        found = optional_texts(
            self.redis.hmget(keys.profile_sources(org, namespace, user_id), list(memory_ids))
        )
        return dict(zip(memory_ids, found, strict=True))

    # --- the record ----------------------------------------------------------------------

    def record(self, org: str, namespace: str, user_id: str) -> FoldRecord | None:
        return FoldRecord.from_fields(
            text_map(self.redis.hgetall(keys.consolidation_meta(org, namespace, user_id))))

    def record_fold(
        self, org: str, namespace: str, user_id: str, *, digest: str, content_sha256: str,
        folded_at: int, next_expiry: int | None,
    ) -> None:
        """A fold that wrote (or found nothing to write): its digest is now the unchanged one."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(keys.consolidation_meta(org, namespace, user_id),
                  mapping={"digest": digest, "content_sha256": content_sha256,
                           "folded_at": folded_at, "refused": "", "refused_at": 0,
                           "failures": 0, "retry_at": 0})
        expiry = keys.consolidation_expiry(org, namespace)
        if next_expiry is None:
            pipe.zrem(expiry, user_id)
        else:
            pipe.zadd(expiry, {user_id: next_expiry})
        pipe.execute()

    def record_refusal(self, org: str, namespace: str, user_id: str, fingerprint: str) -> None:
        self.redis.hset(keys.consolidation_meta(org, namespace, user_id),
                        mapping={"refused": fingerprint, "refused_at": self.clock.now_ns()})

    def record_failure(self, org: str, namespace: str, user_id: str,
                       wait_seconds: Callable[[int], float]) -> int:
        """Count a failed fold and set when the user may be tried again: ``wait_seconds`` of
        the failures in a row, this one included. Answers that count (HINCRBY: a failure is
        never lost to another write of the record)."""
        meta = keys.consolidation_meta(org, namespace, user_id)
        failures = int(self.redis.hincrby(meta, "failures", 1))
        retry_at = self.clock.now_ns() + int(wait_seconds(failures) * 1e9)
        self.redis.hset(meta, "retry_at", retry_at)
        return failures
