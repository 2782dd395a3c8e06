"""Typed agent state from the SDK (seed 002, "Reading"): scopes, read-your-writes, offline writes.

::

    conversation = bot.conversation("c-1")
    state = await conversation.agent_state.get()      # version 0 and {} before the first write
    written = await conversation.agent_state.put({"step": "sizes"})   # merge_by_key by default
    written = await conversation.agent_state.put({"step": "checkout"}, mode="cas",
                                                 if_version=state.version)
    if not written.stored:
        print(written.reason)      # over_cap, not_declared_field, conflict, or pending

(the sync form is the same without ``await``). Every method is written once, as a program
of calls (``loom.calls``), so the async form keeps the same read-your-writes versions,
offline queue and ``conflicts`` as the sync one.

A scope is ``bot.conversation(id)``, ``bot.task(id)``, ``bot.object(type, id)`` (sent as
``"<type>:<id>"``) or ``bot.subject(handle)``; it travels in the body, never in a URL.

What the SDK keeps, per scope and agent, on the ``Agent`` (``bot.agent_state``, one
``AgentStateKeeper``), in memory:

- **Read your writes.** The last version (and body) it wrote or read. A read that answers an
  older version than that is served from what the SDK knows instead, so after ``stored`` at N
  every later ``get`` of the same scope answers N or newer.
- **Out of reach.** A write that meets ``LoomConnectionError`` or ``LoomTimeout`` is queued and
  answered ``stored=False, reason="pending", pending=True``. The queue is sent again, in order
  and with each write's own ``if_version``, at the start of the next ``put`` or ``get`` (any
  scope) or on ``bot.flush()`` / ``agent_state.flush()``. A replayed write Loom refuses with 412
  lands in ``conflicts`` (never merged in silence); one refused otherwise (not stored, or a 4xx)
  lands in ``rejected``. A ``get`` while Loom is out of reach serves the last known state with
  the queued writes of that scope applied over it, marked ``offline=True``.
- **Replay.** With ``Agent(..., replay=True)`` agent state makes no HTTP call at all: every
  scope starts empty, writes apply in the SDK with the server's merge and cas rules (no schema,
  cap or masking), and ``get`` answers what the replay wrote.

A ``put`` that Loom answers with 412 returns ``stored=False, reason="conflict"`` (the seed's
example); ``conflicts`` holds only the replayed writes whose caller had already moved on.
Calls on one ``Agent`` are serialised by a lock (a ``threading.RLock`` in the sync form, an
``asyncio.Lock`` in the async one), so the queue keeps its order across threads or tasks.
The async face that ``async with Agent(...)`` gives shares the sync face's record.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from loom.answers import AgentStatePutAnswer, AgentStateReadAnswer
from loom.calls import Call, Face, M, Program, Runner, runs_locked
from loom.client import op_call
from loom.errors import (
    AgentStateConflict,
    LoomAPIError,
    LoomTransportError,
    RateLimited,
    ServerError,
)

MODES = ("merge_by_key", "cas")
DELETE = {"$delete": True}
CONFLICT = "conflict"
PENDING = "pending"

# (org, namespace, agent, kind, id): what one kept state is named by. org, namespace and agent
# are the Agent's own ("" when a token fixes them), so two Agents never share an entry.
StateKey = tuple[str, str, str, str, str]


@dataclass(frozen=True)
class AgentState:
    """A read: ``body``, ``version``, ``updated_at`` (None before the first write).

    ``offline``: Loom was out of reach; this is the SDK's last known state with the scope's
    queued writes applied. ``pending``: how many writes of this scope wait in the queue.
    ``stale``: Loom answered a version older than one this SDK wrote, whose body the SDK
    could not know (a merge written without the state before it); this is Loom's answer.
    """

    body: dict[str, Any]
    version: int
    updated_at: str | None
    offline: bool = False
    pending: int = 0
    stale: bool = False


@dataclass(frozen=True)
class AgentStateWritten:
    """A write: ``stored``, ``version`` (the state's version after it), ``reason``.

    ``reason`` is None when stored, else ``over_cap``, ``not_declared_field``, ``conflict``
    (412: the version was not ``if_version``) or ``pending`` (queued while Loom is out of
    reach; ``pending`` is True and ``version`` is the last version the SDK knows).
    """

    stored: bool
    version: int
    reason: str | None
    pending: bool = False


@dataclass(frozen=True)
class QueuedWrite:
    """A write kept while Loom was out of reach, sent again as it was."""

    scope: dict[str, str]
    mode: str
    body: dict[str, Any]
    if_version: int | None
    subject: str | None
    queued_at: float
    key: StateKey = field(repr=False)


@dataclass(frozen=True)
class ReplayFailure:
    """A queued write Loom refused when it was sent again.

    ``error`` is the ``loom.errors`` exception (an ``AgentStateConflict`` in ``conflicts``,
    whose ``details["version"]`` is the version Loom holds), or None when Loom answered
    ``stored: false``; ``reason`` is then its reason.
    """

    write: QueuedWrite
    error: LoomAPIError | None
    reason: str | None

    @property
    def scope(self) -> dict[str, str]:
        return self.write.scope

    @property
    def body(self) -> dict[str, Any]:
        return self.write.body

    @property
    def if_version(self) -> int | None:
        return self.write.if_version

    @property
    def mode(self) -> str:
        return self.write.mode


@dataclass
class _Known:
    version: int
    body: dict[str, Any] | None  # None: a version this SDK wrote without knowing its body
    updated_at: str | None


def _now_iso() -> str:
    return datetime.now(tz=UTC).isoformat().replace("+00:00", "Z")


def _is_delete(value: Any) -> bool:
    return isinstance(value, Mapping) and dict(value) == DELETE


def apply_write(body: Mapping[str, Any], mode: str, written: Mapping[str, Any]) -> dict[str, Any]:
    """The state after a write, by the seed's rules: cas replaces the whole body; merge_by_key
    replaces each named field whole and removes one written as ``{"$delete": true}``."""
    if mode == "cas":
        return copy.deepcopy(dict(written))
    merged = copy.deepcopy(dict(body))
    for name, value in written.items():
        if _is_delete(value):
            merged.pop(name, None)
        else:
            merged[name] = copy.deepcopy(value)
    return merged


@dataclass
class KeptState:
    """What the SDK keeps of agent state for one Agent, whichever face (sync or async) acts."""

    known: dict[StateKey, _Known] = field(default_factory=dict)
    queue: list[QueuedWrite] = field(default_factory=list)
    conflicts: list[ReplayFailure] = field(default_factory=list)
    rejected: list[ReplayFailure] = field(default_factory=list)


class AgentStateKeeper(Face[M]):
    """``bot.agent_state``: the SDK's per-Agent record of agent state (see the module doc)."""

    def __init__(
        self, runner: Runner[M], identity: Mapping[str, str], *, replay: bool = False,
        kept: KeptState | None = None,
    ) -> None:
        self._runner = runner
        self._identity = identity
        self.replay = replay
        self.kept = kept if kept is not None else KeptState()
        self._known = self.kept.known
        self._queue = self.kept.queue
        self.conflicts = self.kept.conflicts
        self.rejected = self.kept.rejected

    # --- naming -------------------------------------------------------------------------------

    def key(self, scope: Mapping[str, str]) -> StateKey:
        who = self._identity
        return (who.get("org", ""), who.get("namespace", ""), who.get("agent", ""),
                scope["kind"], scope["id"])

    @property
    def pending(self) -> list[QueuedWrite]:
        """The writes waiting for Loom, oldest first."""
        return list(self._queue)

    def known(self, scope: Mapping[str, str]) -> AgentState | None:
        """What the SDK knows of a scope's state (last written or read), without a call."""
        found = self._known.get(self.key(scope))
        if found is None or found.body is None:
            return None
        return AgentState(copy.deepcopy(found.body), found.version, found.updated_at)

    # --- the calls ----------------------------------------------------------------------------

    @runs_locked
    def get(self, scope: Mapping[str, str], *, timeout: float | None = None) -> Program[AgentState]:
        """A scope's state (see ``AgentState``)."""
        return (yield from self.get_program(scope, timeout))

    @runs_locked
    def put(
        self,
        scope: Mapping[str, str],
        body: Mapping[str, Any],
        *,
        mode: str = "merge_by_key",
        if_version: int | None = None,
        subject: str | None = None,
        timeout: float | None = None,
    ) -> Program[AgentStateWritten]:
        """Write a scope's state (see ``AgentStateWritten``)."""
        return (yield from self.put_program(scope, body, mode, if_version, subject, timeout))

    @runs_locked
    def flush(self, *, timeout: float | None = None) -> Program[int]:
        """Send the queued writes again, in order; answers how many are still queued."""
        return (yield from self.flush_program(timeout))

    # --- the programs (no I/O: they yield calls, see loom.calls) ---------------------------------

    def get_program(self, scope: Mapping[str, str], timeout: float | None) -> Program[AgentState]:
        key = self.key(scope)
        if self.replay:
            return self._local_state(key)
        if self._queue:
            yield from self._flush(timeout)
        if any(write.key == key for write in self._queue):
            return self._offline_state(key)
        try:
            answer: AgentStateReadAnswer = yield op_call(
                "agent_state.read", self._identity, {"scope": dict(scope)}, timeout)
        except LoomTransportError:
            return self._offline_state(key)
        return self._reconcile(key, answer)

    def put_program(
        self, scope: Mapping[str, str], body: Mapping[str, Any], mode: str,
        if_version: int | None, subject: str | None, timeout: float | None,
    ) -> Program[AgentStateWritten]:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if not isinstance(body, Mapping):
            raise TypeError(f"body must be a dict, not {type(body).__name__}")
        write = QueuedWrite(
            scope=dict(scope), mode=mode, body=copy.deepcopy(dict(body)),
            if_version=if_version, subject=subject, queued_at=time.time(),
            key=self.key(scope),
        )
        if self.replay:
            return self._write_locally(write)
        if self._queue:
            yield from self._flush(timeout)
        if self._queue:
            # Loom is still out of reach: this write waits behind the others, in order.
            return self._enqueue(write)
        try:
            answer: AgentStatePutAnswer = yield self._put_call(write, timeout)
        except LoomTransportError:
            return self._enqueue(write)
        except AgentStateConflict as error:
            return AgentStateWritten(False, _held_version(error, write), CONFLICT)
        return self._written(write, answer)

    def flush_program(self, timeout: float | None) -> Program[int]:
        if not self.replay:
            yield from self._flush(timeout)
        return len(self._queue)

    # --- over HTTP ----------------------------------------------------------------------------

    def _put_call(self, write: QueuedWrite, timeout: float | None) -> Call[AgentStatePutAnswer]:
        payload: dict[str, Any] = {"scope": write.scope, "mode": write.mode, "body": write.body}
        if write.if_version is not None:
            payload["if_version"] = write.if_version
        if write.subject is not None:
            payload["subject"] = write.subject
        return op_call("agent_state.put", self._identity, payload, timeout)

    def _flush(self, timeout: float | None) -> Program[None]:
        while self._queue:
            write = self._queue[0]
            try:
                answer: AgentStatePutAnswer = yield self._put_call(write, timeout)
            except (LoomTransportError, RateLimited, ServerError):
                return  # still out of reach (or busy): the rest waits, in order
            except AgentStateConflict as error:
                self.conflicts.append(ReplayFailure(write, error, CONFLICT))
            except LoomAPIError as error:
                self.rejected.append(ReplayFailure(write, error, error.code))
            else:
                result = self._written(write, answer)
                if not result.stored:
                    self.rejected.append(ReplayFailure(write, None, result.reason))
            self._queue.pop(0)

    def _enqueue(self, write: QueuedWrite) -> AgentStateWritten:
        self._queue.append(write)
        known = self._known.get(write.key)
        return AgentStateWritten(False, known.version if known else 0, PENDING, pending=True)

    def _written(self, write: QueuedWrite, answer: Mapping[str, Any]) -> AgentStateWritten:
        stored = bool(answer.get("stored"))
        version = int(answer.get("version") or 0)
        if stored:
            known = self._known.get(write.key)
            if write.mode == "cas":
                body: dict[str, Any] | None = copy.deepcopy(write.body)
            elif version == 1:
                # Versions start at 1: the merge went over no state at all.
                body = apply_write({}, "merge_by_key", write.body)
            elif known is not None and known.body is not None and known.version == version - 1:
                body = apply_write(known.body, "merge_by_key", write.body)
            else:
                body = None  # a merge over a state this SDK did not hold
            if known is None or version >= known.version:
                self._known[write.key] = _Known(version, body, _now_iso())
        reason = answer.get("reason")
        return AgentStateWritten(stored, version, reason if isinstance(reason, str) else None)

    def _reconcile(self, key: StateKey, answer: Mapping[str, Any]) -> AgentState:
        version = int(answer.get("version") or 0)
        body = dict(answer.get("body") or {})
        updated = answer.get("updated_at")
        updated_at = updated if isinstance(updated, str) else None
        known = self._known.get(key)
        if known is None or version >= known.version:
            self._known[key] = _Known(version, copy.deepcopy(body), updated_at)
            return AgentState(body, version, updated_at)
        # Loom answered older than this SDK wrote or read: serve what the SDK knows.
        if known.body is not None:
            return AgentState(copy.deepcopy(known.body), known.version, known.updated_at)
        return AgentState(body, version, updated_at, stale=True)

    def _offline_state(self, key: StateKey) -> AgentState:
        known = self._known.get(key)
        body = copy.deepcopy(known.body) if known and known.body is not None else {}
        queued = [write for write in self._queue if write.key == key]
        for write in queued:
            body = apply_write(body, write.mode, write.body)
        return AgentState(
            body,
            known.version if known else 0,
            known.updated_at if known else None,
            offline=True,
            pending=len(queued),
        )

    # --- replay -------------------------------------------------------------------------------

    def _local_state(self, key: StateKey) -> AgentState:
        known = self._known.get(key)
        if known is None or known.body is None:
            return AgentState({}, 0, None)
        return AgentState(copy.deepcopy(known.body), known.version, known.updated_at)

    def _write_locally(self, write: QueuedWrite) -> AgentStateWritten:
        if write.mode == "cas" and write.if_version is None:
            raise ValueError("a cas write needs if_version (0 when the state must not exist)")
        known = self._known.get(write.key) or _Known(0, {}, None)
        if write.if_version is not None and write.if_version != known.version:
            return AgentStateWritten(False, known.version, CONFLICT)
        body = apply_write(known.body or {}, write.mode, write.body)
        version = known.version + 1
        self._known[write.key] = _Known(version, body, _now_iso())
        return AgentStateWritten(True, version, None)


def _held_version(error: AgentStateConflict, write: QueuedWrite) -> int:
    held = error.details.get("version")
    return held if isinstance(held, int) else write.if_version or 0


class AgentStateOf(Face[M]):
    """``scope.agent_state``: get, put and flush for one scope, over the Agent's keeper."""

    def __init__(self, keeper: AgentStateKeeper[M], scope: Mapping[str, str]) -> None:
        self._keeper: AgentStateKeeper[M] = keeper
        self._runner = keeper._runner
        self.scope = dict(scope)

    @runs_locked
    def get(self, *, timeout: float | None = None) -> Program[AgentState]:
        """The state: ``body``, ``version``, ``updated_at`` (see ``AgentState``)."""
        return (yield from self._keeper.get_program(self.scope, timeout))

    @runs_locked
    def put(
        self,
        body: Mapping[str, Any],
        *,
        mode: str = "merge_by_key",
        if_version: int | None = None,
        subject: str | None = None,
        timeout: float | None = None,
    ) -> Program[AgentStateWritten]:
        """Write by merge_by_key (default) or cas (with ``if_version``; 0 for a new state)."""
        return (yield from self._keeper.put_program(
            self.scope, body, mode, if_version, subject, timeout))

    @runs_locked
    def flush(self, *, timeout: float | None = None) -> Program[int]:
        """Send every queued write again (all scopes, in order); answers how many remain."""
        return (yield from self._keeper.flush_program(timeout))

    @property
    def conflicts(self) -> list[ReplayFailure]:
        """Replayed writes of this scope that Loom refused with 412, oldest first."""
        key = self._keeper.key(self.scope)
        return [failure for failure in self._keeper.conflicts if failure.write.key == key]

    @property
    def rejected(self) -> list[ReplayFailure]:
        """Replayed writes of this scope that Loom did not store for another reason."""
        key = self._keeper.key(self.scope)
        return [failure for failure in self._keeper.rejected if failure.write.key == key]

    @property
    def pending(self) -> list[QueuedWrite]:
        """This scope's writes waiting for Loom, oldest first."""
        key = self._keeper.key(self.scope)
        return [write for write in self._keeper.pending if write.key == key]

    def __repr__(self) -> str:
        return f"<loom agent_state of {self.scope['kind']} scope>"


class Scope(Face[M]):
    """What a state belongs to: ``bot.conversation(id)`` and its kin. ``.agent_state``."""

    def __init__(self, keeper: AgentStateKeeper[M], kind: str, id: str) -> None:
        if not isinstance(id, str) or not id:
            raise ValueError(f"a {kind} scope needs a non-empty string id")
        self._runner = keeper._runner
        self.kind = kind
        self.id = id
        self.agent_state: AgentStateOf[M] = AgentStateOf(keeper, {"kind": kind, "id": id})

    def __repr__(self) -> str:
        # The id stays out of reprs and logs: a conversation id can be a phone number.
        return f"<loom {self.kind} scope>"
