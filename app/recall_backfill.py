"""Recall's backfill: one path that brings facts' index entries up to date, and one loop that
requests the embeddings jobs of the users whose facts wait for a vector.

``backfill_fact`` is the indexing path: ``MemoryStore.backfill`` brings one row's lexical entry
up to this release's terms and lists it for a vector when it has none, keeping its content and
last change. ``memory.backfill`` runs it for the row it names and then requests that user's
job; ``flask loom recall backfill`` (``backfill_all``) runs it for every live row of every user,
after moving each lexical index onto the current posting layout, and then requests the jobs of
every user with facts due, once.

``request_jobs`` is the loop the op, the command and the periodic sweep (jobs/recall_embed.py)
share: for each user, in the order given, it skips an org whose model calls are switched off
(read once an org) and requests the user's job (``RecallVectorStore.request``, which looks up
the job a queued marker names, so a job lost to a fault is enqueued again), up to a limit of
jobs requested.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from app.errors import LoomError
from app.store.idempotency import HeldKey
from app.store.memory import MemoryStore, Written
from app.store.memory_row import Location
from app.store.recall import RecallStore
from app.store.recall_vectors import DueUser, RecallVectorStore
from app.store.usage import UsageStore

if TYPE_CHECKING:
    from app.services import Services

# Rows one read of a user's live rows takes during the backfill of every user.
ROWS_PER_READ = 200


@dataclass
class Requested:
    """What a run of the loop did: users looked at, jobs enqueued, users whose job waits in
    the queue already, users of an org with model calls off; and the last user reached (its
    place in the sweep's turn order)."""

    users_due: int = 0
    requested: int = 0
    already_queued: int = 0
    model_off: int = 0
    reached: str = ""

    def counts(self) -> dict[str, int]:
        found = asdict(self)
        found.pop("reached")
        return found


def request_jobs(services: Services, users: Iterable[DueUser],
                 limit: int | None = None) -> Requested:
    """Request the embeddings job of each user in turn (see the module); at most ``limit``
    jobs are enqueued. With no endpoint configured nothing is requested."""
    vectors = services.store(RecallVectorStore)
    usage = services.store(UsageStore)
    totals = Requested()
    calls_on: dict[str, bool] = {}
    for user in users:
        totals.users_due += 1
        if not vectors.enabled or (limit is not None and totals.requested >= limit):
            continue
        totals.reached = user.position
        if user.org not in calls_on:
            calls_on[user.org] = usage.model_calls_enabled(user.org)
        if not calls_on[user.org]:
            totals.model_off += 1
        elif vectors.request(user.org, user.namespace, user.user_id, recover=True):
            totals.requested += 1
        else:
            totals.already_queued += 1
    return totals


def backfill_fact(services: Services, location: Location, *, written_by: str,
                  memory_id: str = "", held: HeldKey | None = None) -> Written:
    """The indexing path for one row (``MemoryStore.backfill``; ``held`` the call's
    Idempotency-Key record, answered in the same script); no job is requested here."""
    return services.store(MemoryStore).backfill(location, written_by=written_by,
                                                memory_id=memory_id, held=held,
                                                request_vectors=False)


def backfill_one(services: Services, location: Location, *, written_by: str,
                 memory_id: str = "", held: HeldKey | None = None) -> Written:
    """``memory.backfill``: the row's entry brought up to date, then its user's job requested
    through the loop when the user has facts waiting for a vector."""
    written = backfill_fact(services, location, written_by=written_by, memory_id=memory_id,
                            held=held)
    vectors = services.store(RecallVectorStore)
    if vectors.due_count(location.org, location.namespace, location.user_id):
        request_jobs(services, [DueUser("", location.org, location.namespace,
                                        location.user_id)])
    return written


@dataclass
class Backfilled:
    """What ``backfill_all`` did."""

    indexed_users: int = 0
    moved_to_layout: int = 0
    users: int = 0
    rows: int = 0
    changed: int = 0
    refused: int = 0
    jobs: Requested | None = None

    def as_dict(self) -> dict[str, Any]:
        found = asdict(self)
        found["jobs"] = None if self.jobs is None else self.jobs.counts()
        return found


def backfill_all(services: Services, *, written_by: str, vectors: bool = True,
                 progress: Callable[[str], None] | None = None) -> Backfilled:
    """Every user's lexical index onto the current layout, every live row through
    ``backfill_fact``, then (``vectors``) one run of the loop over every user with facts due.
    Each step is bounded and idempotent: run again after an interruption, it goes on."""
    say = progress or (lambda _line: None)
    recall = services.store(RecallStore)
    memory = services.store(MemoryStore)
    done = Backfilled()
    for org, namespace, user_id in recall.indexed_users():
        done.indexed_users += 1
        done.moved_to_layout += recall.relayout(org, namespace, user_id)
    say(f"lexical index: {done.indexed_users} users, {done.moved_to_layout} facts moved to "
        "the current layout")
    for org, namespace, user_id in memory.users_with_rows():
        done.users += 1
        after: str | None = None
        while True:
            batch, more = memory.scan_rows(org, namespace, user_id, after=after,
                                           batch=ROWS_PER_READ, live_type="")
            for member, row in batch:
                after = member
                if row is None:
                    continue
                done.rows += 1
                location = Location(org, namespace, row.user_id, row.agent, row.session_id,
                                    row.key)
                try:
                    written = backfill_fact(services, location, written_by=written_by,
                                            memory_id=row.memory_id)
                except LoomError:
                    # A locked row (a backfill writes a version, which a lock refuses), or one
                    # deleted or erased since it was read: left as it is.
                    done.refused += 1
                    continue
                done.changed += written.changed
            if not more:
                break
    say(f"rows: {done.rows} live rows of {done.users} users, {done.changed} entries brought "
        f"up to date, {done.refused} left (locked or gone)")
    store = services.store(RecallVectorStore)
    if vectors and not store.enabled:
        say("vectors: no embeddings endpoint (LOOM_EMBED_*); nothing enqueued")
    elif vectors:
        done.jobs = request_jobs(services, store.users_due())
        say("vectors: {users_due} users with facts waiting, {requested} jobs enqueued, "
            "{already_queued} already queued, {model_off} with model calls off".format(
                **done.jobs.counts()))
    return done
