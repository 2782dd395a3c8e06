"""The cost ledger per namespace, and each org's switch for model calls.

Counters are HINCRBY on one hash per namespace, so a worker adds a build's cost in one round
trip; ``usage.get`` reads it back whole. Model calls and tokens are also added, by org, to
the job metrics that ``/metrics`` shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.store import keys
from app.store.idempotency import HeldKey, transact
from app.store.metrics import JobMetricsStore

if TYPE_CHECKING:
    from app.store.services import StoreServices

COUNTERS = (
    "model_calls",
    "prompt_tokens",
    "completion_tokens",
    "builds",
    "skipped_unchanged",
    "refusals",
    "failures",
    # Builds and folds not made because they would pass a budget (budget.set); not failures.
    "deferred_for_budget",
)


# The workers whose share of the counters the ledger also keeps apart.
# memory.ask's calls are made in the request, not by a worker, but are kept apart the same way.
WORKERS = ("structured_profile", "profile_consolidation", "recall_embeddings", "memory_ask")


# The ledger's counters that /metrics also shows, by org rather than by namespace.
METRIC_BY_COUNTER = {
    "model_calls": "loom_model_calls_total",
    "prompt_tokens": "loom_model_prompt_tokens_total",
    "completion_tokens": "loom_model_completion_tokens_total",
}


class UsageStore:
    def __init__(self, services: StoreServices) -> None:
        self.redis = services.redis
        self._services = services

    def add(self, org: str, namespace: str, *, worker: str | None = None,
            **counts: int) -> None:
        """Add to the namespace's counters; with ``worker`` (one of WORKERS), to that
        worker's share of them too, in the same round trip."""
        unknown = set(counts) - set(COUNTERS)
        if unknown:
            raise ValueError(f"unknown usage counters: {sorted(unknown)}")
        if worker is not None and worker not in WORKERS:
            raise ValueError(f"unknown worker: {worker}")
        pipe = self.redis.pipeline(transaction=False)
        key = keys.usage(org, namespace)
        for name, amount in counts.items():
            if amount:
                pipe.hincrby(key, name, amount)
                if worker is not None:
                    pipe.hincrby(key, f"{worker}:{name}", amount)
        pipe.execute()
        by_org = {METRIC_BY_COUNTER[name]: amount for name, amount in counts.items()
                  if name in METRIC_BY_COUNTER}
        if any(by_org.values()):
            self._services.store(JobMetricsStore).add_by_org(org, by_org)

    def get(self, org: str, namespace: str) -> dict[str, int]:
        row = self.redis.hgetall(keys.usage(org, namespace))
        return {name: int(row.get(name, 0)) for name in COUNTERS}

    def by_worker(self, org: str, namespace: str) -> dict[str, dict[str, int]]:
        """Each worker's share of the counters (what it cost, apart from the other)."""
        row = self.redis.hgetall(keys.usage(org, namespace))
        return {worker: {name: int(row.get(f"{worker}:{name}", 0)) for name in COUNTERS}
                for worker in WORKERS}

    def model_calls_enabled(self, org: str) -> bool:
        return self.redis.hget(keys.org_settings(org), "model_calls") != "off"

    def set_model_calls(self, org: str, enabled: bool, held: HeldKey | None = None) -> None:
        """Switch the org's model calls; with ``held`` (an Idempotency-Key in the org's slot)
        the key keeps the reply in the same MULTI."""

        def write(pipe: Any) -> bool:
            pipe.multi()
            pipe.hset(keys.org_settings(org), "model_calls", "on" if enabled else "off")
            return enabled

        transact(self.redis, held, [], write)
