"""A periodic job's definition: what the scheduler registers, and each job module declares.

Data only, so a job module can say how often it runs without importing the scheduler, and the
scheduler imports the job modules without a circle.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from app.job_registry import PERIODIC_TIMEOUT_SECONDS, PeriodicSpec

JOB_ID_PREFIX = "loom-periodic-"
# A finished periodic job's hash (its last results) is kept this many intervals, and at least
# an hour: rq-scheduler drops a schedule whose hash expired, and each run sets the expiry
# again, so the hash outlives ten missed ticks; a scheduler tick puts back one that expired.
RESULT_KEEP_INTERVALS = 10
RESULT_KEEP_FLOOR_SECONDS = 3600


@dataclass(frozen=True)
class Periodic:
    func: str
    queue: str
    interval_seconds: int
    kwargs: dict[str, Any] = field(default_factory=dict)
    timeout: int = PERIODIC_TIMEOUT_SECONDS

    @classmethod
    def of(cls, spec: PeriodicSpec, interval_seconds: int) -> Periodic:
        """The schedule entry of a declared periodic job (``app.job_registry.PERIODIC``)."""
        return cls(spec.func, spec.queue, interval_seconds, timeout=spec.timeout)

    @property
    def result_ttl(self) -> int:
        """How long RQ keeps the job's hash after a run (its ``result_ttl``)."""
        return max(RESULT_KEEP_FLOOR_SECONDS, RESULT_KEEP_INTERVALS * self.interval_seconds)

    @property
    def job_id(self) -> str:
        """Deterministic, from a hash of the definition: registering again adds nothing."""
        spec = json.dumps(
            [self.func, self.queue, self.interval_seconds, self.kwargs], sort_keys=True
        )
        return JOB_ID_PREFIX + hashlib.sha256(spec.encode()).hexdigest()[:16]
