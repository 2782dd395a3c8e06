"""The Idempotency-Key records of write ops: a reservation, then the first answer, for a day.

``begin`` reserves a key for one call in a single script (so of two concurrent duplicates one
runs and the other is told so) or hands back what is already there: the first answer, that the
first call is still running, that it stopped without an answer, or that the key came with a
different body. ``settle`` stores the answer, marks the outcome unknown, or gives the key up;
only the call holding the reservation can settle it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from app.store import keys
from app.store.lua import script
from app.store.replies import text

if TYPE_CHECKING:
    from app.store.services import StoreServices

DAY_MS = 24 * 3600 * 1000

State = Literal["NEW", "DONE", "RUNNING", "UNKNOWN", "REUSED"]


@dataclass(frozen=True, slots=True)
class Begun:
    """What ``begin`` found: ``answer`` with DONE, ``running_ms`` left with RUNNING."""

    state: State
    answer: str | None = None
    running_ms: int = 0


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """Where one call's key is kept: the identity's slot, the caller, the op, the key."""

    org: str
    namespace: str
    user_id: str
    caller: str
    op: str
    key: str

    @property
    def redis_key(self) -> str:
        return keys.idempotency(self.org, self.namespace, self.user_id, self.caller, self.op,
                                self.key)


class IdempotencyStore:
    def __init__(self, services: StoreServices) -> None:
        self.redis = services.redis
        self.clock = services.clock
        self._begin = script(self.redis, "idempotency_begin")
        self._settle = script(self.redis, "idempotency_settle")

    def begin(self, record: KeyRecord, fingerprint: str, holder: str,
              running_ms: int) -> Begun:
        now_ms = self.clock.now_ns() // 1_000_000
        reply = self._begin(keys=[record.redis_key],
                            args=[fingerprint, holder, now_ms, running_ms, DAY_MS])
        state: State = text(reply[0])  # type: ignore[assignment]  # the script's words
        if state == "DONE":
            return Begun(state, answer=text(reply[1]))
        if state == "RUNNING":
            return Begun(state, running_ms=int(reply[1]))
        return Begun(state)

    def finish(self, record: KeyRecord, holder: str, answer: str) -> bool:
        """Store the first answer; False when this call no longer holds the key."""
        return bool(self._settle(keys=[record.redis_key], args=[holder, "done", answer]))

    def abandon(self, record: KeyRecord, holder: str) -> bool:
        """The call ended without a known outcome: repeats are told so, never run again."""
        return bool(self._settle(keys=[record.redis_key], args=[holder, "unknown"]))

    def release(self, record: KeyRecord, holder: str) -> bool:
        """Nothing was applied and nothing is to be answered again: the key is free."""
        return bool(self._settle(keys=[record.redis_key], args=[holder, "release"]))
