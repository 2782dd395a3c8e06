"""Typed agent state (seed 002) in Redis: one hash per (scope, agent), its indexes and its sweep.

A state is named by its scope (kind and canonical id) and its agent. The scope id is never
stored: keys and index entries carry only its HMAC under the install's secret
(``app.scope_ids``), and so does the ``subject`` a state names. The state's hash holds:

``etag``        a random token changed by every write: the compare-and-set token of the script
``version``     1 at the first stored write, +1 per stored write
``body``        the state as canonical JSON (compact, key-sorted, non-ASCII kept); the cap is on
                the UTF-8 bytes of this text
``written``     JSON ``{field: ns}``: each field's own last write, for field retention
``created_at`` / ``updated_at`` (ns), ``expires_at`` (ms), ``type``, ``kind``, ``agent``,
``scope`` (the scope digest), ``subject`` (the subject digest or ``""``), ``size`` (bytes)

Writes: one pipelined read of the namespace config and the state, the merge, masking and cap
computed in Python, then one pipelined write whose Lua script applies the new hash only if the
``etag`` is the one read. On a mismatch the script answers the current hash, so a merge_by_key
retries with no extra read (two round trips per attempt; sub-agents merging different fields
never lose one; on a Redis Cluster the namespace-slot index writes go first as one cluster
pipeline, then the script alone in the scope's slot); a cas or an ``if_version`` write
re-checks the version and answers 412 when it moved. The key carries ``PEXPIREAT`` at the
last write + the type's ``retention.state``, so an expired state vanishes even without the
sweep; field retention is checked on every read and write from ``written``.

Indexes (all entries are keys or digests, never raw ids):

- per scope, a hash agent -> expiry (same slot as the states, written by the script): erasing
  a scope finds every agent's state without a SCAN;
- per subject digest, a sorted set state key -> expiry (console view, erasure, data package);
- per namespace, a sorted set state key -> expiry, and a sorted set of subject digests: the
  sweep's work lists.

Index entries are written before the state (so a live state is always indexed) with
``ZADD GT``, and the sweep removes only entries whose score has passed, so a sweep racing a
write can never drop a live state's entry. An index entry is a candidate: every reader checks
the state it points to (existing, naming that subject, not expired).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import redis
from redis.exceptions import NoScriptError

from app.clock import iso_from_ns
from app.errors import (
    AgentStateConflict,
    AuthInsufficient,
    FeatureDisabled,
    LoomError,
    ValidationFailed,
    WriteContended,
)
from app.object_types import (
    DEFAULT_RETENTION_DAYS,
    ObjectType,
    check_declared,
    check_values,
    is_delete_marker,
    state_type_for,
)
from app.pii import mask_value
from app.scope_ids import canonical_scope_id, scope_digest, subject_digest
from app.store import keys
from app.store.batching import batches, pairs
from app.store.idempotency import HeldKey, KeyedScript
from app.store.lua import LEASE_LOST, STATUS_ERRORS, raise_for_status, script
from app.store.namespace_config import AUDIT_MAX_ENTRIES, NamespaceConfig, NamespaceConfigStore
from app.store.script_interfaces import (
    AGENT_STATE_DELETE_IF,
    AGENT_STATE_ERASE,
    AGENT_STATE_UNINDEX,
    AGENT_STATE_WRITE,
)

if TYPE_CHECKING:
    from app.store.services import StoreServices

DAY_NS = 86_400 * 10**9
DAY_MS = 86_400 * 1000
# A merge retries while other writers keep winning; past this many attempts the store gives up
# (409 WRITE_CONFLICT) rather than hold a web worker.
MAX_ATTEMPTS = 64
SWEEP_BATCH = 500

NOT_DECLARED_FIELD = "not_declared_field"
ERASE_ACTION = "agent_state.erase"  # the audit entry's action
OVER_CAP = "over_cap"


def canonical_body(body: Mapping[str, Any]) -> str:
    """The stored text of a state body: compact, key-sorted, non-ASCII kept, finite numbers."""
    try:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"), sort_keys=True,
                          allow_nan=False)
    except ValueError:
        raise ValidationFailed({"body": ["numbers must be finite"]}) from None


@dataclass(frozen=True)
class LiveState:
    """What a state is now: its stored hash read through retention.

    ``etag`` is the raw compare-and-set token even when the state reads as expired (``version``
    0): the next write must replace exactly what is stored.
    """

    etag: str = ""
    version: int = 0
    body: dict[str, Any] = field(default_factory=dict)
    written: dict[str, int] = field(default_factory=dict)
    created_at: int | None = None
    updated_at: int | None = None
    type_name: str = ""
    kind: str = ""
    agent: str = ""
    subject: str = ""
    size: int = 0
    # Fields present in Redis but past their retention (dropped from ``body``).
    expired_fields: tuple[str, ...] = ()

    @property
    def exists(self) -> bool:
        return self.version > 0


@dataclass(frozen=True)
class PutResult:
    stored: bool
    version: int
    reason: str | None = None

    def as_answer(self) -> dict[str, Any]:
        return {"stored": self.stored, "version": self.version,
                "version_text": str(self.version), "reason": self.reason}


def _retention_type(
    config: NamespaceConfig, type_name: str | None, agent: str
) -> ObjectType | None:
    """The type whose retention applies to a stored state: the one it was written under, else
    the agent's current one (a type renamed or removed since falls back to the defaults)."""
    return config.type_named(type_name) or state_type_for(config.types, agent)


