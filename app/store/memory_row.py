"""A memory row as Loom stores it: where it lives (``Location``), its fields and their codec
(``MemoryRow`` read, ``Content`` written), a write's outcome, and the source digest a structured
build compares. Nothing here speaks Redis: the store (app/store/memory.py) does.

The stored form is flat strings, the row's hash of current fields and one JSON snapshot of the
same fields per earlier version (the row is its current version); a field at its default
(``ROW_DEFAULTS``) is not stored, and ``MemoryRow.from_fields`` reads either form, with or
without the defaults (an earlier layout stored every field, and its current version twice).
Content is computed here: ``value_length`` is the length of the value's canonical JSON (compact,
sorted keys, non-ASCII kept) and ``content_sha256`` the sha256 of it. ``MemoryRow.is_source``
and ``source_digest_of`` state in Python the rules the write scripts keep
(app/store/lua/memory_write.lua), for builds and tests; the scripts are the authority.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.clock import iso_from_ns
from app.store import keys
from app.store.recall_terms import indexable, row_terms
from app.store.replies import text

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
NUL = "\x00"


# The fields a row or a snapshot does not store at these values (app/store/lua/
# memory_row_form.lua, the authority, says the same); a reader takes an absent one as its
# default, as ``MemoryRow.from_fields`` does.
ROW_DEFAULTS: Mapping[str, str] = {
    "pinned": "0", "locked": "0", "deleted": "0", "redacted": "0", "tag_excluded": "0",
    "valid_at": "", "valid_to": "", "duplicate_of": "", "source_trace": "", "actor": "",
    "char_limit": "", "from_version": "", "recall_terms": "", "tags": "[]", "label": "normal",
    "provenance": "stated",
}


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


def version_snapshots(
    row: Mapping[str, str], stored: Mapping[str, Any]
) -> dict[str, Mapping[str, Any]]:
    """Every version of a row by padded version: the earlier ones from ``stored`` (the versions
    hash, padded version -> JSON) and the current one from ``row`` (its fields), which an
    earlier layout also kept in ``stored``."""
    found: dict[str, Mapping[str, Any]] = {
        text(padded): json.loads(raw) for padded, raw in stored.items()}
    if row:
        found.setdefault(pad_version(row["version"]), row)
    return found


def trace_names(source_trace: str, memory_id: str) -> bool:
    """Whether a source_trace names a memory id (``profile.fold:<label>:<id>,<id>``): as one of
    its ``:``/``,``-separated tokens. ``profile.fold:<label>`` alone names none."""
    return bool(memory_id) and memory_id in re.split(r"[:,]", source_trace)


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

    def write_keys(self) -> dict[str, str]:
        """The keys every memory write script takes (app/store/script_interfaces.py
        MEMORY_WRITE_KEYS but the Idempotency-Key record), by name; all in the user's slot."""
        parts = self.parts()
        user = (self.org, self.namespace, self.user_id)
        return {
            "row": keys.memory_row(*parts),
            "versions": keys.memory_versions(*parts),
            "version_order": keys.memory_version_order(*parts),
            "rows": keys.memory_keys(*user),
            "memory_ids": keys.memory_ids(*user),
            "sections": keys.profile_sections(*user),
            "sources": keys.profile_sources(*user),
            "digest": keys.profile_source_digest(*user),
            "source_expiry": keys.profile_source_expiry(*user),
            "erasing": keys.user_erasing(*user),
            "live": keys.memory_live(*user),
            "recall_docs": keys.recall_docs(*user),
            "recall_postings": keys.recall_postings(*user),
            "recall_stats": keys.recall_stats(*user),
            "recall_vectors": keys.recall_vectors(*user),
            "recall_vectors_due": keys.recall_vectors_due(*user),
            "recall_vectors_generation": keys.recall_vectors_generation(*user),
            "recall_vector_set": keys.recall_vector_set(*user),
            "recall_vectors_queued": keys.recall_vectors_queued(*user),
        }

    def namespace_keys(self) -> dict[str, str]:
        """The namespace-slot keys a write of the row asserts (app/store/script_interfaces.py
        MEMORY_WRITE_NAMESPACE_KEYS), by name."""
        org, namespace = self.org, self.namespace
        return {
            "pointers": keys.memory_pointers(org, namespace),
            "recall_users": keys.recall_users(org, namespace),
            "namespace_vector_set": keys.recall_namespace_vector_set(org, namespace),
            "profile_users": keys.profile_users(org, namespace),
            "label_users": keys.profile_label_users(org, namespace, self.key),
            "agent_users": keys.profile_agent_users(org, namespace, self.agent),
            "changed_users": keys.profile_changed_users(org, namespace),
            "fold_changed": keys.consolidation_changed(org, namespace),
            "fact_namespaces": keys.fact_namespaces(),
            "structured_wakes": keys.structured_wakes(),
        }

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
    # The row's last change: the version that last changed the fact. A recall or a backfill
    # writes a version without moving it (so it dates the source entry, under valid_at).
    updated_at: int
    # What wrote this version (``write``, ``lock``, ``revert``, ...; '' before it was kept),
    # and for a revert or a restore the version whose content came back.
    change: str = ""
    from_version: int | None = None
    recall_count: int = 0
    recalled_at: int | None = None
    reinforce_count: int = 0

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
            change=f.get("change", ""),
            from_version=_optional_ns(f.get("from_version")),
            recall_count=int(f.get("recall_count") or 0),
            recalled_at=_optional_ns(f.get("recalled_at")),
            reinforce_count=int(f.get("reinforce_count") or 0),
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
            "change": self.change,
            "from_version": self.from_version,
            "from_version_text": "" if self.from_version is None else str(self.from_version),
            "recall_count": self.recall_count,
            "recalled_at": None if self.recalled_at is None else iso_from_ns(self.recalled_at),
            "reinforce_count": self.reinforce_count,
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
            # What the lexical recall index holds for this version ('' keeps it out).
            "recall_terms": (
                row_terms(location.key, self.value)
                if indexable(self.memory_type, self.tags) else ""
            ),
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


@dataclass(frozen=True, slots=True)
class Redacted:
    """A redact's outcome: the row, its versions scrubbed, and the derived profile rows and
    versions it reached."""

    written: Written
    versions: int
    derived_rows: int = 0
    derived_versions: int = 0
