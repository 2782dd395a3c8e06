"""What an erasure reports: the kinds it counts, its steps, the census and the receipt.

The receipt is the answer of ``user.erase`` and ``erasure.status``: counts, census, times and
progress, never the user id.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.clock import iso_from_ns

KINDS = (
    "memory_rows",
    "memory_versions",
    "profile_sections",
    "structured_profiles",
    "working_memory_blocks",
    "agent_states",
    "activity_entries",
    "jobs",
    "tokens",
    "index_entries",
)
STEPS = (
    "mark",
    "memory",
    "working_memory",
    "activity",
    "agent_state",
    "jobs",
    "tokens",
    "worker_state",
    "sweep",
    "census",
)
# Fields of the erasure's record that exist only while a run is due: what the background job
# needs to find the user. They leave the record when the erasure is done.
RUN_FIELDS = ("run_user", "run_subjects", "run_actor")


def zero_counts() -> dict[str, int]:
    return dict.fromkeys(KINDS, 0)


@dataclass
class Census:
    found: dict[str, int] = field(default_factory=dict)
    checked_at: int = 0

    @property
    def clean(self) -> bool:
        return not any(self.found.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "found": {kind: n for kind, n in self.found.items() if n},
            "checked_at": iso_from_ns(self.checked_at) if self.checked_at else None,
        }


def receipt_of(erasure: str, record: Mapping[str, str], alive: bool) -> dict[str, Any]:
    """The receipt of an erasure's record; ``alive``: a run holds the lock or its job waits for
    a worker. A record that says running with nothing alive behind it is ``interrupted``."""
    status = record.get("status", "")
    if status == "running" and not alive:
        status = "interrupted"  # its worker died: the resume pass, or user.erase, runs it again
    counts = zero_counts()
    counts.update({k: int(v) for k, v in json.loads(record.get("counts") or "{}").items()
                   if k in counts})

    def time_of(name: str) -> str | None:
        raw = record.get(name)
        return iso_from_ns(int(raw)) if raw else None

    step = record.get("step", "")
    steps_done = STEPS.index(step) + 1 if step in STEPS else 0
    if status == "running":
        current = STEPS[steps_done] if steps_done < len(STEPS) else "finishing"
    else:
        current = ""
    census = json.loads(record["census"]) if record.get("census") else None
    return {
        "erasure_id": erasure,
        "status": status,
        "retryable": status in ("failed", "interrupted"),
        "step": step,
        "current_step": current,
        "steps_done": steps_done,
        "steps_total": len(STEPS),
        "attempts": int(record.get("attempts") or 0),
        "started_at": time_of("started_at"),
        "finished_at": time_of("finished_at"),
        "updated_at": time_of("updated_at"),
        "counts": counts,
        "census": census,
        "aof_rewrite": record.get("aof_rewrite", ""),
        "error": record.get("error", ""),
    }