def live_state(raw: Mapping[str, str], now: int, object_type: ObjectType | None) -> LiveState:
    """Read a stored hash through retention: an expired state is empty at version 0 and an
    expired field is never served."""
    if not raw:
        return LiveState()
    etag = raw.get("etag", "")
    updated_at = int(raw["updated_at"])
    state_days = object_type.retention_days if object_type else DEFAULT_RETENTION_DAYS
    # Past the current type's retention, or past the expiry Redis was given at the last write
    # (a retention made longer since cannot revive a state Redis is about to drop).
    if now >= updated_at + state_days * DAY_NS or now // 1_000_000 >= int(raw["expires_at"]):
        return LiveState(etag=etag)
    body: dict[str, Any] = json.loads(raw["body"])
    written: dict[str, int] = {k: int(v) for k, v in json.loads(raw["written"]).items()}
    expired = []
    for name in list(body):
        days = object_type.retention_for(name) if object_type else state_days
        if now >= written.get(name, updated_at) + days * DAY_NS:
            expired.append(name)
            del body[name]
            written.pop(name, None)
    return LiveState(
        etag=etag,
        version=int(raw["version"]),
        body=body,
        written=written,
        created_at=int(raw["created_at"]),
        updated_at=updated_at,
        type_name=raw.get("type", ""),
        kind=raw.get("kind", ""),
        agent=raw.get("agent", ""),
        subject=raw.get("subject", ""),
        size=int(raw.get("size", 0)),
        expired_fields=tuple(expired),
    )


