"""The cost ledger per namespace, and each org's switch for model calls.

Counters are HINCRBY on one hash per namespace, so a worker adds a build's cost in one round
trip; ``usage.get`` reads it back whole.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.store import keys

if TYPE_CHECKING:
    from app.services import Services

COUNTERS = (
    "model_calls",
    "prompt_tokens",
    "completion_tokens",
    "builds",
    "skipped_unchanged",
    "refusals",
    "failures",
)


class UsageStore:
    def __init__(self, services: Services) -> None:
        self.redis = services.redis

    def add(self, org: str, namespace: str, **counts: int) -> None:
        unknown = set(counts) - set(COUNTERS)
        if unknown:
            raise ValueError(f"unknown usage counters: {sorted(unknown)}")
        pipe = self.redis.pipeline(transaction=False)
        key = keys.usage(org, namespace)
        for name, amount in counts.items():
            if amount:
                pipe.hincrby(key, name, amount)
        pipe.execute()

    def get(self, org: str, namespace: str) -> dict[str, int]:
        row = self.redis.hgetall(keys.usage(org, namespace))
        return {name: int(row.get(name, 0)) for name in COUNTERS}

    def model_calls_enabled(self, org: str) -> bool:
        return self.redis.hget(keys.org_settings(org), "model_calls") != "off"

    def set_model_calls(self, org: str, enabled: bool) -> None:
        self.redis.hset(keys.org_settings(org), "model_calls", "on" if enabled else "off")
