"""Erasure of one user of a namespace, with proof, and the user's data package.

``ErasureStore.erase`` is the saga of seed 000 ("Erasure") and seed 002 ("Retention and
erasure") for (org, namespace, user_id). Its steps, in order:

``mark``            create the user's erasure marker (``keys.user_erasing``) and one per
                    agent-state subject that is the user (``keys.agent_state_subject_erasing``):
                    from here every memory, working-memory and profile write for the user and
                    every agent-state write naming them (callers and workers) is refused 409
                    ``USER_BEING_ERASED``, so a build that raced the erasure cannot write a row.
``memory``          the memory_id pointers (namespace slot, found from the user's id index), then
                    every row with its versions (facts, profile sections, the structured
                    profile), the user's indexes and source digest, the structured build record,
                    and the user's entries in the namespace indexes (changed users, users with
                    sections, users with a structured profile).
``working_memory``  every block of every scope of the user (the user's scope index).
``activity``        who read the user's profile.
``agent_state``     the states of the user's subject scope and every state naming them in
                    ``subject`` (the user id as a subject handle, and any other handles given).
``jobs``            queued, failed, finished, deferred, scheduled and canceled RQ jobs whose
                    arguments name (org, namespace, user_id); a running job is left to the census.
``tokens``          the tokens pinned to the user are revoked, their claims keeping the
                    erasure id (a keyed hash) in place of the user id.
``worker_state``    the user's entries in what the workers keep between passes (scan lists,
                    waits), which live in no user's slot.
``sweep``           SCAN for anything still under the user's hash tag, and the namespace's
                    memory_id pointers, and remove it: what an index did not list.
``census``          the same scans plus the namespace indexes, the agent-state subject index,
                    every RQ job and the workers' state, as a check. Anything found fails the
                    erasure closed: status ``failed``, retryable, the marker stays and writes
                    stay refused. Clean: the counts and the census become the receipt, the
                    marker goes, and later writes for the user start from nothing.

Every step is idempotent and a retry runs them all again, so an erasure interrupted anywhere
(a crash, a failed census) is finished by running it again. Keys of the user's slot are
deleted by one script that adds what they held to the counts on the marker (same slot), so a
crash neither loses nor doubles those counts; the removals in other slots (pointers, namespace
indexes, agent state, jobs) are counted right after, and an attempt that dies between a removal
and its count leaves that removal uncounted.

The raw user id is never written to anything the erasure keeps: its record and its lock are
named by an HMAC of (org, namespace, user_id) under the install's secret (``erasure_id``), the
receipt holds counts and times only, and the audit entry holds counts only. The marker is named
by the user's tag, like every key of the user, and goes with them.

``ErasureStore.export`` builds the data package: every row with its versions, the blocks, the
profile sections, the structured profile, the profile's readers and the agent states by
declared field, as one JSON-ready document.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from redis.exceptions import ResponseError, WatchError

from app.clock import iso_from_ns
from app.errors import ErasureNotFound, ErasureRunning, ValidationFailed
from app.keyed import keyed_digest
from app.store import keys
from app.store.activity import RETENTION_DAYS, ActivityStore
from app.store.agent_state import AgentStateStore
from app.store.batching import batches
from app.store.identity import Identity
from app.store.lua import script
from app.store.memory import PROFILE_TYPE, MemoryRow
from app.store.namespace_config import AuditLog
from app.store.structured import PROFILE_KEY
from app.store.tokens import TokenStore
from app.store.working_memory import decode_block

if TYPE_CHECKING:
    from rq.job import Job

    from app.services import Services

KINDS = (
    "memory_rows",
    "memory_versions",
    "profile_sections",
    "structured_profiles",
    "working_memory_blocks",
    "agent_states",
    "activity_entries",
    "jobs",
    "tokens",
    "index_entries",
)
STEPS = (
    "mark",
    "memory",
    "working_memory",
    "activity",
    "agent_state",
    "jobs",
    "tokens",
    "worker_state",
    "sweep",
    "census",
)
EXPORT_FORMAT = "loom.subject_export.v1"
# The lock outlives a stalled step by this much; every batch renews it.
LOCK_TTL_MS = 60_000
BATCH = 200
AOF_WAIT_SECONDS = 30.0
MAX_HANDLES = 20

# Versioned purpose: no other keyed digest under the same secret can equal an erasure id.
_PURPOSE = b"loom.erasure.user.v1"
_RQ_JOB_PREFIX = "rq:job:"
# rq-scheduler's sorted set of scheduled job ids (a job it holds is also an rq:job hash).
_RQ_SCHEDULER_JOBS = "rq:scheduler:scheduled_jobs"

Progress = Callable[[str, dict[str, Any]], None]
# Set by a caller that shows progress (the ``flask loom erase`` and ``export`` commands): each
# finished step calls it with the step's name and the counts so far.
PROGRESS: ContextVar[Progress | None] = ContextVar("loom_erasure_progress", default=None)


# --------------------------------------------------------------------------------------------
# What a key of the user's slot holds, from its builder's prefix

_SAMPLE = ("o", "n", "u")
_KIND_OF_PREFIX = {
    keys.prefix_of(keys.memory_row(*_SAMPLE, "a", "s", "k")): "row",
    keys.prefix_of(keys.memory_versions(*_SAMPLE, "a", "s", "k")): "versions",
    keys.prefix_of(keys.working_memory_scope(*_SAMPLE, "a", "s", "r")): "blocks",
    keys.prefix_of(keys.profile_reads(*_SAMPLE)): "activity",
}
# What the census reports a leftover key as; anything else under the tag is an index entry.
_CENSUS_KIND = {
    "row": "memory_rows",
    "versions": "memory_versions",
    "blocks": "working_memory_blocks",
    "activity": "activity_entries",
    "index": "index_entries",
}


def kind_of(key: str) -> str:
    return _KIND_OF_PREFIX.get(keys.prefix_of(key), "index")


# KEYS: 1 the user's erasure marker, 2.. keys of the same slot. ARGV: the kind of each of
# KEYS[2..] (row, versions, blocks, activity, index), then the structured profile's key.
# Deletes the keys and adds what they held to the marker's counts in one step. Without the
# marker it does nothing: counts land only in a running erasure, and a late call from a
# process that lost the erasure cannot bring the marker back.
_DROP = r"""
if redis.call('EXISTS', KEYS[1]) == 0 then return {'NOMARK'} end
local structured_key = ARGV[#KEYS]
local counts = {}
local function add(kind, n)
  if n > 0 then counts[kind] = (counts[kind] or 0) + n end
end
local function size(key)
  local t = redis.call('TYPE', key).ok
  if t == 'hash' then return redis.call('HLEN', key) end
  if t == 'zset' then return redis.call('ZCARD', key) end
  if t == 'set' then return redis.call('SCARD', key) end
  if t == 'list' then return redis.call('LLEN', key) end
  if t == 'none' then return 0 end
  return 1
end
for i = 2, #KEYS do
  local key, kind = KEYS[i], ARGV[i - 1]
  if key ~= KEYS[1] and redis.call('EXISTS', key) == 1 then
    if kind == 'row' then
      local f = redis.call('HMGET', key, 'memory_type', 'key', 'agent', 'session_id')
      if f[1] == 'profile' and f[2] == structured_key and f[3] == '-' and f[4] == '-' then
        add('structured_profiles', 1)
      elseif f[1] == 'profile' then
        add('profile_sections', 1)
      else
        add('memory_rows', 1)
      end
    elseif kind == 'versions' then
      add('memory_versions', size(key))
    elseif kind == 'blocks' then
      add('working_memory_blocks', size(key))
    elseif kind == 'activity' then
      add('activity_entries', size(key))
    else
      add('index_entries', size(key))
    end
    redis.call('DEL', key)
  end
end
local reply = {'OK'}
for kind, n in pairs(counts) do
  redis.call('HINCRBY', KEYS[1], kind, n)
  reply[#reply + 1] = kind
  reply[#reply + 1] = tostring(n)
end
return reply
"""

# KEYS: 1 the marker. ARGV: kind, n pairs. Counts removals made outside the user's slot.
_ADD = r"""
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
for i = 1, #ARGV, 2 do
  if tonumber(ARGV[i + 1]) > 0 then redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
return 1
"""



def erasure_id(secret: str, org: str, namespace: str, user_id: str) -> str:
    """HMAC-SHA256 (hex) of (org, namespace, user_id): what names the erasure's record."""
    return keyed_digest(secret.encode("utf-8"), _PURPOSE, org, namespace, user_id)



def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _pointer_user(raw: str | None) -> str | None:
    """The user a memory_id pointer names (its value is ``[user, agent, session, key]``)."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value[0] if isinstance(value, list) and value and isinstance(value[0], str) else None


def _hit(reply: Any) -> bool:
    """Whether a membership reply found the member: a ZSCORE of 0.0 is a hit."""
    if isinstance(reply, float):
        return True
    return bool(reply)


def _zero() -> dict[str, int]:
    return dict.fromkeys(KINDS, 0)


def _strings_in(value: Any, depth: int = 0) -> Iterator[str]:
    """Every string in a job's arguments (nested lists, tuples, dicts, keys included)."""
    if depth > 8:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings_in(key, depth + 1)
            yield from _strings_in(item, depth + 1)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            yield from _strings_in(item, depth + 1)


# --------------------------------------------------------------------------------------------
# The workers' kept state


def _namespace_key(key: str, org: str, namespace: str) -> bool:
    """Whether a mapping key is the planner's id of this namespace (JSON ``[org, namespace]``)."""
    if not key.startswith("["):
        return False
    try:
        return json.loads(key) == [org, namespace]
    except ValueError:
        return False


def scrub_user(node: Any, org: str, namespace: str, user_id: str,
               inside: bool = False) -> tuple[Any, int]:
    """``node`` without the user: below a key naming the namespace, every mapping key and
    list element equal to the user id is dropped. Answers the new node and how many went."""
    removed = 0
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if inside and key == user_id:
                removed += 1
                continue
            child, n = scrub_user(value, org, namespace, user_id,
                                  inside or _namespace_key(key, org, namespace))
            out[key] = child
            removed += n
        return out, removed
    if isinstance(node, list):
        items = []
        for value in node:
            if inside and value == user_id:
                removed += 1
                continue
            child, n = scrub_user(value, org, namespace, user_id, inside)
            items.append(child)
            removed += n
        return items, removed
    return node, 0


# --------------------------------------------------------------------------------------------
# The receipt


@dataclass
class Census:
    found: dict[str, int] = field(default_factory=dict)
    checked_at: int = 0

    @property
    def clean(self) -> bool:
        return not any(self.found.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "found": {kind: n for kind, n in self.found.items() if n},
            "checked_at": iso_from_ns(self.checked_at) if self.checked_at else None,
        }


def receipt_of(erasure: str, record: dict[str, str], running: bool) -> dict[str, Any]:
    """The answer of user.erase and erasure.status: counts, census and times, nothing else."""
    status = record.get("status", "")
    if status == "running" and not running:
        status = "interrupted"  # its process died or lost the lock: run the erasure again
    counts = _zero()
    counts.update({k: int(v) for k, v in json.loads(record.get("counts") or "{}").items()
                   if k in counts})

    def time_of(name: str) -> str | None:
        raw = record.get(name)
        return iso_from_ns(int(raw)) if raw else None

    census = json.loads(record["census"]) if record.get("census") else None
    return {
        "erasure_id": erasure,
        "status": status,
        "retryable": status in ("failed", "interrupted"),
        "step": record.get("step", ""),
        "attempts": int(record.get("attempts") or 0),
        "started_at": time_of("started_at"),
        "finished_at": time_of("finished_at"),
        "updated_at": time_of("updated_at"),
        "counts": counts,
        "census": census,
        "aof_rewrite": record.get("aof_rewrite", ""),
        "error": record.get("error", ""),
    }


@dataclass
class _Run:
    """One attempt: whom it erases, under which lock, and who watches."""

    org: str
    namespace: str
    user_id: str
    erasure_id: str
    # (handle, digest) of each agent-state subject that is the user.
    subjects: list[tuple[str, str]]
    actor: str
    token: str
    progress: Progress | None

    @property
    def user(self) -> tuple[str, str, str]:
        return (self.org, self.namespace, self.user_id)

    @property
    def marker(self) -> str:
        return keys.user_erasing(*self.user)

    @property
    def record(self) -> str:
        return keys.erasure(self.org, self.namespace, self.erasure_id)

    @property
    def lock(self) -> str:
        return keys.erasure_lock(self.org, self.namespace, self.erasure_id)


class _LockLost(Exception):
    """Another process took over the erasure: stop without writing its outcome."""


# --------------------------------------------------------------------------------------------
# The store


class ErasureStore:
    def __init__(self, services: Services) -> None:
        self.services = services
        self.redis = services.redis
        self.clock = services.clock
        self.settings = services.settings
        self.agent_states = AgentStateStore(services)
        self.audit = AuditLog(services)
        self._drop = self.redis.register_script(_DROP)
        self._add = self.redis.register_script(_ADD)
        self._renew = script(self.redis, "renew_if_held")
        self._release = script(self.redis, "release_if_held")

    # --- naming and reading -------------------------------------------------------------------

    def erasure_id(self, org: str, namespace: str, user_id: str) -> str:
        return erasure_id(self.settings.secret_key, org, namespace, user_id)

    def status(self, org: str, namespace: str, erasure: str) -> dict[str, Any]:
        """The receipt of the user's latest erasure; 404 when there is none."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(keys.erasure(org, namespace, erasure))
        pipe.exists(keys.erasure_lock(org, namespace, erasure))
        record, locked = pipe.execute()
        if not record:
            raise ErasureNotFound("no erasure with this id in this namespace",
                                  erasure_id=erasure)
        return receipt_of(erasure, record, bool(locked))

    def subject_digests(self, org: str, namespace: str, user_id: str,
                        handles: Iterable[str] = ()) -> list[tuple[str, str]]:
        """The agent-state subjects that are the user, as (handle, digest): their user id read
        as a customer handle (when it is a valid one), then each other handle given (422 naming
        ``handles.<i>`` when one is not a handle). Two spellings of one handle count once."""
        found: dict[str, str] = {}
        try:
            found[self.agent_states.subject_digest(org, namespace, user_id)] = user_id
        except ValidationFailed:
            pass  # a user id that is no valid handle names no subject
        for i, handle in enumerate(handles):
            digest = self.agent_states.subject_digest(org, namespace, handle,
                                                      path=f"handles.{i}")
            found.setdefault(digest, handle)
        return [(handle, digest) for digest, handle in found.items()]

    # --- the saga -----------------------------------------------------------------------------

    def erase(
        self,
        org: str,
        namespace: str,
        user_id: str,
        *,
        actor: str,
        handles: Iterable[str] = (),
        progress: Progress | None = None,
    ) -> dict[str, Any]:
        """Run (or resume) the user's erasure; answers its receipt."""
        handles = list(handles)
        subjects = self.subject_digests(org, namespace, user_id, handles)
        erasure = self.erasure_id(org, namespace, user_id)
        run = _Run(org, namespace, user_id, erasure, subjects, actor, secrets.token_hex(16),
                   progress if progress is not None else PROGRESS.get())
        if not self.redis.set(run.lock, run.token, nx=True, px=LOCK_TTL_MS):
            raise ErasureRunning(
                "this user's erasure is running in another process; ask erasure.status",
                erasure_id=erasure, retry_after=5,
            )
        try:
            self._begin(run)
            try:
                for step in STEPS[:-1]:
                    getattr(self, f"_step_{step}")(run)
                    self._step_done(run, step)
                census = self._census(run)
                self._step_done(run, "census")
            except _LockLost:
                raise ErasureRunning(
                    "another process took this erasure over; ask erasure.status",
                    erasure_id=erasure, retry_after=5,
                ) from None
            except Exception as error:
                self._fail(run, getattr(error, "code", type(error).__name__), None)
                raise
            if not census.clean:
                self._fail(run, "CENSUS_FOUND_DATA", census)
            else:
                self._finish(run, census)
            return self.status(org, namespace, erasure)
        finally:
            self._release(keys=[run.lock], args=[run.token])

    def _begin(self, run: _Run) -> None:
        now = self.clock.now_ns()
        record = self.redis.hgetall(run.record)
        if not record or record.get("status") == "done":
            # A new erasure (the first, or one of a user who wrote again since the last).
            self.redis.delete(run.record)
            self.redis.hset(run.record, mapping={
                "status": "running", "step": "", "attempts": 1, "started_at": now,
                "updated_at": now, "counts": json.dumps(_zero()), "census": "",
                "finished_at": "", "aof_rewrite": "", "error": "",
            })
        else:
            # A retry: the marker kept the earlier attempts' counts. Without it (removed by
            # hand), start from the counts the record copied at the last finished step.
            self.redis.hset(run.record, mapping={
                "status": "running", "attempts": int(record.get("attempts") or 0) + 1,
                "updated_at": now, "error": "", "finished_at": "",
            })
            if not self.redis.exists(run.marker):
                saved = json.loads(record.get("counts") or "{}")
                self.redis.hset(run.marker, mapping={
                    kind: int(n) for kind, n in saved.items() if kind in KINDS and int(n)
                } or {"since": now})
        self.redis.hsetnx(run.marker, "since", now)
        for _handle, digest in run.subjects:
            self.redis.set(keys.agent_state_subject_erasing(run.org, run.namespace, digest), now)
        # Remembered so that the end of a retry given other handles lifts every marker set.
        marked = set(json.loads(self.redis.hget(run.record, "subjects_marked") or "[]"))
        marked.update(digest for _handle, digest in run.subjects)
        self.redis.hset(run.record, "subjects_marked", json.dumps(sorted(marked)))

    def _counts(self, run: _Run) -> dict[str, int]:
        counts = _zero()
        for kind, value in self.redis.hgetall(run.marker).items():
            if kind in counts:
                counts[kind] = int(value)
        return counts

    def _renew_lock(self, run: _Run) -> None:
        if not self._renew(keys=[run.lock], args=[run.token, LOCK_TTL_MS]):
            raise _LockLost()

    def _step_done(self, run: _Run, step: str) -> None:
        self._renew_lock(run)
        counts = self._counts(run)
        self.redis.hset(run.record, mapping={
            "step": step, "updated_at": self.clock.now_ns(), "counts": json.dumps(counts),
        })
        if run.progress is not None:
            run.progress(step, counts)

    def _drop_keys(self, run: _Run, found: Iterable[str]) -> None:
        """Delete keys of the user's slot, counting what they held on the marker."""
        for batch in batches((k for k in found if k != run.marker), BATCH):
            reply = self._drop(keys=[run.marker, *batch],
                               args=[*(kind_of(k) for k in batch), PROFILE_KEY])
            if reply and reply[0] == "NOMARK":
                raise _LockLost()  # the erasure finished elsewhere meanwhile
            self._renew_lock(run)

    def _count(self, run: _Run, **counts: int) -> None:
        pairs = [item for kind, n in counts.items() if n for item in (kind, n)]
        if pairs:
            self._add(keys=[run.marker], args=pairs)

    # --- steps ----------------------------------------------------------------------------------

    def _step_mark(self, run: _Run) -> None:
        """Done by ``_begin`` (the marker exists from then on); kept as a step for progress."""

    def _step_memory(self, run: _Run) -> None:
        user = run.user
        # Pointers first: the id index still lists every row's memory_id until it is dropped.
        removed = 0
        ids = (mid for mid, _ in self.redis.hscan_iter(keys.memory_ids(*user), count=500))
        for batch in batches(ids, BATCH):
            pointers = [keys.memory_pointer(run.org, run.namespace, mid) for mid in batch]
            values = self.redis.mget(pointers)
            doomed = [p for p, v in zip(pointers, values, strict=True)
                      if _pointer_user(v) == run.user_id]
            if doomed:
                removed += self.redis.delete(*doomed)
        self._count(run, index_entries=removed)
        rows_key = keys.memory_keys(*user)
        # The names the user's rows had, whose namespace label and agent indexes list the user.
        names: set[str] = set()
        writers: set[str] = set()
        after = "-"
        while True:
            members = self.redis.zrangebylex(rows_key, after, "+", start=0, num=BATCH)
            if not members:
                break
            found = []
            for member in members:
                key, agent, session_id = member.split("\x00")
                names.add(key)
                writers.add(agent)
                parts = (*user, agent, session_id, key)
                found += [keys.memory_row(*parts), keys.memory_versions(*parts),
                          keys.memory_version_order(*parts)]
            self._drop_keys(run, found)
            after = "(" + members[-1]
        self._drop_keys(run, [
            rows_key,
            keys.memory_ids(*user),
            keys.profile_sections(*user),
            keys.memory_live(*user),
            keys.profile_sources(*user),
            keys.profile_source_digest(*user),
            keys.profile_source_expiry(*user),
            keys.structured_meta(*user),
        ])
        self._count(run, index_entries=self._remove_namespace_entries(run, names, writers))

    def _remove_namespace_entries(self, run: _Run, labels: set[str], agents: set[str]) -> int:
        """The user's entries in the memory plane's namespace indexes (changed users, users
        with sections, users with a structured profile, users per section label and per
        section writer); the sweep finds any other plane's, and any an earlier try lost."""
        org, namespace, user_id = run.user
        indexes = [
            keys.profile_users(org, namespace),
            keys.structured_users(org, namespace),
            *(keys.profile_label_users(org, namespace, label) for label in sorted(labels)),
            *(keys.profile_agent_users(org, namespace, agent) for agent in sorted(agents)),
        ]
        removed = self.redis.zrem(keys.profile_changed_users(org, namespace), user_id)
        for batch in batches(indexes, BATCH):
            pipe = self.redis.pipeline(transaction=False)
            for index in batch:
                pipe.srem(index, user_id)
            removed += sum(pipe.execute())
        return removed

    def _namespace_sets(self, run: _Run, *, remove: bool) -> int:
        """The user as a member of any set or sorted set of the namespace's slot: the user
        indexes of every plane, including ones this module does not name (a worker's change
        list, say). Removed, or only counted. Hashes are left alone: a user id may equal a
        field name (``features``) that is no user at all."""
        org, namespace, user_id = run.user
        pattern = "*" + keys.glob_escape(keys.namespace_tag(org, namespace)) + "*"
        total = 0
        for kind in ("set", "zset"):
            for batch in batches(self.redis.scan_iter(match=pattern, count=1000, _type=kind),
                                 BATCH):
                pipe = self.redis.pipeline(transaction=False)
                for key in batch:
                    if kind == "set" and remove:
                        pipe.srem(key, user_id)
                    elif kind == "set":
                        pipe.sismember(key, user_id)
                    elif remove:
                        pipe.zrem(key, user_id)
                    else:
                        pipe.zscore(key, user_id)
                total += sum(1 for hit in pipe.execute() if _hit(hit))
        return total

    def _step_working_memory(self, run: _Run) -> None:
        index = keys.working_memory_scopes(*run.user)
        scopes = sorted(self.redis.smembers(index))
        self._drop_keys(run, [*scopes, index])

    def _step_activity(self, run: _Run) -> None:
        self._drop_keys(run, [keys.profile_reads(*run.user), keys.profile_reads_meta(*run.user)])

    def _step_agent_state(self, run: _Run) -> None:
        erased = 0
        for handle, _digest in run.subjects:
            erased += self.agent_states.erase_subject(run.org, run.namespace, handle)
        self._count(run, agent_states=erased)

    def _step_jobs(self, run: _Run) -> None:
        deleted = 0
        for job, running in self._jobs_about(run):
            if running:
                continue  # deleting a running job's hash under its worker: the census waits
            self._delete_job(job)
            deleted += 1
        self._count(run, jobs=deleted)

    def _step_tokens(self, run: _Run) -> None:
        revoked = self.services.store(TokenStore).revoke_pinned_to(
            run.org, run.namespace, run.user_id, f"erased:{run.erasure_id}")
        self._count(run, tokens=revoked)

    def _step_worker_state(self, run: _Run) -> None:
        self._count(run, index_entries=self._worker_state(run, remove=True))

    def _step_sweep(self, run: _Run) -> None:
        self._drop_keys(run, list(self._user_keys(run)))
        pointers = self._pointers_naming(run)
        removed = self.redis.delete(*pointers) if pointers else 0
        removed += self._namespace_sets(run, remove=True)
        self._count(run, index_entries=removed)

    # --- the census -----------------------------------------------------------------------------

    def _census(self, run: _Run) -> Census:
        found = _zero()
        for key in self._user_keys(run):
            found[_CENSUS_KIND[kind_of(key)]] += 1
        found["index_entries"] += len(self._pointers_naming(run))
        found["index_entries"] += self._namespace_sets(run, remove=False)
        states, entries = self._agent_state_left(run)
        found["agent_states"] += states
        found["index_entries"] += entries
        found["jobs"] += sum(1 for _job in self._jobs_about(run))
        found["tokens"] += len(self.services.store(TokenStore).pinned_to(
            run.org, run.namespace, run.user_id))
        found["index_entries"] += self._worker_state(run, remove=False)
        return Census(found, self.clock.now_ns())

    def _user_keys(self, run: _Run) -> Iterator[str]:
        for key in self.redis.scan_iter(match=keys.user_pattern(*run.user), count=1000):
            if key != run.marker:
                yield key

    def _pointers_naming(self, run: _Run) -> list[str]:
        """The namespace's memory_id pointers whose value names the user (a full scan of the
        namespace's pointers: what the user's own indexes may have lost)."""
        found = []
        pattern = keys.memory_pointer_pattern(run.org, run.namespace)
        for batch in batches(self.redis.scan_iter(match=pattern, count=1000), 500):
            values = self.redis.mget(batch)
            found += [k for k, v in zip(batch, values, strict=True)
                      if _pointer_user(v) == run.user_id]
        return found

    def _agent_state_left(self, run: _Run) -> tuple[int, int]:
        """States still naming one of the user's subjects (found as the agent-state plane finds
        them: the subject's index and the subject scope's agents), and index entries left."""
        org, namespace = run.org, run.namespace
        states = entries = 0
        for _handle, digest in run.subjects:
            pipe = self.redis.pipeline(transaction=False)
            pipe.zrange(keys.agent_state_subject(org, namespace, digest), 0, -1)
            pipe.hkeys(keys.agent_state_agents(org, namespace, digest))
            pipe.zscore(keys.agent_state_subjects(org, namespace), digest)
            indexed, agents, listed = pipe.execute()
            candidates = list(dict.fromkeys(
                [*indexed, *(keys.agent_state(org, namespace, digest, a) for a in agents)]))
            pipe = self.redis.pipeline(transaction=False)
            for key in candidates:
                pipe.hget(key, "subject")
            states += sum(1 for subject in (pipe.execute() if candidates else [])
                          if subject == digest)
            entries += len(indexed) + len(agents) + (1 if listed is not None else 0)
        return states, entries

    # --- RQ jobs --------------------------------------------------------------------------------

    def _jobs_about(self, run: _Run) -> Iterator[tuple[Job, bool]]:
        """Every RQ job whose arguments name (org, namespace, user_id), and whether it runs.

        Scans every job hash rather than the queues: a job is found whatever queue or registry
        holds it, and one left in no registry too.
        """
        from rq.job import Job, JobStatus

        connection = self.services.queue_redis
        ids = []
        for raw in connection.scan_iter(match=_RQ_JOB_PREFIX + "*", count=1000):
            rest = _text(raw)[len(_RQ_JOB_PREFIX):]
            if rest and ":" not in rest:  # not rq:job:<id>:dependents and the like
                ids.append(rest)
        for batch in batches(ids, BATCH):
            try:
                jobs = Job.fetch_many(batch, connection=connection)
            except Exception:  # one unreadable hash: read them one by one
                jobs = [self._fetch_job(job_id) for job_id in batch]
            for job in jobs:
                if job is not None and self._job_names(job, run):
                    yield job, job.get_status(refresh=False) == JobStatus.STARTED

    def _fetch_job(self, job_id: str) -> Job | None:
        from rq.job import Job

        try:
            return Job.fetch(job_id, connection=self.services.queue_redis)
        except Exception:  # gone, or not a job hash
            return None

    @staticmethod
    def _job_names(job: Job, run: _Run) -> bool:
        wanted = {run.org, run.namespace, run.user_id}
        try:
            strings = set(_strings_in(list(job.args))) | set(_strings_in(dict(job.kwargs)))
        except Exception:  # undecodable payload: judge by its description
            description = job.description or ""
            return all(repr(text) in description for text in wanted)
        return wanted <= strings

    def _delete_job(self, job: Job) -> None:
        from rq import Queue

        connection = self.services.queue_redis
        job.delete(remove_from_queue=True)
        pipe = connection.pipeline(transaction=False)
        if job.origin:
            queue = Queue(job.origin, connection=connection)
            for registry in (queue.failed_job_registry, queue.finished_job_registry,
                             queue.deferred_job_registry, queue.scheduled_job_registry,
                             queue.canceled_job_registry):
                pipe.zrem(registry.key, job.id)
        pipe.zrem(_RQ_SCHEDULER_JOBS, job.id)
        pipe.execute()

    # --- the workers' kept state ----------------------------------------------------------------

    def _worker_state(self, run: _Run, *, remove: bool) -> int:
        total = 0
        for key in self.redis.scan_iter(match=keys.worker_state_pattern(), count=100):
            total += self._scrub_worker_state(key, run, remove)
        return total

    def _scrub_worker_state(self, key: str, run: _Run, remove: bool) -> int:
        while True:
            with self.redis.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(key)
                    if pipe.type(key) != "hash":
                        return 0
                    changes: dict[str, str] = {}
                    found = 0
                    for name, text in pipe.hgetall(key).items():
                        try:
                            document = json.loads(text)
                        except ValueError:
                            continue
                        scrubbed, n = scrub_user(document, *run.user)
                        if n:
                            found += n
                            changes[name] = json.dumps(scrubbed, sort_keys=True,
                                                       separators=(",", ":"))
                    if not remove or not changes:
                        return found
                    pipe.multi()
                    pipe.hset(key, mapping=changes)
                    pipe.execute()
                    return found
                except WatchError:
                    # The worker saved its state meanwhile: read it again and scrub that.
                    continue

    # --- the end --------------------------------------------------------------------------------

    def _fail(self, run: _Run, error: str, census: Census | None) -> None:
        now = self.clock.now_ns()
        counts = self._counts(run)
        mapping: dict[str, Any] = {"status": "failed", "error": error, "updated_at": now,
                                   "counts": json.dumps(counts)}
        if census is not None:
            mapping["census"] = json.dumps(census.as_dict())
        self.redis.hset(run.record, mapping=mapping)
        self.audit.record(run.org, run.namespace, run.actor, "user.erase", status="failed",
                          counts=counts)

    def _finish(self, run: _Run, census: Census) -> None:
        self._renew_lock(run)
        counts = self._counts(run)
        now = self.clock.now_ns()
        # The receipt first, then the marker: a crash between the two leaves a done receipt and
        # writes still refused, and running the erasure again clears the marker.
        self.redis.hset(run.record, mapping={
            "status": "done", "step": "census", "counts": json.dumps(counts),
            "census": json.dumps(census.as_dict()), "finished_at": now, "updated_at": now,
            "error": "",
        })
        self.redis.delete(run.marker)
        marked = json.loads(self.redis.hget(run.record, "subjects_marked") or "[]")
        for digest in marked:
            self.redis.delete(keys.agent_state_subject_erasing(run.org, run.namespace, digest))
        self.redis.hdel(run.record, "subjects_marked")
        self.audit.record(run.org, run.namespace, run.actor, "user.erase", status="done",
                          counts=counts)
        self.redis.hset(run.record, "aof_rewrite", self._rewrite_aof())

    def _rewrite_aof(self) -> str:
        """BGREWRITEAOF on the data plane (and the queue's Redis when it is another server),
        so the erased data also leaves the append-only file; off unless
        LOOM_ERASURE_REWRITE_AOF is set."""
        if not self.settings.erasure_rewrite_aof:
            return "off"
        outcomes = [_bgrewriteaof(self.redis)]
        if self.settings.queue_url and self.settings.queue_url != self.settings.redis_url:
            outcomes.append(_bgrewriteaof(self.services.queue_redis))
        return "scheduled" if all(outcomes) else "failed"

    # --- the data package -----------------------------------------------------------------------

    def export(
        self,
        org: str,
        namespace: str,
        user_id: str,
        *,
        handles: Iterable[str] = (),
        progress: Progress | None = None,
    ) -> dict[str, Any]:
        """The user's data package (seed 002: "the subject's data package")."""
        progress = progress if progress is not None else PROGRESS.get()
        handles = list(handles)
        user = (org, namespace, user_id)
        facts: list[dict[str, Any]] = []
        sections: list[dict[str, Any]] = []
        structured: dict[str, Any] | None = None
        for row, versions in self._rows_with_versions(*user):
            entry = {**row.as_answer(), "versions": [v.as_answer() for v in versions]}
            if row.memory_type == PROFILE_TYPE and row.key == PROFILE_KEY and (
                row.agent == "-" and row.session_id == "-"
            ):
                structured = entry
            elif row.memory_type == PROFILE_TYPE:
                sections.append(entry)
            else:
                facts.append(entry)
        if progress is not None:
            progress("memory", {"memory_rows": len(facts), "profile_sections": len(sections),
                                "structured_profiles": int(structured is not None)})
        working = self._working_memory(*user)
        if progress is not None:
            progress("working_memory", {"working_memory_blocks": sum(
                len(scope["blocks"]) for scope in working)})
        states: list[dict[str, Any]] = []
        for handle, _digest in self.subject_digests(org, namespace, user_id, handles):
            states += self.agent_states.export_subject(org, namespace, handle)
        if progress is not None:
            progress("agent_state", {"agent_states": len(states)})
        readers = self.services.store(ActivityStore).readers(
            Identity(org, namespace, "-", user_id), RETENTION_DAYS, limit=1000
        )
        return {
            "format": EXPORT_FORMAT,
            "org": org,
            "namespace": namespace,
            "user_id": user_id,
            "exported_at": iso_from_ns(self.clock.now_ns()),
            "memory_rows": facts,
            "profile_sections": sections,
            "structured_profile": structured,
            "working_memory": working,
            "agent_states": states,
            "profile_reads": [reader.as_answer() for reader in readers],
            "counts": {
                "memory_rows": len(facts),
                "memory_versions": sum(len(e["versions"]) for e in
                                       [*facts, *sections, *([structured] if structured else [])]),
                "profile_sections": len(sections),
                "structured_profiles": int(structured is not None),
                "working_memory_blocks": sum(len(scope["blocks"]) for scope in working),
                "agent_states": len(states),
                "activity_entries": len(readers),
            },
        }

    def _rows_with_versions(
        self, org: str, namespace: str, user_id: str
    ) -> Iterator[tuple[MemoryRow, list[MemoryRow]]]:
        """Every stored row of the user (tombstones too), each with its versions oldest first."""
        user = (org, namespace, user_id)
        after = "-"
        while True:
            members = self.redis.zrangebylex(keys.memory_keys(*user), after, "+", start=0,
                                             num=BATCH)
            if not members:
                return
            pipe = self.redis.pipeline(transaction=False)
            for member in members:
                key, agent, session_id = member.split("\x00")
                parts = (*user, agent, session_id, key)
                pipe.hgetall(keys.memory_row(*parts))
                pipe.hgetall(keys.memory_versions(*parts))
            replies = pipe.execute()
            for i in range(len(members)):
                row, versions = replies[2 * i], replies[2 * i + 1]
                if not row:
                    continue
                yield MemoryRow.from_fields(row), [
                    MemoryRow.from_fields(json.loads(versions[padded]))
                    for padded in sorted(versions)
                ]
            after = "(" + members[-1]

    def _working_memory(self, org: str, namespace: str, user_id: str) -> list[dict[str, Any]]:
        scope_keys = sorted(self.redis.smembers(keys.working_memory_scopes(org, namespace,
                                                                           user_id)))
        if not scope_keys:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for key in scope_keys:
            pipe.hgetall(key)
        scopes = []
        for key, raw in zip(scope_keys, pipe.execute(), strict=True):
            if not raw:
                continue
            agent, session_id, run_id = _scope_parts(key)
            blocks = sorted((decode_block(k, v) for k, v in raw.items()),
                            key=lambda block: block.block_key)
            scopes.append({"agent": agent, "session_id": session_id, "run_id": run_id,
                           "blocks": [block.as_answer() for block in blocks]})
        return scopes


def _scope_parts(scope_key: str) -> tuple[str, str, str]:
    """(agent, session_id, run_id) of a working-memory scope key (``keys.working_memory_scope``:
    the tag, then the three escaped components)."""
    tail = scope_key.split("}:", 1)[1]
    agent, session_id, run_id = tail.split(":")
    # keys.escape turns only '%', '{', '}', '/' and ':' into %XX, '%' included: unquote undoes it.
    return unquote(agent), unquote(session_id), unquote(run_id)


def _bgrewriteaof(client: Any) -> bool:
    """Ask for a rewrite. One already running was forked before the erasure and would keep the
    erased data: wait for it to end, then ask again."""
    deadline = time.monotonic() + AOF_WAIT_SECONDS
    while True:
        try:
            client.bgrewriteaof()
            return True
        except ResponseError as error:
            if "already in progress" not in str(error) or time.monotonic() > deadline:
                return False
            time.sleep(0.2)


