"""Structured profiles in Redis: the worker's build record, and the O(1) read of a profile.

The profile itself is the user's memory row ``structured_profile`` (agent ``-``, session ``-``,
type ``profile``), so ``profile.render``, ``context.pack`` and ``memory.history`` carry it. Next
to it, one small hash records what the worker's last write was built from: the content hash it
wrote, the schema sha, the sources digest and count it read, when it read them, and whether it
was short of a fact it counted. The worker writes the row and that record in one script
(``MemoryStore.set`` with ``record``), and every reader takes the row, the record and the
digest in one MULTI, so none sees a row without its record. A read compares the record with
the namespace's schema and the user's digest (kept current by every fact write), in one round
trip: no scan, no model.

A user can also be blacklisted (``structured.blacklist``, an admin op): the worker then refuses
their builds as it refuses a locked profile row, and the row as it stands is served as it would
be under a lock. The blacklist is part of the row state a refusal is remembered under
(``Snapshot.row_state``), so lifting it lets the refused build try again at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from app.clock import iso_from_ns
from app.errors import UserBeingErased
from app.profile_schema import null_profile
from app.store import keys
from app.store.idempotency import HeldKey, KeyedScript
from app.store.identity import Identity
from app.store.lease import STRUCTURED_PROFILE_LEASE, NextPass
from app.store.lua import raise_for_status, script
from app.store.memory import (
    STRUCTURED_PROFILE_KEY,
    STRUCTURED_WORKER,
    Location,
    MemoryRow,
    SourceDigest,
)
from app.store.namespace_config import AUDIT_MAX_ENTRIES, canonical_json
from app.store.profile_schema import WAKES_TOTAL, StoredSchema, parse_stored
from app.store.replies import text_map, text_set, texts
from app.store.script_interfaces import (
    CLEAR_UNLESS_CHANGED_SINCE,
    STRUCTURED_BLACKLIST,
    STRUCTURED_PARK,
    STRUCTURED_UNPARK_DUE,
)

if TYPE_CHECKING:
    from app.store.services import StoreServices

PROFILE_KEY = STRUCTURED_PROFILE_KEY
WORKER = STRUCTURED_WORKER


def profile_location(org: str, namespace: str, user_id: str) -> Location:
    return Location(org, namespace, user_id, "-", "-", PROFILE_KEY)


@dataclass(frozen=True)
class BuildRecord:
    content_sha256: str
    schema_sha: str
    digest: str
    count: int
    built_at: int
    short: bool

    @classmethod
    def from_fields(cls, f: dict[str, str]) -> BuildRecord | None:
        if not f:
            return None
        return cls(
            f.get("content_sha256", ""),
            f.get("schema_sha", ""),
            f.get("digest", ""),
            int(f.get("count") or 0),
            int(f.get("built_at") or 0),
            f.get("short") == "1",
        )


@dataclass(frozen=True)
class Snapshot:
    """Everything a structured read or a build's planning needs about one user."""

    schema: StoredSchema | None
    row: MemoryRow | None
    record: BuildRecord | None
    digest: SourceDigest
    blacklisted_since: int | None = None  # ns; None when the user is not blacklisted
    # A build's snapshot: the user's source entries (memory_id -> entry), read in the same
    # MULTI as the digest, so the facts a build reads are the ones its record counts.
    entries: dict[str, str] | None = None

    def refuses_builds(self) -> bool:
        """Whether the worker must leave the profile as it is: the user is blacklisted, or the
        live row at the key is locked, pinned or labelled ``high`` (seed 000, Passes)."""
        if self.blacklisted_since is not None:
            return True
        row = self.row
        return row is not None and row.live and (row.locked or row.pinned or row.label == "high")

    def row_state(self) -> str:
        """What a refusal by the profile row is remembered under (with the digest and the
        schema sha): the row's version, and the blacklist entry while there is one."""
        return row_state(self.row.version if self.row is not None else 0,
                         self.blacklisted_since)

    def served_row(self, now_ns: int) -> MemoryRow | None:
        """The worker's live row, or None: a caller's row, a deleted, expired, redacted or
        ``high`` row reads as no profile (seed 000, Storage)."""
        row = self.row
        return row if row is not None and row_is_served(row, self.record, now_ns) else None

    def worker_row(self) -> bool:
        """Whether the row at the key is one the worker wrote (served or not: redacted or
        expired since), as opposed to no row or a row a caller wrote over it."""
        row, record = self.row, self.record
        if row is None:
            return False
        if row.written_by == WORKER:
            return True  # a redact of a source scrubs the row in place, keeping its writer
        # A lock or pin by a caller writes a version with the worker's content.
        return record is not None and bool(row.content_sha256) and (
            row.content_sha256 == record.content_sha256)

    def rebuild_from(self, now_ns: int, cooldown_seconds: float) -> int:
        """The earliest time (ns) a pass may rebuild the profile, on the rules of seed 000
        (the planner's ``user_due``): at once when no profile is served (a first build is no
        rebuild), when the schema changed or a source left; else a cooldown after the later of
        the last change and the build. A failed build's backoff and a refusal, kept by the
        worker, are not counted."""
        schema, record, digest = self.schema, self.record, self.digest
        if self.served_row(now_ns) is None or record is None or schema is None:
            return now_ns
        deletion = digest.count < record.count or (
            digest.removed_at is not None and digest.removed_at > record.built_at)
        if record.schema_sha != schema.sha or deletion or digest.expiry_due(now_ns):
            return now_ns
        last = max(digest.changed_at or 0, record.built_at)
        return max(now_ns, last + int(cooldown_seconds * 1e9))

    def read(self, now_ns: int) -> dict[str, Any]:
        """The profile.structured answer (without the schema hash, added by the caller)."""
        schema = self.schema
        if schema is None or schema.doc is None:
            return _answer("no_schema", {}, None, None)
        row = self.served_row(now_ns)
        if row is None:
            status = "ready" if self.row is None and self.digest.count == 0 else "pending"
            return _answer(status, null_profile(schema.doc), None, None)
        record = self.record
        assert record is not None
        current = (
            record.schema_sha == schema.sha
            and record.digest == self.digest.digest
            and record.count == self.digest.count
            and not record.short
            # A source passed its valid_to: the digest moves once a scan takes it out, but
            # the profile already holds a fact that is no longer true.
            and not self.digest.expiry_due(now_ns)
        )
        return _answer("ready" if current else "stale", _profile_of(schema.doc, row), row,
                       record)


