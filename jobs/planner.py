"""The structured_profile worker's pass planner: who is behind, and who a pass builds next.

This module owns the rules of seed 000, "Structured profiles", bullets Staleness and Passes:

* when one user's profile is due for a rebuild (``user_due``: schema change, deletion, pending,
  cooldown, failure backoff, refusal),
* the failure backoff (``next_backoff``),
* one pass (``PassPlanner``): the namespace rotation, equal shares of the pass budget, leftovers
  for the namespaces that used their whole share, scan lists and their ages, namespace and user
  waits, the "no new user in the second half of the pass" rule, and the delay before the next
  pass,
* the state all of that keeps between passes (``PlannerState``), as plain JSON-able data held
  under the worker lease's generation (``state_for_generation``).

Everything here is a pure function of its arguments. There is no Redis, no I/O and no clock:
every time is a ``now`` in seconds passed in by the caller. The pass job loads plain data,
drives a ``PassPlanner`` step by step (it scans and builds when the planner asks it to), and
stores the state ``finish`` returns. That keeps every rule testable without Redis or sleeping.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

__all__ = [
    "DEFAULT_SETTINGS",
    "SCAN_SHARE_FACTOR",
    "STATE_FORMAT",
    "BuildStep",
    "Decision",
    "NamespaceBackoff",
    "NamespaceInfo",
    "Outcome",
    "PassPlanner",
    "PlannerSettings",
    "PlannerState",
    "Reason",
    "Refusal",
    "ScanList",
    "ScanNeeded",
    "ScanStep",
    "UserCandidate",
    "UserWait",
    "give_back",
    "next_backoff",
    "plan_pass",
    "record_outcome",
    "refusal_fingerprint",
    "rotation_order",
    "state_for_generation",
    "user_due",
]

# Bumped when the stored shape changes; a state of another format reads as a fresh one.
STATE_FORMAT = 1

# One scan lists up to this many times the namespace's share (seed: "up to ten times").
SCAN_SHARE_FACTOR = 10

# Attribute prefix ``PlannerSettings.from_settings`` reads (app/settings.py exposes
# LOOM_STRUCTURED_PROFILE_<NAME> as the attribute structured_profile_<name>).
_SETTINGS_PREFIX = "structured_profile_"


# --------------------------------------------------------------------------------------------
# Settings and backoff


@dataclass(frozen=True)
class PlannerSettings:
    """The LOOM_STRUCTURED_PROFILE_* settings the planner reads, with the seed's defaults."""

    max_users_per_pass: int = 20
    max_pass_seconds: float = 600
    scan_max_age_seconds: float = 600
    idle_interval_seconds: float = 600
    interval_seconds: float = 60
    cooldown_seconds: float = 600
    backoff_base_seconds: float = 300
    backoff_cap_seconds: float = 21600
    refusal_retry_seconds: float = 21600

    def __post_init__(self) -> None:
        if self.max_users_per_pass < 1:
            raise ValueError("max_users_per_pass must be at least 1")
        for name in (
            "max_pass_seconds",
            "scan_max_age_seconds",
            "idle_interval_seconds",
            "interval_seconds",
            "cooldown_seconds",
            "backoff_base_seconds",
            "backoff_cap_seconds",
            "refusal_retry_seconds",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")

    @classmethod
    def from_settings(cls, settings: Any) -> PlannerSettings:
        """Read the values from an ``app.settings.Settings`` (or any object with the attributes
        ``structured_profile_<name>``); a missing attribute keeps the seed's default."""
        values: dict[str, Any] = {}
        for name in cls.__dataclass_fields__:
            attr = _SETTINGS_PREFIX + name
            try:
                values[name] = getattr(settings, attr)
            except AttributeError:
                continue
        return cls(**values)


DEFAULT_SETTINGS = PlannerSettings()


def next_backoff(failures: int, settings: PlannerSettings = DEFAULT_SETTINGS) -> float:
    """The wait after the ``failures``-th failure in a row: ``min(base * 2**(failures-1), cap)``.

    The first failure waits the base, each further one doubles it, never past the cap.
    """
    if failures < 1:
        raise ValueError("failures must be at least 1")
    # Doubling past 2**62 cannot matter (any base of at least a nanosecond is past every cap by
    # then), and stopping there keeps a huge count from building a huge integer.
    doubled = float(settings.backoff_base_seconds * 2 ** min(failures - 1, 62))
    return min(doubled, settings.backoff_cap_seconds)


# --------------------------------------------------------------------------------------------
# One user's staleness


class Reason(StrEnum):
    """Why ``user_due`` decided as it did. Due: SCHEMA, DELETION, PENDING, COOLED."""

    BACKOFF = "backoff"  # a failed build's wait is not over
    REFUSED = "refused"  # refused or cut off, and nothing it depends on changed since
    SCHEMA = "schema_changed"  # built under another schema: due at the next pass, no cooldown
    DELETION = "deletion"  # fewer sources than the profile counted: skips the cooldown
    PENDING = "pending"  # no served profile row: nothing to cool down from
    CURRENT = "current"  # nothing changed since the build and the build was not short
    COOLDOWN = "cooldown"  # behind, but the cooldown is not over
    COOLED = "cooled_down"  # behind and the cooldown is over


@dataclass(frozen=True)
class Refusal:
    """A build refused by the profile row or cut off at the output cap, and what it was refused
    under (see ``refusal_fingerprint``)."""

    refused_at: float
    fingerprint: str


def refusal_fingerprint(sources_digest: str, row_version: int | str | None, schema_sha: str) -> str:
    """What a refusal depends on: the user's sources digest, the profile row's version and the
    schema's sha. An unpin or unlock writes a new row version, a fact change moves the digest and
    a schema change moves the sha, so any of them gives another fingerprint and a retry."""
    row = "" if row_version is None else str(row_version)
    payload = json.dumps([sources_digest, row, schema_sha], separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class UserCandidate:
    """What the caller knows about one user of a namespace, loaded from Redis.

    ``changed_at`` is the last change to the user's sources (or the time a schema change reached
    them); ``built_at`` is when the last build read the sources, whether or not it wrote a row.
    ``built`` says a row the worker wrote is served now (false: pending). ``deletion`` says the
    sources count is below the count the profile carries; ``schema_changed`` that the profile
    carries another schema hash; ``short`` that the last build was short of a fact it counted.
    ``fingerprint`` is ``refusal_fingerprint`` of the current data, compared with ``refusal``.
    """

    user_id: str
    changed_at: float | None = None
    built: bool = False
    built_at: float | None = None
    deletion: bool = False
    schema_changed: bool = False
    short: bool = False
    fingerprint: str = ""
    backoff_until: float | None = None
    refusal: Refusal | None = None


@dataclass(frozen=True)
class Decision:
    """``user_due``'s answer; true when due. ``not_before`` is when a user not due now becomes
    due on time alone (a wait or cooldown ending), or None when only a change can make it due."""

    due: bool
    reason: Reason
    not_before: float | None = None

    def __bool__(self) -> bool:
        return self.due


def user_due(candidate: UserCandidate, now: float, settings: PlannerSettings) -> Decision:
    """Whether a pass should rebuild this user's profile now (seed: Staleness, Passes).

    The rules, first match wins:

    1. a failed build's backoff not over: not due, whatever changed (the seed leaves a waiting
       user out of the scans);
    2. a refusal whose fingerprint is unchanged and younger than refusal_retry_seconds: not due;
    3. a schema change: due (rebuilt from the next pass on, no cooldown);
    4. a deletion: due (skips the cooldown);
    5. no served row and the last build was not short: due (pending has nothing to cool down);
    6. no change since the last build and the build was not short: not due;
    7. otherwise the cooldown: due once ``cooldown_seconds`` have passed since the later of the
       last change and the last build.

    Rule 7 measures from the later of the two because the seed needs both: "other changes are
    rebuilt after the cooldown" counts from the change (a burst of edits, restatements or
    reinforcements costs one rebuild, after the burst), and a short build, or an all-null one
    written because none of the counted facts were served, "is built again after the cooldown,
    a model call each time" with no new change, which can only count from the build. It also
    keeps a user to at most one cooldown-paced build per cooldown. The cost: a user whose facts
    change more often than once per cooldown is rebuilt once they pause for one; the served
    profile reads stale meanwhile.
    """
    if candidate.backoff_until is not None and now < candidate.backoff_until:
        return Decision(False, Reason.BACKOFF, candidate.backoff_until)
    refusal = candidate.refusal
    if refusal is not None and refusal.fingerprint == candidate.fingerprint:
        retry_at = refusal.refused_at + settings.refusal_retry_seconds
        if now < retry_at:
            return Decision(False, Reason.REFUSED, retry_at)
    if candidate.schema_changed:
        return Decision(True, Reason.SCHEMA)
    if candidate.deletion:
        return Decision(True, Reason.DELETION)
    if not candidate.built and not candidate.short:
        return Decision(True, Reason.PENDING)
    changed_since_build = candidate.changed_at is not None and (
        candidate.built_at is None or candidate.changed_at > candidate.built_at
    )
    if not changed_since_build and not candidate.short:
        return Decision(False, Reason.CURRENT)
    times = [t for t in (candidate.changed_at, candidate.built_at) if t is not None]
    if not times:
        # Short but with no dates at all: nothing to count a cooldown from.
        return Decision(True, Reason.COOLED)
    due_at = max(times) + settings.cooldown_seconds
    if now < due_at:
        return Decision(False, Reason.COOLDOWN, due_at)
    return Decision(True, Reason.COOLED)


# --------------------------------------------------------------------------------------------
# State kept between passes


def _number(value: Any, what: str) -> float:
    # bool is an int in Python; a stored true/false is never a time.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"malformed planner state: {what} is not a number")
    return value


def _optional_number(value: Any, what: str) -> float | None:
    return None if value is None else _number(value, what)


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"malformed planner state: {what} is not a string")
    return value


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"malformed planner state: {what} is not an object")
    return value


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"malformed planner state: {what} is not a count")
    return value


