"""The agent-state retention sweep (seed 002): removes expired states and fields from Redis.

Redis's own key expiry already drops a state ``retention.state`` days after its last write, and
reads never serve an expired field; the sweep removes expired fields from what is stored,
deletes a state whose expiry Redis has not applied yet, and prunes the indexes. It is
idempotent and safe beside live writes (see ``AgentStateStore.sweep``), so a duplicate run or
an RQ retry does no harm. It logs counts only: never a scope, a subject or content.
It uses no SCAN: the namespaces set and each namespace's indexes name every state key, so on
a Redis Cluster it reaches the states on every primary.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from app.job_registry import AGENT_STATE_SWEEP, declared_job
from app.logs import pass_level
from app.store.agent_state import AgentStateStore
from jobs.context import services
from jobs.periodic import Periodic

if TYPE_CHECKING:
    from app.settings import Settings

log = logging.getLogger("loom.jobs.agent_state_sweep")

FUNC = AGENT_STATE_SWEEP.func


@declared_job
def sweep(org: str | None = None, namespace: str | None = None) -> dict[str, Any]:
    """Sweep one namespace, or every namespace that ever held agent state."""
    store = services().store(AgentStateStore)
    targets = [(org, namespace)] if org and namespace else store.namespaces()
    totals = {"namespaces": 0, "states_removed": 0, "fields_removed": 0,
              "index_entries_removed": 0}
    for target_org, target_namespace in targets:
        counts = store.sweep(target_org, target_namespace)
        totals["namespaces"] += 1
        for name, count in counts.items():
            totals[name] += count
    log.log(
        pass_level(totals["states_removed"] or totals["fields_removed"]
                   or totals["index_entries_removed"]),
        "agent-state sweep: %(namespaces)d namespaces, %(states_removed)d states, "
        "%(fields_removed)d fields, %(index_entries_removed)d index entries removed",
        totals,
    )
    return totals


def periodic(settings: Settings) -> Periodic:
    """The schedule entry: every LOOM_AGENT_STATE_SWEEP_INTERVAL_SECONDS on the maintenance
    queue."""
    return Periodic.of(AGENT_STATE_SWEEP, settings.agent_state_sweep_interval_seconds)