def row_state(row_version: int, blacklisted_since: int | None) -> str:
    # A user that is not blacklisted keeps the plain version, so refusals remembered before
    # the blacklist existed keep their fingerprint.
    if blacklisted_since is None:
        return str(row_version)
    return f"{row_version}:blacklisted:{blacklisted_since}"


def _since(raw: str | float | None) -> int | None:
    """A blacklisting's time from its sorted-set score. Redis 7.0 spells a large score in
    exponent form ('1.79e+18'), Valkey as digits: both read as the same whole number."""
    if raw in (None, ""):
        return None
    if isinstance(raw, str) and not raw.isdigit():
        return int(float(raw))
    return int(raw)


def row_is_served(row: MemoryRow, record: BuildRecord | None, now_ns: int) -> bool:
    """Served: live, not redacted, not ``high``, not expired, and the content the worker's
    last build wrote (a caller's write over it is not)."""
    if record is None or not row.live or row.redacted:
        return False
    if row.label == "high" or row.expired(now_ns):
        return False
    return row.content_sha256 == record.content_sha256


def _profile_of(schema_doc: dict[str, Any], row: MemoryRow) -> dict[str, Any]:
    """The schema's properties, null where the row's value does not name them."""
    profile = null_profile(schema_doc)
    if isinstance(row.value, dict):
        profile.update({k: v for k, v in row.value.items() if k in profile})
    return profile


def _answer(
    status: str, profile: dict[str, Any], row: MemoryRow | None, record: BuildRecord | None
) -> dict[str, Any]:
    version = row.version if row is not None else 0
    return {
        "status": status,
        "profile": profile,
        "built_at": iso_from_ns(record.built_at) if record is not None else None,
        "memory_id": row.memory_id if row is not None else "",
        "version": version,
        "version_text": str(version),
    }


