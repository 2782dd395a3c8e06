"""The Idempotency-Key records of write ops: a lease while a try runs, then the first answer.

``begin`` reserves a key for one try in a single script (so of two concurrent duplicates one
runs and the other is told so) or hands back what is already there: the first answer, that a
try still holds the key (its lease is live), that a try stopped without an answer, or that the
key came with a different body. A try holds the key for a short lease that ``renew`` extends
while it runs, so a try whose process died lets go within the lease. For an op whose one write
script keeps its answer in the record in the same step (``HeldKey``, the memory writes), a
lapsed lease proves the write never ran, and ``begin`` hands the key to the next try.
``KeyedScript`` is how a store's write script becomes such a step (``app.store.lua.keyed_script``).

A record lives under the hash tag of the subject its write touches (``KeyRecord.tag``: the
user's, an agent-state scope's, a namespace's), so on Redis Cluster it sits in the slot of the
write's keys, and an erasure of the user takes it with the user's other keys.
``settle`` stores the answer, marks the outcome unknown, or gives the key up; only the try
holding the reservation can settle it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import redis

from app.store import keys
from app.store.lua import (
    COMPARE_AND_SWAP_LOST,
    FENCE_LOST,
    LEASE_LOST,
    STATUS_ERRORS,
    keyed_script,
    raise_for_status,
    script,
)
from app.store.replies import optional_text as text_or_none
from app.store.replies import text
from app.store.script_interfaces import IDEMPOTENCY_BEGIN, IDEMPOTENCY_RENEW, IDEMPOTENCY_SETTLE

if TYPE_CHECKING:
    from app.store.services import StoreServices

DAY_MS = 24 * 3600 * 1000

State = Literal["NEW", "DONE", "RECORDED", "RUNNING", "UNKNOWN", "REUSED"]


@dataclass(frozen=True, slots=True)
class Begun:
    """What ``begin`` found: ``answer`` with DONE (the answer as stored) and RECORDED (the
    write script's reply), ``running_ms`` left of the holder's lease with RUNNING."""

    state: State
    answer: str | None = None
    running_ms: int = 0


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """Where one call's key is kept: the subject's hash tag (``keys.user_tag`` and kin), the
    caller, the op, the key."""

    tag: str
    caller: str
    op: str
    key: str

    @property
    def redis_key(self) -> str:
        return keys.idempotency(self.tag, self.caller, self.op, self.key)


@dataclass(slots=True)
class HeldKey:
    """The key a try holds, handed to a write script that keeps its answer in the record in
    the same step: the script writes only while ``holder`` holds the key, and the store sets
    ``answered`` once it has."""

    redis_key: str
    holder: str
    answered: bool = False


class KeyedScript:
    """A store's write script that, called with the ``HeldKey`` of a try, keeps its reply as
    the key's answer in its own step (and writes nothing once another try holds the key);
    without one it is the plain script. ``family`` names its refusals
    (``app.store.lua.STATUS_ERRORS``), which applied nothing and are not kept."""

    def __init__(self, client: redis.Redis, name: str, family: str) -> None:
        self.plain = script(client, name)
        self.keyed = keyed_script(client, name, family)
        self._refusals = {*STATUS_ERRORS.get(family, {}), COMPARE_AND_SWAP_LOST, FENCE_LOST,
                          LEASE_LOST}

    def __call__(self, keys: list[str], args: list[Any], held: HeldKey | None = None,
                 client: Any = None) -> Any:
        if held is None:
            return self.plain(keys=keys, args=args, client=client)
        reply = self.keyed(keys=[*keys, held.redis_key], args=[*args, held.holder],
                           client=client)
        self.note(reply, held)
        return reply

    def note(self, reply: Any, held: HeldKey) -> None:
        """Mark ``held`` answered when ``reply`` (of the keyed script) was kept."""
        if not (isinstance(reply, list) and reply and reply[0] in self._refusals):
            held.answered = True


def transact(client: Any, held: HeldKey | None, watched: list[str],
             write: Callable[[Any], Any]) -> Any:
    """``write(pipe)``'s reply, its writes made in one MULTI: ``write`` reads what it needs
    from the WATCHed keys, calls ``pipe.multi()``, queues its writes and returns its reply.
    With ``held`` (in the same slot) the record is WATCHed too, the try must hold it, and the
    reply is kept there in the same MULTI: the write-and-answer step of a store that writes
    by MULTI rather than by script. A WATCHed key that moved (a renewal of the lease, another
    writer) runs ``write`` again."""
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                if held is not None or watched:
                    pipe.watch(*watched, *([held.redis_key] if held is not None else []))
                if held is not None:
                    holder, state = pipe.hmget(held.redis_key, "holder", "state")
                    if text_or_none(holder) != held.holder or text_or_none(state) != "running":
                        raise_for_status("memory", [LEASE_LOST])
                reply = write(pipe)
                if held is not None:
                    pipe.hset(held.redis_key, mapping={
                        "state": "done", "reply": json.dumps(reply, ensure_ascii=False)})
                pipe.execute()
            except redis.WatchError:
                continue
            if held is not None:
                held.answered = True
            return reply


def kept_reply(kept: str) -> Any:
    """A keyed script's reply as its record keeps it (JSON), as Redis would have answered it."""
    return json.loads(kept)


class IdempotencyStore:
    def __init__(self, services: StoreServices) -> None:
        self.redis = services.redis
        self.clock = services.clock
        self._begin = script(self.redis, "idempotency_begin")
        self._settle = script(self.redis, "idempotency_settle")
        self._renew = script(self.redis, "idempotency_renew")

    def begin(self, record: KeyRecord, fingerprint: str, holder: str, lease_ms: int, *,
              recorded: bool = False) -> Begun:
        """Reserve the key for ``holder`` for ``lease_ms``, or say what holds it. With
        ``recorded`` (the op's write keeps its answer in the record), a lapsed lease hands the
        key to ``holder``; without, it is an outcome nobody will report."""
        reply = self._begin(*IDEMPOTENCY_BEGIN.ordered(
            {"record": record.redis_key},
            {"fingerprint": fingerprint, "holder": holder, "now_ms": self._now_ms(),
             "lease_ms": lease_ms, "life_ms": DAY_MS, "recorded": "1" if recorded else "0"}))
        state: State = text(reply[0])  # type: ignore[assignment]  # the script's words
        if state in ("DONE", "RECORDED"):
            return Begun(state, answer=text(reply[1]))
        if state == "RUNNING":
            return Begun(state, running_ms=int(reply[1]))
        return Begun(state)

    def renew(self, leases: list[tuple[KeyRecord, str]], lease_ms: int) -> int:
        """Extend the leases of these (record, holder) tries, one pipeline for all (one script
        per record: they live in their users' slots); how many are still held."""
        until = self._now_ms() + lease_ms
        if isinstance(self.redis, redis.RedisCluster):
            # A cluster pipeline does not load a script the node lacks: one call per lease.
            return sum(int(self._renew(*self._renewal(record, holder, until)))
                       for record, holder in leases)
        pipe = self.redis.pipeline(transaction=False)
        for record, holder in leases:
            self._renew(*self._renewal(record, holder, until), client=pipe)
        return sum(int(held) for held in pipe.execute())

    @staticmethod
    def _renewal(record: KeyRecord, holder: str, until: int) -> tuple[list[str], list[Any]]:
        return IDEMPOTENCY_RENEW.ordered({"record": record.redis_key},
                                         {"holder": holder, "lease_until_ms": until})

    def _now_ms(self) -> int:
        return self.clock.now_ns() // 1_000_000

    def finish(self, record: KeyRecord, holder: str, answer: str) -> bool:
        """Store the first answer; False when this call no longer holds the key."""
        return self._settled(record, holder, "done", answer)

    def abandon(self, record: KeyRecord, holder: str) -> bool:
        """The call ended without a known outcome: repeats are told so, never run again."""
        return self._settled(record, holder, "unknown")

    def release(self, record: KeyRecord, holder: str) -> bool:
        """Nothing was applied and nothing is to be answered again: the key is free."""
        return self._settled(record, holder, "release")

    def _settled(self, record: KeyRecord, holder: str, outcome: str, answer: str = "") -> bool:
        return bool(self._settle(*IDEMPOTENCY_SETTLE.ordered(
            {"record": record.redis_key},
            {"holder": holder, "outcome": outcome, "answer": answer})))
