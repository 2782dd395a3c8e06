"""The worker lease: one holder at a time, with a fencing token checked at every write.

Acquiring takes the next number of a per-lease counter (the fencing token, also the
generation the holder's kept state lives under). A holder renews before the TTL runs out; a
write made under the lease first checks, in the same script, that the lease still holds that
token, so a pass that lost its lease (paused, partitioned, slow) cannot write over the next
holder's work.

A lease may also fence single users: ``claim_fence`` puts the token in a key of the user's own
slot, and the scripts that write the user's rows refuse a write whose token is not the one there
(``Fence``). Only one slot is involved, so the check is atomic with the write on Redis Cluster
as well; a later holder that takes the user raises the token, and a fence that is not renewed
lapses, so a holder that lost the lease writes nothing more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.store import keys
from app.store.lua import script
from app.store.replies import optional_texts
from app.store.script_interfaces import (
    LEASE_ACQUIRE,
    LEASE_FENCE_CLAIM,
    RELEASE_IF_HELD,
    RENEW_IF_HELD,
)

if TYPE_CHECKING:
    from app.store.services import StoreServices

# The leases of Loom's periodic passes: the jobs take them, ``GET /metrics`` reports their
# holders, and neither imports the other for the names.
STRUCTURED_PROFILE_LEASE = "structured_profile"
CONSOLIDATION_LEASE = "profile_consolidation"
PASS_LEASES = (STRUCTURED_PROFILE_LEASE, CONSOLIDATION_LEASE)

@dataclass(frozen=True)
class NextPass:
    """What a pass stores about the next one: when it is due, the wake count it started from
    (``keys.structured_wakes``; None when not counted), and when the scheduler's tick that
    asked for it came (the ticks' phase, so a reader can tell when the next one comes)."""

    due: float | None = None
    wakes: int | None = None
    ticked_at: float | None = None

    def wait_holds(self, now: float, wakes_now: int) -> bool:
        """Whether a pass enqueued at ``now`` returns at once, waiting for ``due``: a wake
        since the pass that stored it started (a schema set, a user's first source fact) ends
        the wait, so the next tick runs a pass; with none, the wait holds (seed 000: a pass
        that found nobody behind waits the idle interval). A due stored without a count (an
        older release, or a pass that was not idle) holds as it was."""
        if self.due is None or now >= self.due:
            return False
        return self.wakes is None or wakes_now == self.wakes

    def next_tick(self, ready_at: float, wakes_now: int, interval: float) -> float | None:
        """When the scheduler's first tick that runs a pass comes, for a user a pass may take
        from ``ready_at`` on: the ticks come every ``interval`` from ``ticked_at``, and none
        before ``due`` while the wait holds. None before any pass stored its tick."""
        if self.ticked_at is None or interval <= 0:
            return None
        earliest = ready_at
        if self.due is not None and self.due > earliest and self.wait_holds(earliest, wakes_now):
            earliest = self.due
        ticks = max(0, math.ceil((earliest - self.ticked_at) / interval))
        return self.ticked_at + ticks * interval

    def dump(self) -> str:
        # An older release reads the first word alone: a float, as it wrote it.
        return " ".join([repr(self.due),
                         "-" if self.wakes is None else str(self.wakes),
                         "-" if self.ticked_at is None else repr(self.ticked_at)])

    @classmethod
    def parse(cls, raw: str | bytes | None) -> NextPass:
        if not raw:
            return cls()
        words = (raw.decode() if isinstance(raw, bytes) else raw).split()
        wakes = words[1] if len(words) > 1 and words[1] != "-" else None
        ticked = words[2] if len(words) > 2 and words[2] != "-" else None
        return cls(float(words[0]), int(wakes) if wakes is not None else None,
                   float(ticked) if ticked is not None else None)


class LeaseLost(Exception):
    """The lease is no longer ours: stop without writing."""


@dataclass(frozen=True)
class Fence:
    """A lease's claim on one user: a write under it names the key and the token it expects."""

    key: str
    token: str


class Lease:
    def __init__(self, store: LeaseStore, name: str, holder: str, token: int, ttl_ms: int):
        self.store = store
        self.name = name
        self.holder = holder
        self.token = token
        self.ttl_ms = ttl_ms

    @property
    def value(self) -> str:
        return f"{self.holder}|{self.token}"

    def renew(self, ttl_seconds: float | None = None) -> None:
        """Extend the lease by its TTL (or ``ttl_seconds``); LeaseLost once it is not ours."""
        ttl_ms = self.ttl_ms if ttl_seconds is None else max(1, int(ttl_seconds * 1000))
        if not self.store.renew(self, ttl_ms):
            raise LeaseLost(f"lease {self.name} token {self.token} was taken over")

    def holds(self) -> bool:
        return self.store.redis.get(keys.worker_lease(self.name)) == self.value

    def release(self) -> None:
        self.store.release(self)


class LeaseStore:
    def __init__(self, services: StoreServices) -> None:
        self.redis = services.redis
        self.clock = services.clock
        self._acquire = script(self.redis, "lease_acquire")
        self._renew = script(self.redis, "renew_if_held")
        self._release = script(self.redis, "release_if_held")
        self._claim = script(self.redis, "lease_fence_claim")

    def acquire(self, name: str, holder: str, ttl_seconds: float) -> Lease | None:
        ttl_ms = max(1, int(ttl_seconds * 1000))
        token = self._acquire(*LEASE_ACQUIRE.ordered(
            {"lease": keys.worker_lease(name), "generation": keys.worker_lease_generation(name),
             "acquired": keys.worker_lease_acquired(name)},
            {"holder": holder, "ttl_ms": ttl_ms, "now_s": repr(self.clock.now())},
        ))
        if token is None:
            return None
        return Lease(self, name, holder, int(token), ttl_ms)

    def lease(self, name: str, holder: str, token: int, ttl_seconds: float) -> Lease:
        """The lease a holder took earlier, for another process carrying its work on (a
        pass's build jobs and its closing job); nothing is read or written."""
        return Lease(self, name, holder, int(token), max(1, int(ttl_seconds * 1000)))

    def renew(self, lease: Lease, ttl_ms: int | None = None) -> bool:
        ttl = lease.ttl_ms if ttl_ms is None else ttl_ms
        return bool(self._renew(*RENEW_IF_HELD.ordered(
            {"lock": keys.worker_lease(lease.name)}, {"holder": lease.value, "ttl_ms": ttl})))

    def claim_fence(
        self, lease: Lease, org: str, namespace: str, user_id: str, ttl_seconds: float
    ) -> Fence | None:
        """Take one user under the lease's token for ``ttl_seconds``; None while the user is
        being erased. LeaseLost when a later holder of the lease has taken them."""
        key = keys.worker_lease_fence(lease.name, org, namespace, user_id)
        taken = int(self._claim(*LEASE_FENCE_CLAIM.ordered(
            {"fence": key, "erasing": keys.user_erasing(org, namespace, user_id)},
            {"token": lease.token, "ttl_ms": max(1, int(ttl_seconds * 1000))},
        )))
        if taken < 0:
            raise LeaseLost(f"lease {lease.name}: a later token took a user of token "
                            f"{lease.token}")
        return Fence(key, str(lease.token)) if taken else None

    def renew_fence(self, fence: Fence, ttl_seconds: float) -> bool:
        """Extend a fence while it still holds its token (a lapsed one is never recreated)."""
        return bool(self._renew(*RENEW_IF_HELD.ordered(
            {"lock": fence.key},
            {"holder": fence.token, "ttl_ms": max(1, int(ttl_seconds * 1000))})))

    def release_fence(self, fence: Fence) -> None:
        self._release(*RELEASE_IF_HELD.ordered({"lock": fence.key}, {"holder": fence.token}))

    def release(self, lease: Lease) -> None:
        self._release(*RELEASE_IF_HELD.ordered(
            {"lock": keys.worker_lease(lease.name)}, {"holder": lease.value}))

    def holder_age(self, name: str) -> float | None:
        """Seconds since the current holder took the lease; None while nobody holds it."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(keys.worker_lease(name))
        pipe.hmget(keys.worker_lease_acquired(name), ["token", "at"])
        value, (token, at) = pipe.execute()
        if not value or token is None or at is None:
            return None
        if value.rpartition("|")[2] != str(token):
            return None
        return max(0.0, self.clock.now() - float(at))

    def next_pass_due(self, name: str) -> NextPass:
        """What the last pass stored about the next one (``NextPass``)."""
        return NextPass.parse(self.redis.get(keys.worker_next_pass(name)))

    def set_next_pass_due(self, lease: Lease, at: float, wakes: int | None = None,
                          ticked_at: float | None = None) -> None:
        self.redis.set(keys.worker_next_pass(lease.name),
                       NextPass(at, wakes, ticked_at).dump())

    def load_state(self, name: str) -> tuple[str | None, str | None]:
        """The kept state and the generation (the holding process) it was written under."""
        row = optional_texts(self.redis.hmget(keys.worker_state(name), ["generation", "state"]))
        return row[0], row[1]

    def save_state(self, lease: Lease, state: str) -> None:
        """Keep state under the holder's generation, only while the lease is still ours.

        The generation is the holder (one worker process), not the fencing token: RQ forks a
        child per job, so every pass takes a new token, but state kept "in the worker's
        process" must survive from one pass to the next while the same process holds on.
        """
        pipe = self.redis.pipeline(transaction=True)
        try:
            pipe.watch(keys.worker_lease(lease.name))  # type: ignore[no-untyped-call]  # redis-py
            if pipe.get(keys.worker_lease(lease.name)) != lease.value:
                raise LeaseLost(f"lease {lease.name} token {lease.token} was taken over")
            pipe.multi()
            pipe.hset(keys.worker_state(lease.name),
                      mapping={"generation": lease.holder, "state": state})
            pipe.execute()
        finally:
            pipe.reset()
