"""Who read a user's profile, and when: the data behind ``profile.activity``.

Per (org, namespace, user): a sorted set of readers, each member the JSON ``[agent, client]``
scored by its last read in microseconds (exact in a double), and a hash member -> the op of that
last read. A reader is one entry however often it reads, so 20 entries name 20 readers. Each
record is one Lua script (``app/store/lua/activity_record.lua``) that also drops readers older
than the 30-day window and keeps at most ``MAX_READERS``, so the keys stay small without a sweep
job.

Reads by the console are not recorded: the activity answers "which client read my profile",
and the console is where that question is asked. The server decides that a read is the
console's (the console's own in-process call), never a header: a client naming itself
``loom-console`` is recorded under that name like any other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.clock import iso_from_ns
from app.store import keys
from app.store.identity import Identity
from app.store.lua import script
from app.store.replies import optional_texts, scored
from app.store.script_interfaces import ACTIVITY_RECORD

if TYPE_CHECKING:
    from app.store.services import StoreServices

CONSOLE_CLIENT = "loom-console"
RETENTION_DAYS = 30
MAX_READERS = 200
MAX_CLIENT_CHARS = 200
_DAY_US = 86_400 * 1_000_000


@dataclass(frozen=True, slots=True)
class Reader:
    agent: str
    client: str
    last_read_at_ns: int
    op: str

    def as_answer(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "client": self.client,
            "last_read_at": iso_from_ns(self.last_read_at_ns),
            "op": self.op,
        }


class ActivityStore:
    def __init__(self, services: StoreServices) -> None:
        self.redis = services.redis
        self.clock = services.clock
        self._record = script(self.redis, "activity_record")

    @staticmethod
    def _keys(identity: Identity) -> tuple[str, str]:
        """The user's readers (a sorted set) and each reader's last op (a hash)."""
        user = (identity.org, identity.namespace, identity.user_id)
        return keys.profile_reads(*user), keys.profile_reads_meta(*user)

    def record(self, identity: Identity, client: str, op: str, *, by_console: bool = False
               ) -> bool:
        """Note that ``identity.agent`` read the user's profile through ``op``; False when the
        read is the console's own (``by_console``) and is left out."""
        if by_console:
            return False
        now_us = self.clock.now_ns() // 1000
        member = json.dumps([identity.agent, client[:MAX_CLIENT_CHARS]], ensure_ascii=False)
        readers, last_op = self._keys(identity)
        self._record(*ACTIVITY_RECORD.ordered(
            {"readers": readers, "last_op": last_op},
            {"now_us": now_us, "member": member, "op": op,
             "cutoff_us": now_us - RETENTION_DAYS * _DAY_US, "most_readers": MAX_READERS},
        ))
        return True

    def readers(self, identity: Identity, lookback_days: int, limit: int = 20) -> list[Reader]:
        """The readers of the user's profile in the window, most recent first."""
        readers_key, meta_key = self._keys(identity)
        now_us = self.clock.now_ns() // 1000
        cutoff = now_us - lookback_days * _DAY_US
        found = scored(self.redis.zrevrangebyscore(
            readers_key, "+inf", cutoff, start=0, num=limit, withscores=True
        ))
        if not found:
            return []
        ops = optional_texts(self.redis.hmget(meta_key, [member for member, _ in found]))
        readers = []
        for (member, score), op in zip(found, ops, strict=True):
            agent, client = json.loads(member)
            readers.append(Reader(agent, client, int(score) * 1000, op or ""))
        return readers
