"""The census: the last step of an erasure, a search for anything of the user left anywhere.

It runs the sweep's searches again without removing (keys under the user's tag on every
primary, pointers, the namespace's sets and vector set), then the agent-state subject indexes,
every RQ job, the tokens pinned to the user and the workers' state. Anything found fails the
erasure closed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.store import keys
from app.store.erasure import leftovers
from app.store.erasure.receipt import Census, zero_counts
from app.store.erasure.run import ErasureRun
from app.store.erasure.worker_state import scrub_stored
from app.store.tokens import TokenStore

if TYPE_CHECKING:
    from app.store.services import StoreServices

_SAMPLE = ("o", "n", "u")
# What a key of the user's slot holds, from its builder's prefix.
_KIND_OF_PREFIX = {
    keys.prefix_of(keys.memory_row(*_SAMPLE, "a", "s", "k")): "row",
    # A row's versions are counted from its version order, which lists every one (the
    # versions hash holds the earlier ones only).
    keys.prefix_of(keys.memory_version_order(*_SAMPLE, "a", "s", "k")): "versions",
    keys.prefix_of(keys.memory_versions(*_SAMPLE, "a", "s", "k")): "snapshots",
    keys.prefix_of(keys.working_memory_scope(*_SAMPLE, "a", "s", "r")): "blocks",
    keys.prefix_of(keys.profile_reads(*_SAMPLE)): "activity",
}
# What the census reports a leftover key as; anything else under the tag is an index entry.
_CENSUS_KIND = {
    "row": "memory_rows",
    "versions": "memory_versions",
    "snapshots": "memory_versions",
    "blocks": "working_memory_blocks",
    "activity": "activity_entries",
    "index": "index_entries",
}


def kind_of(key: str) -> str:
    return _KIND_OF_PREFIX.get(keys.prefix_of(key), "index")


def take_census(services: StoreServices, run: ErasureRun) -> Census:
    client = services.redis
    found = zero_counts()
    for key in leftovers.user_keys(client, run):
        found[_CENSUS_KIND[kind_of(key)]] += 1
    found["index_entries"] += leftovers.pointers_naming(client, run, remove=False)
    found["index_entries"] += leftovers.namespace_sets(client, run, remove=False)
    found["index_entries"] += leftovers.namespace_vectors(client, run, remove=False)
    states, entries = leftovers.agent_state_left(client, run)
    found["agent_states"] += states
    found["index_entries"] += entries
    found["jobs"] += sum(1 for _job in services.jobs.jobs_about(*run.user))
    found["tokens"] += len(services.store(TokenStore).pinned_to(*run.user))
    found["index_entries"] += scrub_stored(client, *run.user, remove=False)
    return Census(found, services.clock.now_ns())