@dataclass
class ScanList:
    """Users behind in one namespace, as one scan listed them, oldest first; the passes take
    from the front. ``complete``: the scan returned fewer than it asked for, so it found every
    user behind and, once drained, is not repeated before it is scan_max_age_seconds old."""

    users: list[str]
    created_at: float
    schema_sha: str
    complete: bool
    # The namespace's wake count (``NamespaceInfo.wakes``) when the scan was made: a wake since
    # (a user's first source fact, a schema set) means someone the list cannot hold is behind.
    wakes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "users": list(self.users),
            "created_at": self.created_at,
            "schema_sha": self.schema_sha,
            "complete": self.complete,
            "wakes": self.wakes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScanList:
        data = _mapping(data, "scan list")
        users = data.get("users")
        if not isinstance(users, list):
            raise ValueError("malformed planner state: scan users is not a list")
        complete = data.get("complete")
        if not isinstance(complete, bool):
            raise ValueError("malformed planner state: scan complete is not a boolean")
        return cls(
            users=[_text(user, "scan user") for user in users],
            created_at=_number(data.get("created_at"), "scan created_at"),
            schema_sha=_text(data.get("schema_sha"), "scan schema_sha"),
            complete=complete,
            # A list stored before wakes were counted reads as made at none.
            wakes=_count(data.get("wakes", 0), "scan wakes"),
        )