class StructuredStore:
    def __init__(self, services: StoreServices) -> None:
        self.redis = services.redis
        self.clock = services.clock
        self._park = script(self.redis, "structured_park")
        self._unpark = script(self.redis, "structured_unpark_due")
        self._forget = script(self.redis, "clear_unless_changed_since")
        self._blacklist = KeyedScript(self.redis, "structured_blacklist", "structured")
        self._clustered = isinstance(self.redis, redis.RedisCluster)

    def snapshot(self, identity: Identity, *, for_build: bool = True) -> Snapshot:
        """The schema, the profile row, its build record, the user's digest, and for a build
        (not a read: they change no status, and the entries grow with the user's facts) the
        user's source entries and whether the user is blacklisted. The row, record, digest and
        entries are read in one MULTI, so they are of one moment: the worker writes a row and
        its record in one step (``record_fields``), and no read sees one without the other.
        One round trip on a single server, two on a cluster (the schema and the blacklist are
        in the namespace's slot)."""
        org, namespace, user_id = identity.org, identity.namespace, identity.user_id
        user_reads = self._user_reads(org, namespace, [user_id])
        if for_build:
            user_reads.hgetall(keys.profile_sources(org, namespace, user_id))
        pipe = user_reads if not self._clustered else self.redis.pipeline(transaction=False)
        pipe.hgetall(keys.profile_schema(org, namespace))
        if for_build:
            pipe.zscore(keys.structured_blacklist(org, namespace), user_id)
        if self._clustered:
            found = [*user_reads.execute(), *pipe.execute()]
        else:
            found = pipe.execute()
        row, record, digest = found[:3]
        entries = text_map(found[3]) if for_build else None
        schema_row, *blacklisted = found[4:] if for_build else found[3:]
        return Snapshot(
            parse_stored(schema_row),
            MemoryRow.from_fields(row) if row else None,
            BuildRecord.from_fields(record),
            SourceDigest.from_fields(digest),
            _since(blacklisted[0]) if blacklisted else None,
            entries,
        )

    def _user_reads(self, org: str, namespace: str, user_ids: list[str]) -> Any:
        """A MULTI pipeline holding, per user, the reads of the profile row, its build record
        and the digest (in that order). A cluster's MULTI spans one slot: one user there."""
        if self._clustered and len(user_ids) != 1:
            raise ValueError("a cluster MULTI reads one user's slot")
        pipe = self.redis.pipeline(transaction=True)
        for user_id in user_ids:
            pipe.hgetall(profile_location(org, namespace, user_id).row_key())
            pipe.hgetall(keys.structured_meta(org, namespace, user_id))
            pipe.hgetall(keys.profile_source_digest(org, namespace, user_id))
        return pipe

    @staticmethod
    def record_fields(
        org: str, namespace: str, user_id: str, record: BuildRecord
    ) -> tuple[str, dict[str, str | int]]:
        """The build record as the hash key and fields the worker's row write carries
        (``MemoryStore.set``'s ``record``): written in the same step as the row or not at all."""
        return keys.structured_meta(org, namespace, user_id), {
            "content_sha256": record.content_sha256,
            "schema_sha": record.schema_sha,
            "digest": record.digest,
            "count": record.count,
            "built_at": record.built_at,
            "short": "1" if record.short else "0",
        }

    def index_build(
        self, org: str, namespace: str, user_id: str, next_expiry: float | None
    ) -> None:
        """After a build's write: the namespace's index entries, which no script over the
        user's slot can reach on Redis Cluster (the built users, whom a schema change lists
        again, and when the next counted source passes its valid_to). Re-asserted on every
        build, so a lost one heals at the next."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.sadd(keys.structured_users(org, namespace), user_id)
        if next_expiry is not None:
            pipe.zadd(keys.structured_expiry(org, namespace), {user_id: int(next_expiry)})
        else:
            pipe.zrem(keys.structured_expiry(org, namespace), user_id)
        pipe.execute()

    def expiring_users(self, org: str, namespace: str, now_ns: int) -> list[str]:
        """Users one of whose counted sources passed its valid_to since their last build."""
        return texts(
            self.redis.zrangebyscore(keys.structured_expiry(org, namespace), "-inf", now_ns))

    def forget_expiry(self, org: str, namespace: str, user_id: str, due_ns: int) -> None:
        """Drop a user's expiry entry once its facts were taken out (the next build writes the
        next one), unless a build wrote a later one meanwhile."""
        self._forget(*CLEAR_UNLESS_CHANGED_SINCE.ordered(
            {"changed_users": keys.structured_expiry(org, namespace)},
            {"user_id": user_id, "read_at": due_ns}))

    def records(
        self, org: str, namespace: str, user_ids: list[str]
    ) -> dict[str, tuple[BuildRecord | None, SourceDigest, str, bool]]:
        """Build record, digest, profile row state (``Snapshot.row_state``) and whether the row
        is served, of many users in one MULTI (a scan's candidates; on a cluster, one per
        user), so no user's row is read without its record. A build record alone
        is no built profile: the row may have been written over, redacted or deleted since."""
        now_ns = self.clock.now_ns()
        if not user_ids:
            return {}
        if self._clustered:
            # A cluster's MULTI spans one slot: each user's three reads are one MULTI, and the
            # blacklist (the namespace's slot) one more round trip.
            replies = [reply for user_id in user_ids
                       for reply in self._user_reads(org, namespace, [user_id]).execute()]
            pipe = self.redis.pipeline(transaction=False)
        else:
            pipe = self._user_reads(org, namespace, user_ids)
        for user_id in user_ids:
            pipe.zscore(keys.structured_blacklist(org, namespace), user_id)
        if self._clustered:
            blacklist = pipe.execute()
        else:
            found_all = pipe.execute()
            replies, blacklist = found_all[:3 * len(user_ids)], found_all[3 * len(user_ids):]
        found = {}
        for i, user_id in enumerate(user_ids):
            raw_row, raw_record, raw_digest = replies[3 * i:3 * i + 3]
            record = BuildRecord.from_fields(raw_record)
            row = MemoryRow.from_fields(raw_row) if raw_row else None
            served = row is not None and row_is_served(row, record, now_ns)
            state = row_state(row.version if row is not None else 0, _since(blacklist[i]))
            found[user_id] = (record, SourceDigest.from_fields(raw_digest), state, served)
        return found

    def set_blacklisted(
        self, identity: Identity, on: bool, actor: str, audit: dict[str, Any],
        held: HeldKey | None = None,
    ) -> tuple[bool, int | None]:
        """Blacklist the user from structured-profile builds, or lift it, and append the audit
        entry ``{"at", "at_ns", "actor", "action", **audit}`` in the same step when that
        changed anything. Answers whether it did and since when the user is blacklisted (None:
        not). Refused while the user's erasure runs (a blacklist entry is the user's data).
        With ``held`` (an Idempotency-Key in the namespace's slot) the script keeps its reply
        there (``blacklisted_of`` reads it back).
        """
        org, namespace, user_id = identity.org, identity.namespace, identity.user_id
        if self.redis.exists(keys.user_erasing(org, namespace, user_id)):
            raise UserBeingErased(
                "this user is being erased; write again once the erasure is done")
        now = self.clock.now_ns()
        entry = {"at": iso_from_ns(now), "at_ns": now, "actor": actor,
                 "action": "structured.blacklist", **audit}
        reply = self._blacklist(*STRUCTURED_BLACKLIST.ordered(
            {"blacklist": keys.structured_blacklist(org, namespace),
             "audit": keys.namespace_audit(org, namespace),
             "parked": keys.structured_parked(org, namespace),
             "changed_users": keys.profile_changed_users(org, namespace)},
            {"user": user_id, "on": "1" if on else "0", "now": now,
             "audit_entry": canonical_json(entry), "audit_max": AUDIT_MAX_ENTRIES},
        ), held)
        raise_for_status("structured", reply)
        return self.blacklisted_of(reply)

    @staticmethod
    def blacklisted_of(reply: list[Any]) -> tuple[bool, int | None]:
        """(changed, blacklisted since) from the script's reply or the copy a key kept."""
        return int(reply[1]) == 1, _since(reply[2])

    def park(self, org: str, namespace: str, user_id: str, until_ns: int, read_at: int) -> None:
        """Take a refused or failed user out of the changed index until ``until_ns``.

        A change newer than the build's read stays listed (the same rule as clear_changed).
        """
        self._park(*STRUCTURED_PARK.ordered(
            {"changed_users": keys.profile_changed_users(org, namespace),
             "parked": keys.structured_parked(org, namespace)},
            {"user": user_id, "parked_until": until_ns, "read_at": read_at},
        ))

    def unpark_due(self, org: str, namespace: str, now_ns: int) -> int:
        """List again, as changed now, the parked users whose wait is over."""
        return self._unpark_until(org, namespace, now_ns)

    def unpark_all(self, org: str, namespace: str) -> int:
        """List every parked user again, whatever their wait: the waits started over (another
        process took the worker lease)."""
        return self._unpark_until(org, namespace, "+inf")

    def _unpark_until(self, org: str, namespace: str, now: int | str) -> int:
        return int(self._unpark(*STRUCTURED_UNPARK_DUE.ordered(
            {"parked": keys.structured_parked(org, namespace),
             "changed_users": keys.profile_changed_users(org, namespace)},
            {"now": now},
        )))

    def unpark(self, org: str, namespace: str, user_id: str, now_ns: int) -> None:
        """List a parked user again at once (its profile row was unlocked, unpinned, ...)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.zrem(keys.structured_parked(org, namespace), user_id)
        pipe.zadd(keys.profile_changed_users(org, namespace), {user_id: now_ns})
        pipe.execute()

    def forget_current(self, org: str, namespace: str, user_ids: list[str],
                       read_at: int) -> None:
        """Drop users a scan found current from the changed index (they were listed by a
        change that left their sources as built), unless they changed again since."""
        for user_id in user_ids:
            self._forget(*CLEAR_UNLESS_CHANGED_SINCE.ordered(
                {"changed_users": keys.profile_changed_users(org, namespace)},
                {"user_id": user_id, "read_at": read_at}))

    def list_built_users_for_schema(self, org: str, namespace: str, schema_sha: str) -> int:
        """Once per schema: list every built user as changed, so the passes rebuild them.

        Costs O(built users) once per schema change instead of on every scan, which keeps a
        pass's Redis work growing with the changed users, not all users.
        """
        swept_key = keys.structured_schema_swept(org, namespace)
        if self.redis.get(swept_key) == schema_sha:
            return 0
        users = text_set(self.redis.smembers(keys.structured_users(org, namespace)))
        now = self.clock.now_ns()
        pipe = self.redis.pipeline(transaction=False)
        if users:
            pipe.zadd(keys.profile_changed_users(org, namespace), dict.fromkeys(users, now),
                      nx=True)
        pipe.set(swept_key, schema_sha)
        pipe.execute()
        return len(users)

    def backlog(self, namespaces: list[tuple[str, str]]) -> list[NamespaceBacklog]:
        """Each namespace's ``NamespaceBacklog`` in one pipeline: four reads of the namespace's
        own slot apiece (the users behind, those of them built, the parked, the oldest
        change)."""
        return _read_backlog(self.redis, namespaces)

    def pass_schedule(self) -> tuple[NextPass, int]:
        """What the last pass stored about the next one, and every namespace's wakes since
        (``wakes_total``): one round trip on a single server."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(keys.worker_next_pass(STRUCTURED_PROFILE_LEASE))
        pipe.hget(keys.structured_wakes(), WAKES_TOTAL)
        raw, total = pipe.execute()
        return NextPass.parse(raw), int(total or 0)

    def wakes(self) -> dict[str, int]:
        """How many times each namespace (``namespace_member``) woke the passes, a schema set
        or a user's first source fact, and all of them under ``WAKES_TOTAL``. One HGETALL;
        the counts only ever grow."""
        return {member: int(count) for member, count in
                text_map(self.redis.hgetall(keys.structured_wakes())).items()}


def wakes_total(wakes: dict[str, int]) -> int:
    return wakes.get(WAKES_TOTAL, 0)



@dataclass(frozen=True)
class NamespaceBacklog:
    """The users of one namespace waiting for a structured build, as ``GET /metrics`` shows
    them: listed as changed and never built (pending) or built before the change (stale), and
    parked on a failed build's backoff or a refusal; and since when the oldest listed waits."""

    org: str
    namespace: str
    pending: int
    stale: int
    parked: int
    oldest_changed_ns: int | None


def _read_backlog(redis_client: Any, namespaces: list[tuple[str, str]]) -> list[NamespaceBacklog]:
    pipe = redis_client.pipeline(transaction=False)
    for org, namespace in namespaces:
        changed = keys.profile_changed_users(org, namespace)
        pipe.zcard(changed)
        pipe.zintercard(2, [changed, keys.structured_users(org, namespace)])
        pipe.zcard(keys.structured_parked(org, namespace))
        pipe.zrange(changed, 0, 0, withscores=True)
    found = pipe.execute()
    backlogs = []
    for index, (org, namespace) in enumerate(namespaces):
        listed, built, parked, oldest = found[index * 4:index * 4 + 4]
        backlogs.append(NamespaceBacklog(
            org, namespace, pending=int(listed) - int(built), stale=int(built),
            parked=int(parked), oldest_changed_ns=int(oldest[0][1]) if oldest else None))
    return backlogs
