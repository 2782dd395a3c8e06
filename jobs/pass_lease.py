"""A pass's lease across the processes that carry the pass, and the pass's two deadlines.

A structured_profile pass may run in several RQ jobs: the job that plans, the build jobs it fans
out to, and the job that closes it. ``PassTicket`` is what they share, as plain data (job
arguments): the lease (name, holder, fencing token, TTL) and the pass's times on the services'
clock. From ``take_until`` (half of LOOM_STRUCTURED_PROFILE_MAX_PASS_SECONDS after the start)
the pass takes no user; at ``hard_until`` (the whole of it) the supervisor abandons it: no fence
of the pass is renewed past it, so no build of the pass writes after it.

``LeaseKeeper`` keeps a running part of the pass in its lease: a thread renews the lease, and
the fences on the users it is building, every third of the TTL. A pass that dies stops renewing
and loses the lease within one TTL; a keeper that finds the lease gone drops its fences, and
the work under it stops at its next check or write.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass
from typing import Any

from app.clock import Clock
from app.store.lease import Fence, Lease, LeaseLost, LeaseStore

__all__ = ["MIN_LEASE_TTL_SECONDS", "LeaseKeeper", "LimitReached", "PassTicket", "lease_ttl"]

log = logging.getLogger("loom.jobs.pass_lease")

# The lease's TTL is a tenth of the pass's limit, at least this (or the whole limit when that is
# shorter): short enough that a pass whose process died frees the lease soon, long enough to
# span the hand-over from the planning job to the first build and from the last build to the
# closing job on a busy worker.
MIN_LEASE_TTL_SECONDS = 30.0


def lease_ttl(max_pass_seconds: float) -> float:
    return min(float(max_pass_seconds), max(MIN_LEASE_TTL_SECONDS, max_pass_seconds / 10))


@dataclass(frozen=True)
class PassTicket:
    lease: str
    holder: str
    token: int
    ttl: float
    started_at: float
    take_until: float
    hard_until: float
    # When the scheduler's tick that asked for the pass came: the start less the time the pass
    # waited in its queue. The next pass is due from it, so a pass that waited behind other
    # jobs does not push the next tick's pass past its due time.
    ticked_at: float

    @classmethod
    def start(cls, lease: Lease, started_at: float, max_pass_seconds: float,
              queued_seconds: float = 0.0) -> PassTicket:
        return cls(lease.name, lease.holder, lease.token, lease.ttl_ms / 1000, started_at,
                   started_at + max_pass_seconds / 2, started_at + max_pass_seconds,
                   started_at - max(0.0, queued_seconds))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PassTicket:
        return cls(str(data["lease"]), str(data["holder"]), int(data["token"]),
                   float(data["ttl"]), float(data["started_at"]), float(data["take_until"]),
                   float(data["hard_until"]),
                   # A closing job enqueued before the field existed: its start.
                   float(data.get("ticked_at", data["started_at"])))

    def lease_in(self, leases: LeaseStore) -> Lease:
        return leases.lease(self.lease, self.holder, self.token, self.ttl)


class LimitReached(Exception):
    """The pass's limit passed: what is still running is abandoned and writes nothing."""


class LeaseKeeper:
    """Renews a ticket's lease, and the fences taken through it, while the block runs."""

    def __init__(self, leases: LeaseStore, ticket: PassTicket, clock: Clock) -> None:
        self.leases = leases
        self.ticket = ticket
        self.lease = ticket.lease_in(leases)
        self.clock = clock
        self._fences: dict[str, Fence] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LeaseKeeper:
        self._thread = threading.Thread(target=self._run, name="loom-lease-keeper", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            fences, self._fences = list(self._fences.values()), {}
        for fence in fences:
            self.leases.release_fence(fence)

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def check(self) -> None:
        """LeaseLost once the lease is known to be gone."""
        if self._lost.is_set():
            raise LeaseLost(f"lease {self.ticket.lease} token {self.ticket.token} was lost")

    def fence_ttl(self) -> float:
        """A fence lasts one TTL, never past the pass's limit (<= 0: the limit is reached)."""
        return min(self.ticket.ttl, self.ticket.hard_until - self.clock.now())

    def take(self, org: str, namespace: str, user_id: str) -> Fence | None:
        """Fence one user for a build under the lease; None while they are being erased.
        LimitReached past the pass's limit; LeaseLost when the lease is gone or a later holder
        took the user."""
        self.check()
        ttl = self.fence_ttl()
        if ttl <= 0:
            raise LimitReached("the pass's limit passed")
        try:
            fence = self.leases.claim_fence(self.lease, org, namespace, user_id, ttl)
        except LeaseLost:
            self._lost.set()
            raise
        try:
            # After the claim: the fence then lapses no later than the lease renewed here.
            self.lease.renew()
        except LeaseLost:
            self._lost.set()
            if fence is not None:
                self.leases.release_fence(fence)
            raise
        if fence is not None:
            with self._lock:
                self._fences[fence.key] = fence
        return fence

    def drop(self, fence: Fence) -> None:
        with self._lock:
            self._fences.pop(fence.key, None)
        self.leases.release_fence(fence)

    def _run(self) -> None:
        every = max(0.05, self.ticket.ttl / 3)
        while not self._stop.wait(every):
            try:
                self._renew()
            except Exception:  # a Redis hiccup: the next beat tries again, the TTL covers it
                log.warning("could not renew the %s lease", self.ticket.lease, exc_info=True)

    def _renew(self) -> None:
        # Fences first: renewed before the lease, a fence never outlives the lease it stands for.
        ttl = self.fence_ttl()
        with self._lock:
            fences = list(self._fences.values())
        for fence in fences:
            if ttl > 0 and not self.leases.renew_fence(fence, ttl):
                with self._lock:
                    self._fences.pop(fence.key, None)  # a later holder took the user
        try:
            self.lease.renew()
        except LeaseLost:
            self._lost.set()
            log.warning("the %s lease (token %d) was lost: its pass writes nothing more",
                        self.ticket.lease, self.ticket.token)
            with self._lock:
                fences, self._fences = list(self._fences.values()), {}
            for fence in fences:
                self.leases.release_fence(fence)
            self._stop.set()
