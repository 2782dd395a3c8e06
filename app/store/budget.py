"""Model-call budgets in Redis: each org's and namespace's caps, and what a rolling window spent.

A budget caps model calls and tokens (prompt + completion) per rolling window of
``LOOM_MODEL_BUDGET_WINDOW_SECONDS``; a cap left out (null) is no cap, and no budget at all is no
cap. The org's budget (``namespace "*"`` on the wire) caps all its namespaces together.

Before a model call a worker ``reserve``s one call and its estimated tokens against the
namespace's and the org's budgets in one script: both or neither, so two workers racing at the
edge cannot both pass it. After the call it ``settle``s the reservation with the usage the model
reported (the difference goes back), or ``release``s it when the call failed. The window is an
exact rolling one: each reservation is an entry scored by when it was made, and every script
first takes the entries older than the window out of the sums, so each leaves once.

Every key of an org's budgets carries the org's hash tag (``app.store.keys``), so each script
touches one slot, on Redis Cluster too. The window's entries name namespaces and amounts, never
a user. A ``set`` appends its audit entry to the namespace's audit list in the script's own
step; that list is in the namespace's slot, so on Redis Cluster the entry is its own step, right
after the write.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from app.store import keys
from app.store.idempotency import HeldKey, KeyedScript
from app.store.lua import raise_for_status, script
from app.store.namespace_config import AUDIT_MAX_ENTRIES, AuditLog
from app.store.script_interfaces import (
    BUDGET_READ,
    BUDGET_RESERVE,
    BUDGET_SET,
    BUDGET_SETTLE,
    BUDGET_TIMELINE,
)

if TYPE_CHECKING:
    from app.store.services import StoreServices

ORG = "*"  # the namespace name that stands for the org's own budget


@dataclass(frozen=True)
class Limits:
    """A budget's caps (None: no cap) and who set them when (ns since the epoch)."""

    calls: int | None = None
    tokens: int | None = None
    set_by: str = ""
    set_at: int | None = None


@dataclass(frozen=True)
class Window:
    """One budget as the window stands: its caps and what it spent (in-flight estimates
    included)."""

    limits: Limits
    spent_calls: int
    spent_tokens: int

    @property
    def remaining_calls(self) -> int | None:
        cap = self.limits.calls
        return None if cap is None else max(0, cap - self.spent_calls)

    @property
    def remaining_tokens(self) -> int | None:
        cap = self.limits.tokens
        return None if cap is None else max(0, cap - self.spent_tokens)


@dataclass(frozen=True)
class Reservation:
    """A reservation's answer: granted (settle or release it), or which budget refused it."""

    org: str
    namespace: str
    reservation_id: str
    tokens: int
    granted: bool
    over: str = ""  # "namespace" or "org" when refused
    first_deferral: bool = False  # the namespace's first refusal in the window


@dataclass(frozen=True)
class Bucket:
    """One slice of the rolling window: when it starts (ms since the epoch), the calls made in
    it and their tokens (reported, or the estimate while in flight)."""

    start_ms: int
    calls: int
    tokens: int


def _cap(raw: Any) -> int | None:
    return None if raw in (None, "", False) else int(raw)