class AgentStateStore:
    def __init__(self, services: StoreServices) -> None:
        self.redis = services.redis
        self.clock = services.clock
        self.secret = services.settings.secret_key.encode("utf-8")
        # Built directly: services.store() holds its lock while building this store.
        self.config = NamespaceConfigStore(services)
        self._write = KeyedScript(self.redis, "agent_state_write", "agent_state")
        self._delete_if = script(self.redis, "agent_state_delete_if")
        self._erase = KeyedScript(self.redis, "agent_state_erase", "agent_state")
        self._unindex = script(self.redis, "agent_state_unindex")
        # A cluster pipeline runs no scripts (and its batches go to several primaries): each
        # script is then its own call, in the one slot its keys share.
        self._clustered = isinstance(self.redis, redis.RedisCluster)

    # --- naming ---------------------------------------------------------------------------------

    def scope_digest(self, org: str, namespace: str, kind: str, canonical_id: str) -> str:
        return scope_digest(self.secret, org, namespace, kind, canonical_id)

    def subject_digest(self, org: str, namespace: str, handle: Any, path: str = "subject") -> str:
        return subject_digest(self.secret, org, namespace, handle, path)

    # --- reads ----------------------------------------------------------------------------------

    def _read(
        self, org: str, namespace: str, state_key: str, erasing_marker: str | None = None
    ) -> tuple[NamespaceConfig, dict[str, str]]:
        """The namespace config and one state's raw hash, in one round trip; with a subject's
        erasure marker, refuses (409) while that subject's erasure runs."""
        pipe = self.redis.pipeline(transaction=False)
        self.config.queue_read(pipe, org, namespace)
        pipe.hgetall(state_key)
        if erasing_marker is not None:
            pipe.exists(erasing_marker)
        config_reply, raw, *erasing = pipe.execute()
        if erasing and erasing[0]:
            raise _being_erased()
        return self.config.decode(config_reply), raw

    @staticmethod
    def _require_feature(config: NamespaceConfig) -> None:
        if not config.features.agent_state:
            raise FeatureDisabled(
                "agent state is off in this namespace; an admin turns it on with features.set",
                feature="agent_state",
            )

    def read(
        self, org: str, namespace: str, agent: str, kind: str, canonical_id: str,
        reach: str | None = None,
    ) -> LiveState:
        """One state; with ``reach`` (a subject digest: the caller's pinned user), a state
        about anyone else is refused."""
        digest = self.scope_digest(org, namespace, kind, canonical_id)
        if reach is not None and kind == "subject" and digest != reach:
            raise _outside_reach()
        config, raw = self._read(org, namespace, keys.agent_state(org, namespace, digest, agent))
        self._require_feature(config)
        state = live_state(
            raw, self.clock.now_ns(), _retention_type(config, raw.get("type"), agent)
        )
        if reach is not None and state.exists and state.subject != reach:
            raise _outside_reach()
        return state

    # --- the write ------------------------------------------------------------------------------

    def put(
        self,
        org: str,
        namespace: str,
        agent: str,
        kind: str,
        canonical_id: str,
        *,
        mode: str,
        if_version: int | None,
        body: Mapping[str, Any],
        subject: str | None = None,
        reach: str | None = None,
        held: HeldKey | None = None,
    ) -> PutResult:
        """One write. Check order (seed 002): version (412), declared fields (stored: false,
        not_declared_field), cap (stored: false, over_cap). Malformed input is a 422 first.
        With ``held`` (a call's Idempotency-Key, in the scope's slot) the write script keeps
        its reply as the key's answer in its own step (``written_of`` reads it back).

        With ``reach`` (the subject digest of the caller's pinned user), the write must be
        about that user: their subject scope, or a state naming them (left out, ``subject``
        is theirs), and never a stored state about anyone else."""
        digest = self.scope_digest(org, namespace, kind, canonical_id)
        named_subject = self._named_subject(org, namespace, kind, digest, subject)
        if reach is not None:
            if named_subject is None:
                named_subject = reach
            elif named_subject != reach:
                raise _outside_reach()
        state_key = keys.agent_state(org, namespace, digest, agent)
        # A write naming a customer whose erasure runs is refused (409), like the user's
        # memory writes: checked with the read, then again where the write lands.
        marker = (None if named_subject is None
                  else keys.agent_state_subject_erasing(org, namespace, named_subject))
        config, raw = self._read(org, namespace, state_key, marker)
        self._require_feature(config)
        object_type = state_type_for(config.types, agent)
        incoming = self._checked_body(object_type, kind, mode, if_version, body, config)

        for _attempt in range(MAX_ATTEMPTS):
            now = self.clock.now_ns()
            retention = _retention_type(config, raw.get("type"), agent)
            current = live_state(raw, now, retention)
            if reach is not None and current.exists and current.subject != reach:
                raise _outside_reach()
            if if_version is not None and current.version != if_version:
                raise AgentStateConflict(
                    f"the state is at version {current.version}, not {if_version}",
                    version=current.version,
                    version_text=str(current.version),
                    if_version=if_version,
                    if_version_text=str(if_version),
                )
            if object_type is None or check_declared(object_type, incoming):
                return PutResult(False, current.version, NOT_DECLARED_FIELD)
            new_body, new_written = _apply(mode, current, incoming, now)
            text = canonical_body(new_body)
            size = len(text.encode("utf-8"))
            assert object_type.agent_state is not None  # agent-owned types always carry it
            if size > object_type.agent_state.max_bytes:
                return PutResult(False, current.version, OVER_CAP)
            version = current.version + 1
            expires_ms = now // 1_000_000 + object_type.retention_days * DAY_MS
            state = {
                "etag": secrets.token_hex(8),
                "version": version,
                "body": text,
                "written": json.dumps(new_written, sort_keys=True),
                "created_at": current.created_at if current.created_at is not None else now,
                "updated_at": now,
                "expires_at": expires_ms,
                "type": object_type.name,
                "kind": kind,
                "agent": agent,
                "scope": digest,
                "subject": named_subject if named_subject is not None else current.subject,
                "size": size,
            }
            reply = self._store(org, namespace, digest, agent, current.etag, state,
                                marker if kind == "subject" else None, held)
            if reply[0] == "ERASING":
                self._unindex_entries(org, namespace, [
                    (state_key, str(expires_ms), named_subject or "", True)])
                raise_for_status("agent_state", reply)
            if reply[0] == LEASE_LOST:
                raise_for_status("agent_state", reply)
            if reply[0] == "OK":
                if marker is not None and kind != "subject" and self.redis.exists(marker):
                    # The subject's erasure began between the read and the write, in another
                    # slot than this state's: what was just written names them, so it goes.
                    self._erase_states(org, namespace, self._hashes([state_key]))
                    raise _being_erased()
                return self.written_of(reply)
            # Another write (or the sweep) got in between: start again from what it stored.
            raw = pairs(reply[1])
        raise WriteContended(
            f"the state kept changing under {MAX_ATTEMPTS} attempts; try again",
            retry_after=1,
        )

    @staticmethod
    def written_of(reply: list[Any]) -> PutResult:
        """The answer of a stored write from its script's reply (or the copy an
        Idempotency-Key's record kept): ``{'OK', version}``."""
        return PutResult(True, int(reply[1]))

    def _named_subject(
        self, org: str, namespace: str, kind: str, digest: str, subject: str | None
    ) -> str | None:
        """The subject digest this write names, or None to keep the stored one."""
        if kind == "subject":
            if subject is not None and (
                self.subject_digest(org, namespace, subject) != digest
            ):
                raise ValidationFailed(
                    {"subject": ["a subject-scoped state names its own customer; leave it out"]}
                )
            return digest
        if subject is None:
            return None
        return self.subject_digest(org, namespace, subject)

    @staticmethod
    def _checked_body(
        object_type: ObjectType | None,
        kind: str,
        mode: str,
        if_version: int | None,
        body: Mapping[str, Any],
        config: NamespaceConfig,
    ) -> dict[str, Any]:
        """Validate the request against the type (422s) and mask its pii fields."""
        if mode == "cas" and if_version is None:
            raise ValidationFailed({"if_version": ["cas needs if_version (0: must not exist)"]})
        canonical_body(body)  # finite numbers only
        if object_type is None:
            return dict(body)
        spec = object_type.agent_state
        assert spec is not None
        if mode not in spec.modes:
            raise ValidationFailed(
                {"mode": [f"type {object_type.name} allows only {spec.write}"]}
            )
        if kind != spec.scope:
            raise ValidationFailed(
                {"scope.kind": [f"type {object_type.name} keeps {spec.scope} states"]}
            )
        if mode == "cas":
            deletes = [name for name, value in body.items() if is_delete_marker(value)]
            if deletes:
                raise ValidationFailed(
                    {f"body.{name}": ["$delete is for merge_by_key; cas leaves the field out"]
                     for name in deletes}
                )
        check_values(object_type, body, allow_delete=mode == "merge_by_key")
        pii = object_type.pii_fields
        rules = config.features.pii_rules
        return {
            name: mask_value(value, rules)
            if name in pii and not is_delete_marker(value)
            else value
            for name, value in body.items()
        }

    def _store(
        self,
        org: str,
        namespace: str,
        digest: str,
        agent: str,
        expected_etag: str,
        state: Mapping[str, Any],
        erasing_marker: str | None = None,
        held: HeldKey | None = None,
    ) -> list[Any]:
        """The write round trip: index entries first (a live state is always indexed), then
        the compare-and-set script (which refuses while ``erasing_marker`` exists, and keeps
        its reply as ``held``'s answer in its own step)."""
        state_key = keys.agent_state(org, namespace, digest, agent)
        expires = state["expires_at"]
        script_keys, script_args = AGENT_STATE_WRITE.ordered(
            {"state": state_key, "scope_agents": keys.agent_state_agents(org, namespace, digest),
             "erasing": erasing_marker},
            {"erasing_checked": "" if erasing_marker is None else "1",
             "expected_etag": expected_etag, "expires_ms": expires, "agent": agent},
            more_args=[item for pair in state.items() for item in pair],
        )
        write = self._write.plain
        if held is not None:
            write = self._write.keyed
            script_keys.append(held.redis_key)
            script_args.append(held.holder)
        for _ in range(2):
            pipe = self.redis.pipeline(transaction=False)
            pipe.sadd(keys.agent_state_namespaces(), json.dumps([org, namespace]))
            pipe.zadd(keys.agent_state_expiry(org, namespace), {state_key: expires}, gt=True)
            if state["subject"]:
                pipe.zadd(
                    keys.agent_state_subject(org, namespace, state["subject"]),
                    {state_key: expires},
                    gt=True,
                )
                pipe.zadd(
                    keys.agent_state_subjects(org, namespace), {state["subject"]: expires}, gt=True
                )
            if self._clustered:
                # The namespace-slot index writes first, through the cluster pipeline, then the
                # script in the scope's slot: the same order as on one server.
                pipe.execute()
                reply = write(keys=script_keys, args=script_args)
            else:
                pipe.evalsha(write.sha, len(script_keys), *script_keys, *script_args)
                reply = pipe.execute(raise_on_error=False)[-1]
                if isinstance(reply, NoScriptError):
                    # A restarted or flushed Redis forgot the script: load it and send again
                    # (the index writes are idempotent).
                    write.sha = self.redis.script_load(write.script)
                    continue
                if isinstance(reply, Exception):
                    raise reply
            if held is not None:
                self._write.note(reply, held)
            return list(reply)
        raise RuntimeError("the agent-state write script could not be loaded")

    # --- the subject's states: console view, data package, erasure ------------------------------

    def _subject_states(
        self, org: str, namespace: str, digest: str
    ) -> tuple[NamespaceConfig, list[tuple[str, dict[str, str]]]]:
        """Every stored state naming the subject (as its scope or in ``subject``), raw."""
        pipe = self.redis.pipeline(transaction=False)
        self.config.queue_read(pipe, org, namespace)
        pipe.zrange(keys.agent_state_subject(org, namespace, digest), 0, -1)
        pipe.hkeys(keys.agent_state_agents(org, namespace, digest))
        config_reply, indexed, scope_agents = pipe.execute()
        # The subject-scope states are indexed too; reading the scope's agents as well means a
        # lost index entry can never hide one of them from an erasure.
        candidates = list(
            dict.fromkeys(
                [*indexed, *(keys.agent_state(org, namespace, digest, a) for a in scope_agents)]
            )
        )
        pipe = self.redis.pipeline(transaction=False)
        for key in candidates:
            pipe.hgetall(key)
        found = []
        for key, raw in zip(candidates, pipe.execute() if candidates else [], strict=True):
            if raw and raw.get("subject") == digest:
                found.append((key, raw))
        return self.config.decode(config_reply), found

    def states_of_subject(self, org: str, namespace: str, handle: Any) -> list[dict[str, Any]]:
        """The console's view of a subject's states: sizes, versions and dates, never content
        and never a scope id. Newest first."""
        digest = self.subject_digest(org, namespace, handle, path="profile_id")
        config, found = self._subject_states(org, namespace, digest)
        now = self.clock.now_ns()
        out: list[dict[str, Any]] = []
        for _key, raw in found:
            state = live_state(raw, now, _retention_type(config, raw.get("type"), raw["agent"]))
            if not state.exists:
                continue
            out.append(
                {
                    "scope_kind": state.kind,
                    "agent": state.agent,
                    "type": state.type_name,
                    "size_bytes": state.size,
                    "version": state.version,
                    "version_text": str(state.version),
                    "created_at": iso_from_ns(state.created_at or 0),
                    "updated_at": iso_from_ns(state.updated_at or 0),
                    "_order": state.updated_at,
                }
            )
        out.sort(key=lambda entry: entry.pop("_order"), reverse=True)
        return out

    def export_subject(self, org: str, namespace: str, handle: Any) -> list[dict[str, Any]]:
        """The subject's states for their data package, field by declared field.

        Each state: scope kind, agent, type, version, times, and ``fields``: for every live
        field its value and what the type declares of it (``declared: false`` for a field the
        current type no longer declares: it is still the subject's data).
        """
        digest = self.subject_digest(org, namespace, handle)
        config, found = self._subject_states(org, namespace, digest)
        now = self.clock.now_ns()
        out = []
        for _key, raw in found:
            object_type = _retention_type(config, raw.get("type"), raw["agent"])
            state = live_state(raw, now, object_type)
            if not state.exists:
                continue
            declared = object_type.fields if object_type else {}
            fields: dict[str, Any] = {}
            for name, value in state.body.items():
                spec = declared.get(name)
                fields[name] = {
                    "value": value,
                    "declared": spec is not None,
                    "type": spec.type if spec else None,
                    "pii": spec.pii if spec else False,
                    "sensitivity": spec.sensitivity if spec else None,
                    "written_at": iso_from_ns(state.written.get(name, state.updated_at or 0)),
                }
            out.append(
                {
                    "scope_kind": state.kind,
                    "agent": state.agent,
                    "type": state.type_name,
                    "version": state.version,
                    "version_text": str(state.version),
                    "created_at": iso_from_ns(state.created_at or 0),
                    "updated_at": iso_from_ns(state.updated_at or 0),
                    "fields": fields,
                }
            )
        return out

    def erase_subject(self, org: str, namespace: str, handle_or_user_id: Any) -> int:
        """Delete the subject's scope states and every state naming them; the count deleted."""
        return self.erase_subject_digest(
            org, namespace, self.subject_digest(org, namespace, handle_or_user_id))

    def erase_subject_digest(self, org: str, namespace: str, digest: str) -> int:
        """``erase_subject`` by the subject's keyed digest: what a background erasure keeps in
        place of the handle, which is never stored."""
        _config, found = self._subject_states(org, namespace, digest)
        erased = self._erase_states(org, namespace, found)
        # Entries of states that name another subject since: this subject's index forgets them.
        indexed = cast(list[str], self.redis.zrange(
            keys.agent_state_subject(org, namespace, digest), 0, -1))
        erased_keys = {key for key, _raw in found}
        stale = [key for key in indexed if key not in erased_keys]
        if stale:
            current = self._hashes(stale)
            self._unindex_entries(
                org,
                namespace,
                [(key, raw.get("expires_at", "0"), digest, False) for key, raw in current],
            )
        return erased

    def erase_scope(self, org: str, namespace: str, kind: str, scope_id: Any,
                    held: HeldKey | None = None, actor: str | None = None) -> int:
        """Delete every agent's state of one scope; the count deleted. With ``held`` (a call's
        Idempotency-Key, in the scope's slot) the count is kept as the key's answer in the
        deleting script's step; with ``actor``, the erasure's audit entry (kind and count,
        never the id) is appended in that step too."""
        canonical = canonical_scope_id(kind, scope_id, namespace)
        digest = self.scope_digest(org, namespace, kind, canonical)
        agents = cast(list[str], self.redis.hkeys(keys.agent_state_agents(org, namespace, digest)))
        state_keys = [keys.agent_state(org, namespace, digest, agent) for agent in agents]
        return self._erase_states(org, namespace, self._hashes(state_keys), held,
                                  None if actor is None else (actor, kind))

    def _erase_states(
        self, org: str, namespace: str, found: Iterable[tuple[str, Mapping[str, str]]],
        held: HeldKey | None = None, audited_by: tuple[str, str] | None = None,
    ) -> int:
        """Delete states (one script per scope, atomic with its agents hash), then their index
        entries. With ``audited_by`` (actor, scope kind: the erasure of one scope) the script
        appends the erasure's audit entry in its own step; on a cluster, where the audit list
        (the namespace's slot) is out of its reach, the entry follows as its own step."""
        by_scope: dict[str, list[tuple[str, Mapping[str, str]]]] = {}
        for key, raw in found:
            if raw:
                by_scope.setdefault(raw["scope"], []).append((key, raw))
        if audited_by is not None and len(by_scope) > 1:
            raise ValueError("an audited erasure erases one scope")
        in_step = audited_by is not None and not self._clustered and bool(by_scope)
        head, tail = ("", "")
        if in_step:
            assert audited_by is not None
            actor, kind = audited_by
            head, tail = self.config.audit.parts(actor, ERASE_ACTION, ("erased",),
                                                 scope_kind=kind)
        calls = [
            AGENT_STATE_ERASE.ordered(
                {"scope_agents": keys.agent_state_agents(org, namespace, digest),
                 "audit": keys.namespace_audit(org, namespace) if in_step else None},
                {"audit_head": head, "audit_tail": tail, "audit_max": AUDIT_MAX_ENTRIES},
                more_keys=[key for key, _raw in states],
                more_args=[raw["agent"] for _key, raw in states],
            )
            for digest, states in by_scope.items()
        ]
        erased = self._run_erase(calls, held)
        if audited_by is not None and not in_step:
            # Nothing to erase (the entry is the one write), or a cluster.
            actor, kind = audited_by
            self.config.audit.record(org, namespace, actor, ERASE_ACTION, scope_kind=kind,
                                     erased=erased)
        self._unindex_entries(
            org,
            namespace,
            [
                (key, raw["expires_at"], raw.get("subject", ""), True)
                for states in by_scope.values()
                for key, raw in states
            ],
        )
        return erased

    def _run_erase(self, calls: list[tuple[list[str], list[Any]]],
                   held: HeldKey | None) -> int:
        """Run the erase script's calls (one per scope); the count of states deleted."""
        if not calls:
            return 0
        if held is not None:
            # One scope's erasure answering a key, in that scope's slot.
            [(script_keys, script_args)] = calls
            reply = self._erase(script_keys, script_args, held)
            raise_for_status("agent_state", reply)
            erased = int(reply)
        elif self._clustered:
            # Scopes live in different slots: one script call per scope.
            erased = sum(int(self._erase(keys=k, args=a)) for k, a in calls)
        else:
            pipe = self.redis.pipeline(transaction=False)
            for script_keys, script_args in calls:
                self._erase(script_keys, script_args, client=pipe)
            erased = sum(int(n) for n in pipe.execute())
        return erased

    def _unindex_entries(
        self, org: str, namespace: str, entries: list[tuple[str, str, str, bool]]
    ) -> None:
        if not entries:
            return
        expiry_key = keys.agent_state_expiry(org, namespace)
        subject_indexes: list[str] = []
        fields: list[str] = []
        for key, expires, subject, from_expiry in entries:
            subject_indexes.append(
                keys.agent_state_subject(org, namespace, subject) if subject else expiry_key
            )
            fields += [key, str(expires), subject, "1" if from_expiry else "0"]
        self._unindex(*AGENT_STATE_UNINDEX.ordered(
            {"expiry": expiry_key, "subjects": keys.agent_state_subjects(org, namespace)}, {},
            more_keys=subject_indexes, more_args=fields))

    # --- retention sweep ------------------------------------------------------------------------

    def namespaces(self) -> list[tuple[str, str]]:
        """Every (org, namespace) that ever held agent state."""
        return sorted(tuple(json.loads(m)) for m in self.redis.smembers(
            keys.agent_state_namespaces()
        ))

    def sweep(self, org: str, namespace: str) -> dict[str, int]:
        """Remove expired states and fields of one namespace from Redis, and prune its indexes.

        Safe against concurrent writes: a state or field is removed only through the etag it was
        judged on, and an index entry only once its score (the expiry of the latest write that
        touched it) has passed.
        """
        now = self.clock.now_ns()
        now_ms = now // 1_000_000
        config = self.config.get(org, namespace)
        expiry_key = keys.agent_state_expiry(org, namespace)
        counts = {"states_removed": 0, "fields_removed": 0, "index_entries_removed": 0}

        # 1. States whose last write is past retention. Redis's own expiry has usually removed
        # them already; one still there (a clock ahead of Redis's) goes through its etag.
        due = cast(list[str], self.redis.zrangebyscore(expiry_key, "-inf", now_ms))
        for key, raw in self._hashes(due):
            if not raw:
                continue
            state = live_state(raw, now, _retention_type(config, raw.get("type"), raw["agent"]))
            if not state.exists and self._delete_if(*AGENT_STATE_DELETE_IF.ordered(
                {"state": key,
                 "scope_agents": keys.agent_state_agents(org, namespace, raw["scope"])},
                {"expected_etag": raw["etag"], "agent": raw["agent"]},
            )):
                counts["states_removed"] += 1
        counts["index_entries_removed"] += self.redis.zremrangebyscore(expiry_key, "-inf", now_ms)

        # 2. Fields past their own retention, in states that live on: rewritten without them,
        # version and dates unchanged (what a reader is served does not change).
        for batch in batches((key for key, _score in self.redis.zscan_iter(expiry_key)),
                             SWEEP_BATCH):
            for key, raw in self._hashes(batch):
                if raw:
                    counts["fields_removed"] += self._strip_expired_fields(
                        org, namespace, key, raw, config, now
                    )

        # 3. Subject index entries past their expiry.
        subjects_key = keys.agent_state_subjects(org, namespace)
        subjects = [member for member, _score in self.redis.zscan_iter(subjects_key)]
        for batch in batches(subjects, SWEEP_BATCH):
            pipe = self.redis.pipeline(transaction=False)
            for digest in batch:
                pipe.zremrangebyscore(
                    keys.agent_state_subject(org, namespace, digest), "-inf", now_ms
                )
            counts["index_entries_removed"] += sum(pipe.execute())
        counts["index_entries_removed"] += self.redis.zremrangebyscore(
            subjects_key, "-inf", now_ms
        )
        return counts

    def _hashes(self, state_keys: list[str]) -> list[tuple[str, dict[str, str]]]:
        if not state_keys:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for key in state_keys:
            pipe.hgetall(key)
        return list(zip(state_keys, pipe.execute(), strict=True))

    def _strip_expired_fields(
        self,
        org: str,
        namespace: str,
        key: str,
        raw: dict[str, str],
        config: NamespaceConfig,
        now: int,
    ) -> int:
        state = live_state(raw, now, _retention_type(config, raw.get("type"), raw["agent"]))
        if not state.exists or not state.expired_fields:
            return 0
        text = canonical_body(state.body)
        rewritten = {
            **raw,
            "etag": secrets.token_hex(8),
            "body": text,
            "written": json.dumps(state.written, sort_keys=True),
            "size": len(text.encode("utf-8")),
        }
        reply = self._store(org, namespace, raw["scope"], raw["agent"], raw["etag"], rewritten)
        # A write got in first: it drops the expired fields itself.
        return len(state.expired_fields) if reply[0] == "OK" else 0


def _outside_reach() -> AuthInsufficient:
    return AuthInsufficient("this state is about a customer outside this token's reach",
                            field="scope")


def _being_erased() -> LoomError:
    """The refusal the write script answers ERASING with, raised the same from Python."""
    return STATUS_ERRORS["agent_state"]["ERASING"](["ERASING"], {})


def _apply(
    mode: str, current: LiveState, incoming: Mapping[str, Any], now: int
) -> tuple[dict[str, Any], dict[str, int]]:
    """The new body and per-field write times. cas: the body is the whole state. merge_by_key:
    each named field replaced whole, ``{"$delete": true}`` removes one, the others stay."""
    if mode == "cas":
        return dict(incoming), {name: now for name in incoming}
    body = dict(current.body)
    written = dict(current.written)
    for name, value in incoming.items():
        if is_delete_marker(value):
            body.pop(name, None)
            written.pop(name, None)
        else:
            body[name] = value
            written[name] = now
    return body, written



