"""A periodic job's definition: what the scheduler registers, and each job module declares.

Data only, so a job module can say how often it runs without importing the scheduler, and the
scheduler imports the job modules without a circle.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

JOB_ID_PREFIX = "loom-periodic-"


@dataclass(frozen=True)
class Periodic:
    func: str
    queue: str
    interval_seconds: int
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def job_id(self) -> str:
        """Deterministic, from a hash of the definition: registering again adds nothing."""
        spec = json.dumps(
            [self.func, self.queue, self.interval_seconds, self.kwargs], sort_keys=True
        )
        return JOB_ID_PREFIX + hashlib.sha256(spec.encode()).hexdigest()[:16]