class BudgetStore:
    def __init__(self, services: StoreServices) -> None:
        self.redis = services.redis
        self.clock = services.clock
        self.window_seconds = int(services.settings.model_budget_window_seconds)
        self._reserve = script(self.redis, "budget_reserve")
        self._settle = script(self.redis, "budget_settle")
        self._read = script(self.redis, "budget_read")
        self._set = KeyedScript(self.redis, "budget_set", "budget")
        self._timeline = script(self.redis, "budget_timeline")
        self.audit = AuditLog(services)
        self._clustered = isinstance(self.redis, redis.RedisCluster)

    @staticmethod
    def _limits_key(org: str, namespace: str) -> str:
        if namespace == ORG:
            return keys.budget_org_limits(org)
        return keys.budget_namespace_limits(org, namespace)

    def _times(self) -> tuple[int, int]:
        return self.clock.now_ns() // 1_000_000, self.window_seconds * 1000

    @staticmethod
    def _window_keys(org: str) -> dict[str, str]:
        return {"window": keys.budget_window(org), "reservations": keys.budget_reservations(org),
                "spent": keys.budget_spent(org)}

    # --- the caps ------------------------------------------------------------------------------

    def set(
        self, org: str, namespace: str, calls: int | None, tokens: int | None, actor: str,
        held: HeldKey | None = None,
    ) -> tuple[Limits, Limits]:
        """Replace the budget's caps (``namespace "*"``: the org's) and audit the change (old
        and new caps) in the same script step; answers (old, new). With ``held`` (an
        Idempotency-Key in the org's slot) the script keeps its reply there too."""
        now = self.clock.now_ns()
        action = "budget.set"
        details: dict[str, Any] = {"scope": "org" if namespace == ORG else "namespace",
                                   "new_calls": calls, "new_tokens": tokens}
        # On a cluster the audit list (the namespace's slot) is out of the script's reach.
        head, middle, tail = ("", "", "") if self._clustered else self.audit.parts(
            actor, action, ("old_calls", "old_tokens"), **details)
        reply = self._set(*BUDGET_SET.ordered(
            {"limits": self._limits_key(org, namespace),
             "audit": None if self._clustered else keys.namespace_audit(org, namespace)},
            {"calls": "" if calls is None else calls, "tokens": "" if tokens is None else tokens,
             "set_by": actor, "set_at": now, "audit_head": head, "audit_middle": middle,
             "audit_tail": tail, "audit_max": AUDIT_MAX_ENTRIES},
        ), held)
        raise_for_status("budget", reply)
        old_calls, old_tokens = reply
        old = Limits(_cap(old_calls), _cap(old_tokens))
        if self._clustered:
            self.audit.record(org, namespace, actor, action, old_calls=old.calls,
                              old_tokens=old.tokens, **details)
        return old, Limits(calls, tokens, actor, now)

    def get(self, org: str, namespace: str) -> Window:
        """The budget's caps and what the window spent (``namespace "*"``: the org's)."""
        now_ms, window_ms = self._times()
        spent_calls, spent_tokens, calls, tokens, set_by, set_at = self._read(
            *BUDGET_READ.ordered(
                {**self._window_keys(org), "limits": self._limits_key(org, namespace)},
                {"now_ms": now_ms, "window_ms": window_ms,
                 "namespace": "" if namespace == ORG else namespace}))
        limits = Limits(_cap(calls), _cap(tokens), set_by or "", _cap(set_at))
        return Window(limits, int(spent_calls), int(spent_tokens))

    def timeline(self, org: str, namespace: str, buckets: int) -> list[Bucket]:
        """The window's calls and tokens in ``buckets`` equal slices, oldest first, for one
        namespace (``namespace "*"``: the whole org)."""
        now_ms, window_ms = self._times()
        sums = self._timeline(*BUDGET_TIMELINE.ordered(
            {"window": keys.budget_window(org), "reservations": keys.budget_reservations(org)},
            {"now_ms": now_ms, "window_ms": window_ms,
             "namespace": "" if namespace == ORG else namespace, "buckets": buckets}))
        start, width = now_ms - window_ms, window_ms / buckets
        return [Bucket(start + int(index * width), int(sums[2 * index]), int(sums[2 * index + 1]))
                for index in range(buckets)]

    # --- reservations --------------------------------------------------------------------------

    def reserve(self, org: str, namespace: str, tokens: int) -> Reservation:
        """Reserve one call and ``tokens`` against the namespace's and the org's budgets."""
        reservation_id = uuid.uuid4().hex
        now_ms, window_ms = self._times()
        reply = self._reserve(*BUDGET_RESERVE.ordered(
            {"org_limits": keys.budget_org_limits(org),
             "namespace_limits": keys.budget_namespace_limits(org, namespace),
             **self._window_keys(org),
             "deferral_logged": keys.budget_deferral_logged(org, namespace)},
            {"now_ms": now_ms, "window_ms": window_ms, "reservation_id": reservation_id,
             "namespace": namespace, "estimated_tokens": int(tokens)}))
        if int(reply[0]) == 1:
            return Reservation(org, namespace, reservation_id, int(tokens), granted=True)
        return Reservation(org, namespace, reservation_id, int(tokens), granted=False,
                           over=str(reply[1]), first_deferral=bool(int(reply[2])))

    def settle(self, reservation: Reservation, real_tokens: int | None) -> bool:
        """Replace the reservation's estimate with what the call cost (None: unknown, the
        estimate stands); answers whether the reservation was still open."""
        return self._finish(reservation, "settle", real_tokens)

    def release(self, reservation: Reservation) -> bool:
        """Give the reservation's call and tokens back (the call failed or was not made)."""
        return self._finish(reservation, "release", None)

    def _finish(self, reservation: Reservation, mode: str, real_tokens: int | None) -> bool:
        if not reservation.granted:
            return False
        now_ms, window_ms = self._times()
        org = reservation.org
        changed = self._settle(*BUDGET_SETTLE.ordered(
            self._window_keys(org),
            {"now_ms": now_ms, "window_ms": window_ms,
             "reservation_id": reservation.reservation_id, "mode": mode,
             "real_tokens": "" if real_tokens is None else int(real_tokens)}))
        return bool(changed)