@dataclass
class NamespaceBackoff:
    """A namespace whose scan or stored schema failed ``failures`` times in a row. It takes no
    place in a pass until ``until``, or until its schema differs from ``schema_sha``."""

    failures: int
    until: float
    schema_sha: str

    def to_dict(self) -> dict[str, Any]:
        return {"failures": self.failures, "until": self.until, "schema_sha": self.schema_sha}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NamespaceBackoff:
        data = _mapping(data, "namespace backoff")
        return cls(
            failures=_count(data.get("failures"), "namespace failures"),
            until=_number(data.get("until"), "namespace until"),
            schema_sha=_text(data.get("schema_sha"), "namespace schema_sha"),
        )


@dataclass
class UserWait:
    """One user's failed builds in a row (and the wait they earned) and last refusal."""

    failures: int = 0
    backoff_until: float | None = None
    refusal: Refusal | None = None

    def is_empty(self) -> bool:
        return self.failures == 0 and self.backoff_until is None and self.refusal is None

    def to_dict(self) -> dict[str, Any]:
        refusal = None
        if self.refusal is not None:
            refusal = {
                "refused_at": self.refusal.refused_at,
                "fingerprint": self.refusal.fingerprint,
            }
        return {
            "failures": self.failures,
            "backoff_until": self.backoff_until,
            "refusal": refusal,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UserWait:
        data = _mapping(data, "user wait")
        raw_refusal = data.get("refusal")
        refusal = None
        if raw_refusal is not None:
            raw_refusal = _mapping(raw_refusal, "refusal")
            refusal = Refusal(
                refused_at=_number(raw_refusal.get("refused_at"), "refused_at"),
                fingerprint=_text(raw_refusal.get("fingerprint"), "refusal fingerprint"),
            )
        return cls(
            failures=_count(data.get("failures", 0), "user failures"),
            backoff_until=_optional_number(data.get("backoff_until"), "backoff_until"),
            refusal=refusal,
        )


@dataclass
class PlannerState:
    """Everything the planner keeps from one pass to the next, under one lease generation.

    ``cursor`` is the last namespace a pass reached (the next pass starts after it); ``scans``,
    ``namespace_backoffs`` and ``user_waits`` (namespace -> user -> wait) are keyed by namespace
    id. The seed keeps these "in the worker's process"; Loom keeps them in Redis under
    ``generation`` instead, because RQ forks a process per job.
    """

    generation: str | int | None = None
    cursor: str | None = None
    scans: dict[str, ScanList] = field(default_factory=dict)
    namespace_backoffs: dict[str, NamespaceBackoff] = field(default_factory=dict)
    user_waits: dict[str, dict[str, UserWait]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "generation": self.generation,
            "cursor": self.cursor,
            "scans": {ns: scan.to_dict() for ns, scan in self.scans.items()},
            "namespace_backoffs": {
                ns: wait.to_dict() for ns, wait in self.namespace_backoffs.items()
            },
            "user_waits": {
                ns: {user: wait.to_dict() for user, wait in users.items()}
                for ns, users in self.user_waits.items()
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlannerState:
        """Read a stored state; ValueError when it is malformed or of another format (the
        caller then starts from a fresh state, as after a lease change)."""
        data = _mapping(data, "state")
        if data.get("format") != STATE_FORMAT:
            raise ValueError("malformed planner state: unknown format")
        generation = data.get("generation")
        if generation is not None and (
            isinstance(generation, bool) or not isinstance(generation, str | int)
        ):
            raise ValueError("malformed planner state: generation is not a string or integer")
        cursor = data.get("cursor")
        if cursor is not None:
            cursor = _text(cursor, "cursor")
        scans = {
            _text(ns, "namespace"): ScanList.from_dict(scan)
            for ns, scan in _mapping(data.get("scans", {}), "scans").items()
        }
        backoffs = {
            _text(ns, "namespace"): NamespaceBackoff.from_dict(wait)
            for ns, wait in _mapping(data.get("namespace_backoffs", {}), "backoffs").items()
        }
        user_waits = {
            _text(ns, "namespace"): {
                _text(user, "user"): UserWait.from_dict(wait)
                for user, wait in _mapping(users, "user waits").items()
            }
            for ns, users in _mapping(data.get("user_waits", {}), "user waits").items()
        }
        return cls(generation, cursor, scans, backoffs, user_waits)

    def to_json(self) -> str:
        # allow_nan=False: a NaN or infinite time is a bug upstream; refuse to store it.
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> PlannerState:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"malformed planner state: {exc}") from None
        return cls.from_dict(data)

    def copy(self) -> PlannerState:
        """A deep copy (a pass works on its own copy and leaves the caller's state alone)."""
        return PlannerState.from_dict(self.to_dict())


def state_for_generation(stored: PlannerState | None, generation: str | int) -> PlannerState:
    """The state a pass holding the lease at ``generation`` starts from.

    The stored state when it was written under the same generation; otherwise a fresh one, so
    waits, backoffs and scan lists start over when another process takes the lease (seed). The
    rotation cursor is carried over: it holds nothing the seed says starts over, and keeping it
    stops frequent lease changes from always starting the rotation at the first namespace.
    """
    if stored is not None and stored.generation == generation:
        return stored
    return PlannerState(generation=generation, cursor=stored.cursor if stored else None)


# --------------------------------------------------------------------------------------------
# One pass


class Outcome(StrEnum):
    """What became of one user's build, as the caller reports it to ``record_result``."""

    BUILT = "built"  # a row was written
    UNCHANGED = "unchanged"  # nothing to write: already current, or nothing served and no row
    FAILED = "failed"  # a model error or an answer that is not a JSON object: backoff
    REFUSED = "refused"  # the profile row refused the write (locked, pinned, high, blacklisted)
    CUT_OFF = "cut_off"  # the model's answer was cut off at the output cap
    DEFERRED = "deferred"  # would pass a model-call budget: stays listed, no backoff


@dataclass(frozen=True)
class NamespaceInfo:
    """A namespace with a schema: its id (e.g. ``org/namespace``), the schema's sha, whether
    the stored schema still parses, and how many times a schema set or a user's first source
    fact woke the passes there (a count that only grows)."""

    id: str
    schema_sha: str
    parses: bool = True
    wakes: int = 0


@dataclass(frozen=True)
class ScanStep:
    """The planner asks for a scan: list up to ``limit`` users behind in ``namespace``, oldest
    first, leaving out ``excluded``; report it with ``record_scan`` or ``record_scan_failure``."""

    namespace: str
    limit: int
    excluded: frozenset[str]


@dataclass(frozen=True)
class BuildStep:
    """The planner asks for one build; report it with ``record_result``."""

    namespace: str
    user_id: str


class ScanNeeded(Exception):
    """Raised by ``PassPlanner.next_user`` when a namespace must be scanned first (a request to
    the caller rather than an error: scan, ``record_scan``, then ask again)."""

    def __init__(self, step: ScanStep) -> None:
        super().__init__(f"scan {step.namespace} for up to {step.limit} users")
        self.step = step


def rotation_order(namespace_ids: Iterable[str], cursor: str | None) -> list[str]:
    """The namespaces sorted by id, starting with the first after ``cursor`` and wrapping round.

    Sorting makes the order independent of how Redis listed them, and "after the cursor" still
    works when the cursor's namespace has since lost its schema.
    """
    ordered = sorted(set(namespace_ids))
    if cursor is None:
        return ordered
    start = next((i for i, ns in enumerate(ordered) if ns > cursor), 0)
    return ordered[start:] + ordered[:start]


def _prune(
    state: PlannerState,
    namespaces: Mapping[str, NamespaceInfo],
    now: float,
    settings: PlannerSettings,
) -> None:
    """Drop what can no longer matter, so the stored state stays small."""
    for ns in [ns for ns in state.scans if ns not in namespaces]:
        del state.scans[ns]
    for ns, wait in list(state.namespace_backoffs.items()):
        info = namespaces.get(ns)
        # "backs off ... until the wait is over or its schema changes": a new schema ends it.
        if info is None or info.schema_sha != wait.schema_sha:
            del state.namespace_backoffs[ns]
    for ns in list(state.user_waits):
        if ns not in namespaces:
            del state.user_waits[ns]
            continue
        users = state.user_waits[ns]
        for user, user_wait in list(users.items()):
            if user_wait.refusal is not None and (
                now >= user_wait.refusal.refused_at + settings.refusal_retry_seconds
            ):
                user_wait.refusal = None
            # A failure count is forgotten a whole cap after its wait ended: by then the user
            # was retried (at most one scan age after the wait) or is no longer behind.
            if user_wait.backoff_until is not None and (
                now >= user_wait.backoff_until + settings.backoff_cap_seconds
            ):
                user_wait.failures = 0
                user_wait.backoff_until = None
            if user_wait.is_empty():
                del users[user]
        if not users:
            del state.user_waits[ns]


def _fresh_scan(scan: ScanList, info: NamespaceInfo, now: float, max_age: float,
                interval: float) -> bool:
    """Whether passes may go on taking from ``scan``. Not when it will be ``max_age`` old by
    the next pass, one interval on: a change the list missed is then seen by a scan at most
    ``max_age`` after the list was made, not up to an interval past it."""
    if scan.schema_sha != info.schema_sha:
        return False
    if scan.wakes != info.wakes:
        # Woken since the scan (a user's first source fact): that user is on no list, and a
        # complete list would keep them waiting until it is max_age old.
        return False
    # At most half the max age ahead: with an interval longer than that (passes enqueued by
    # hand, tests), every list would be dropped at once and the users a pass gave back lost
    # their place at the front.
    if now - scan.created_at + min(interval, max_age / 2) > max_age:
        return False
    # A drained list that did not find everyone is rescanned; a drained complete one stays as
    # the mark that nobody else was behind when it was made.
    return bool(scan.users) or scan.complete


class PassPlanner:
    """One pass of the structured_profile worker, driven step by step by the caller.

    The caller loop::

        planner = PassPlanner(state, namespaces, settings, now)
        while (step := planner.next_step(clock.now())) is not None:
            if isinstance(step, ScanStep):
                users = scan_users_behind(step.namespace, step.limit, step.excluded)
                planner.record_scan(step.namespace, users, clock.now())
            else:
                outcome, fingerprint = build(step.namespace, step.user_id)
                planner.record_result(step.namespace, step.user_id, outcome, clock.now(),
                                      fingerprint)
        new_state, delay = planner.finish(clock.now())

    A pass has two rounds. In the first it reaches the namespaces in rotation order, each
    taking up to its share from its scan list (scanning first when it has none); one with
    nobody behind spends nothing and the pass reads on. In the second, what is left of the
    budget goes round the namespaces that used their whole share, one user at a time in
    rotation order, only from users their scans already listed.
    """

    def __init__(
        self,
        state: PlannerState,
        namespaces: Sequence[NamespaceInfo],
        settings: PlannerSettings,
        now: float,
    ) -> None:
        self.settings = settings
        self.started_at = now
        self._state = state.copy()
        self._namespaces: dict[str, NamespaceInfo] = {}
        for info in namespaces:
            if info.id in self._namespaces:
                raise ValueError(f"namespace {info.id!r} listed twice")
            self._namespaces[info.id] = info
        _prune(self._state, self._namespaces, now, settings)

        # Namespaces whose scan or schema failed in this pass; they wait from now on.
        self._failed: set[str] = set()
        eligible: list[str] = []
        for ns, info in self._namespaces.items():
            wait = self._state.namespace_backoffs.get(ns)
            if wait is not None and now < wait.until:
                continue  # "a namespace that is waiting takes no place in the pass"
            if not info.parses:
                self._fail_namespace(ns, now)
                continue
            eligible.append(ns)
        self._order = rotation_order(eligible, self._state.cursor)

        for ns, scan in list(self._state.scans.items()):
            if not _fresh_scan(scan, self._namespaces[ns], now, settings.scan_max_age_seconds,
                               settings.interval_seconds):
                del self._state.scans[ns]

        # Equal shares, rounded down so that every namespace's share fits in the budget; the
        # remainder of the division joins the leftovers of the second round. At least one, so
        # with more namespaces than budget the first ``max_users_per_pass`` with someone behind
        # take one each and the rotation brings the others next time.
        self.share = max(1, settings.max_users_per_pass // len(self._order)) if self._order else 0

        self._pos = 0  # index in ``_order`` of the first round
        self._reached: list[str] = []
        self._scanned: set[str] = set()
        self._taken: dict[str, list[str]] = {ns: [] for ns in self._order}
        self._taken_pairs: set[tuple[str, str]] = set()
        self._handed_out: list[tuple[str, str]] = []
        self._recorded: set[tuple[str, str]] = set()
        self._deferred: dict[str, list[str]] = {}
        self._pending_scan: ScanStep | None = None
        self._second_round: deque[str] | None = None
        self._finished = False
        self.idle = False  # set by finish: the pass reached everyone and found nobody behind

    # -- what the pass looks like -----------------------------------------------------------

    def namespaces_in_order(self) -> list[str]:
        """The namespaces taking part in this pass, in the order the first round reaches them:
        rotation order from the stored cursor, without the ones waiting on a backoff."""
        return list(self._order)

    @property
    def budget_left(self) -> int:
        return self.settings.max_users_per_pass - len(self._taken_pairs)

    def taken(self) -> list[tuple[str, str]]:
        """The (namespace, user) pairs handed out so far, in the order they were handed out."""
        return list(self._handed_out)

    def scan_size(self, ns: str) -> int:
        """How many users one scan of ``ns`` asks for: ten times the share."""
        self._require_in_pass(ns)
        return SCAN_SHARE_FACTOR * self.share

    def needs_scan(self, ns: str) -> bool:
        """Whether ``ns`` must be scanned before it can hand out users in this pass: it has no
        usable scan list and has not been scanned in this pass already."""
        self._require_in_pass(ns)
        return self._can_scan(ns)

    def excluded_users(self, ns: str, now: float) -> frozenset[str]:
        """Users a scan of ``ns`` must leave out: those waiting on a failure backoff (seed) and
        those already handed out in this pass (so a second scan cannot list them again)."""
        waiting = {
            user
            for user, wait in self._state.user_waits.get(ns, {}).items()
            if wait.backoff_until is not None and now < wait.backoff_until
        }
        return frozenset(waiting | set(self._taken.get(ns, ())))

    def due(self, ns: str, candidate: UserCandidate, now: float) -> Decision:
        """``user_due`` with this planner's backoff and refusal for the user folded in (the
        later backoff and the later refusal of the candidate's and the state's win)."""
        wait = self._state.user_waits.get(ns, {}).get(candidate.user_id)
        backoff_until = candidate.backoff_until
        refusal = candidate.refusal
        if wait is not None:
            if wait.backoff_until is not None and (
                backoff_until is None or wait.backoff_until > backoff_until
            ):
                backoff_until = wait.backoff_until
            if wait.refusal is not None and (
                refusal is None or wait.refusal.refused_at > refusal.refused_at
            ):
                refusal = wait.refusal
        merged = replace(candidate, backoff_until=backoff_until, refusal=refusal)
        return user_due(merged, now, self.settings)

    def users_behind(self, ns: str, candidates: Iterable[UserCandidate], now: float) -> list[str]:
        """A scan's answer from candidates the caller loaded: the due users not excluded, the
        longest waiting first (earliest change, then user id, so the order is stable)."""
        excluded = self.excluded_users(ns, now)
        due = [c for c in candidates if c.user_id not in excluded and self.due(ns, c, now).due]
        due.sort(key=lambda c: (c.changed_at is not None, c.changed_at or 0.0, c.user_id))
        return [c.user_id for c in due]

    # -- driving the pass -------------------------------------------------------------------

    def next_step(self, now: float) -> ScanStep | BuildStep | None:
        """The next thing the caller should do, or None when the pass takes no more users.

        None once the budget is spent, once half of max_pass_seconds has gone since the pass
        started (the build in flight has the second half to finish; users not reached stay
        listed), or when nobody is left to take. A ScanStep is repeated until it is recorded.
        """
        if self._finished:
            raise RuntimeError("the pass is finished")
        if self.budget_left <= 0 or self.out_of_time(now):
            return None
        if self._pending_scan is not None:
            return self._pending_scan
        while self._pos < len(self._order):
            ns = self._order[self._pos]
            if ns in self._failed:
                self._pos += 1
                continue
            if not self._reached or self._reached[-1] != ns:
                self._reached.append(ns)
            if len(self._taken[ns]) >= self.share:
                self._pos += 1
                continue
            user = self._pop(ns, now)
            if user is not None:
                return self._take(ns, user)
            if self._can_scan(ns):
                self._pending_scan = ScanStep(ns, self.scan_size(ns), self.excluded_users(ns, now))
                return self._pending_scan
            self._pos += 1  # nothing to build here: spends nothing, the pass reads on
        if self._second_round is None:
            self._second_round = deque(
                ns
                for ns in self._order
                if ns not in self._failed and len(self._taken[ns]) >= self.share
            )
        while self._second_round:
            ns = self._second_round.popleft()
            user = self._pop(ns, now)
            if user is not None:
                self._second_round.append(ns)  # round robin: one user, then the next namespace
                return self._take(ns, user)
        return None

    def next_user(self, now: float) -> tuple[str, str] | None:
        """``next_step`` for callers that want users only: (namespace, user_id), or None when
        the pass takes no more. Raises ScanNeeded when a namespace must be scanned first."""
        step = self.next_step(now)
        if step is None:
            return None
        if isinstance(step, ScanStep):
            raise ScanNeeded(step)
        return (step.namespace, step.user_id)

    def out_of_time(self, now: float) -> bool:
        """True in the second half of max_pass_seconds, when the pass takes no new user."""
        return now - self.started_at >= self.settings.max_pass_seconds / 2

    def record_scan(self, ns: str, users_behind: Iterable[str], now: float) -> None:
        """Store what a scan of ``ns`` listed, oldest first. More than ``scan_size`` users are
        cut to it; fewer mean the scan found every user behind (a complete scan). Excluded and
        repeated users are dropped. A successful scan ends the namespace's failure count."""
        self._require_in_pass(ns)
        info = self._namespaces[ns]
        limit = self.scan_size(ns)
        listed = list(users_behind)
        complete = len(listed) < limit
        excluded = self.excluded_users(ns, now)
        kept: list[str] = []
        seen: set[str] = set()
        for user in listed[:limit]:
            if user in excluded or user in seen:
                continue
            seen.add(user)
            kept.append(user)
        self._state.scans[ns] = ScanList(kept, now, info.schema_sha, complete, info.wakes)
        self._state.namespace_backoffs.pop(ns, None)
        self._scanned.add(ns)
        if self._pending_scan is not None and self._pending_scan.namespace == ns:
            self._pending_scan = None

    def record_scan_failure(self, ns: str, now: float) -> None:
        """A scan of ``ns`` failed: the namespace is counted and backs off like a user."""
        self._require_in_pass(ns)
        self._scanned.add(ns)
        self._state.scans.pop(ns, None)
        self._fail_namespace(ns, now)
        if self._pending_scan is not None and self._pending_scan.namespace == ns:
            self._pending_scan = None

    def record_result(
        self,
        ns: str,
        user_id: str,
        outcome: Outcome | str,
        now: float,
        fingerprint: str | None = None,
    ) -> None:
        """Record one build handed out by this pass.

        built / unchanged: the user's failure count and refusal end. failed: the count grows
        and the user waits ``next_backoff(count)``. refused / cut_off: the user is not retried
        until ``fingerprint`` (``refusal_fingerprint`` of the data the build saw, required)
        changes or refusal_retry_seconds pass; a refusal ends the failure count, since the
        build itself did not fail.

        deferred (it would pass a model-call budget): no wait is earned or ended; ``finish``
        lists the user again at the front of the namespace's scan list.
        """
        outcome = Outcome(outcome)
        pair = (ns, user_id)
        if pair not in self._taken_pairs:
            raise ValueError(f"{user_id!r} of {ns!r} was not handed out by this pass")
        if pair in self._recorded:
            raise ValueError(f"{user_id!r} of {ns!r} already has a result in this pass")
        self._recorded.add(pair)
        if outcome is Outcome.DEFERRED:
            # Not a failure: no wait is earned or ended, and ``finish`` lists the user again.
            self._deferred.setdefault(ns, []).append(user_id)
            return
        record_outcome(self._state, ns, user_id, outcome, now, self.settings, fingerprint)

    def snapshot(self) -> PlannerState:
        """The state as it stands mid-pass (a copy), for a caller that stores it after each
        build so that a pass abandoned by the supervisor loses nothing it recorded."""
        state = self._state.copy()
        if self._reached:
            state.cursor = self._reached[-1]
        return state

    def finish(self, now: float) -> tuple[PlannerState, float]:
        """End the pass: the state to store and the seconds before the next pass.

        idle_interval_seconds when the pass reached every namespace taking part and found no
        user behind (handed out nobody, no scan failed, no scan list left with users); else
        interval_seconds. Namespaces waiting on a backoff take no part, so they do not keep the
        worker from idling.
        """
        if self._finished:
            raise RuntimeError("the pass is finished")
        self._finished = True
        state = self.snapshot()
        _prune(state, self._namespaces, now, self.settings)
        for ns, users in self._deferred.items():
            # Deferred for a budget: back at the front of the namespace's list, in the order
            # they were taken, so the first pass with room builds them first.
            give_back(state, ns, users)
        for ns, scan in list(state.scans.items()):
            if not scan.users and not scan.complete:
                del state.scans[ns]
        # Every namespace's first-round turn ended (a pass stopped by its budget or its time
        # did not read on to the rest), and no scan failed, so nobody behind went unseen.
        reached_all = self._pos >= len(self._order) and not (self._failed & set(self._order))
        behind = bool(self._taken_pairs) or any(
            state.scans[ns].users for ns in self._order if ns in state.scans
        )
        self.idle = reached_all and not behind
        if self.idle:
            return state, self.settings.idle_interval_seconds
        return state, self.settings.interval_seconds

    # -- internals --------------------------------------------------------------------------

    def _require_in_pass(self, ns: str) -> None:
        if ns not in self._taken:
            raise ValueError(f"namespace {ns!r} takes no part in this pass")

    def _can_scan(self, ns: str) -> bool:
        return ns not in self._failed and ns not in self._scanned and ns not in self._state.scans

    def _pop(self, ns: str, now: float) -> str | None:
        """The next listed user of ``ns`` who may be built now; drops a drained list that was
        not complete (so the namespace is scanned again)."""
        scan = self._state.scans.get(ns)
        if scan is None:
            return None
        while scan.users:
            user = scan.users.pop(0)
            if (ns, user) in self._taken_pairs:
                continue
            wait = self._state.user_waits.get(ns, {}).get(user)
            if wait is not None and wait.backoff_until is not None and now < wait.backoff_until:
                continue  # listed before its failure: the first scan after the wait lists it
            return user
        if not scan.complete:
            del self._state.scans[ns]
        return None

    def _take(self, ns: str, user: str) -> BuildStep:
        self._taken[ns].append(user)
        self._taken_pairs.add((ns, user))
        self._handed_out.append((ns, user))
        return BuildStep(ns, user)

    def _fail_namespace(self, ns: str, now: float) -> None:
        info = self._namespaces[ns]
        previous = self._state.namespace_backoffs.get(ns)
        failures = (previous.failures if previous is not None else 0) + 1
        self._state.namespace_backoffs[ns] = NamespaceBackoff(
            failures, now + next_backoff(failures, self.settings), info.schema_sha
        )
        self._failed.add(ns)


def record_outcome(
    state: PlannerState,
    ns: str,
    user_id: str,
    outcome: Outcome | str,
    now: float,
    settings: PlannerSettings,
    fingerprint: str | None = None,
) -> None:
    """``PassPlanner.record_result`` on a stored state: for a pass whose builds end after the
    planner that handed them out has finished (builds fanned out as jobs of their own). A
    deferred build changes no wait: the caller gives the user back (``give_back``)."""
    outcome = Outcome(outcome)
    if outcome is Outcome.DEFERRED:
        return
    if outcome in (Outcome.REFUSED, Outcome.CUT_OFF) and not fingerprint:
        raise ValueError("a refused or cut-off build needs the refusal fingerprint")
    users = state.user_waits.setdefault(ns, {})
    wait = users.get(user_id, UserWait())
    if outcome in (Outcome.BUILT, Outcome.UNCHANGED):
        wait = UserWait()
    elif outcome is Outcome.FAILED:
        failures = wait.failures + 1
        wait = UserWait(failures, now + next_backoff(failures, settings), wait.refusal)
    else:
        assert fingerprint
        wait = UserWait(refusal=Refusal(now, fingerprint))
    if wait.is_empty():
        users.pop(user_id, None)
    else:
        users[user_id] = wait
    if not users:
        del state.user_waits[ns]


def give_back(state: PlannerState, ns: str, user_ids: Sequence[str]) -> None:
    """Users a pass handed out but did not build (deferred for a budget, or not reached before
    its time ran out) go back to the front of their namespace's scan list, in the order they
    were taken, so the next pass takes them first. Without a list the next pass scans again,
    and the scan lists them: they were never unlisted from the changed index."""
    scan = state.scans.get(ns)
    if scan is None:
        return
    returned = list(dict.fromkeys(user_ids))
    scan.users = [*returned, *(user for user in scan.users if user not in returned)]


def plan_pass(
    state: PlannerState,
    namespaces: Sequence[NamespaceInfo],
    now: float,
    settings: PlannerSettings = DEFAULT_SETTINGS,
) -> PassPlanner:
    """Start a pass at ``now`` over the namespaces that have a schema (see ``PassPlanner``)."""
    return PassPlanner(state, namespaces, settings, now)
