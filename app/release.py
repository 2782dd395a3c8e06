"""The release step: every upgrade a store written by an earlier Loom version needs, in order,
run once per deploy before the new version serves (the Procfile's ``release:`` line,
``python -m app.release``; also ``flask loom release``).

Each step is idempotent and works in bounded pieces beside live traffic, so the step may run
twice, be interrupted and run again, and run while the old version still serves (a platform's
release phase runs before the new processes start). A second run finds nothing to do and says
so. A failure (a bad setting, the store unreachable) exits non-zero, which stops a platform's
deploy before the new version replaces the one serving.

A move that a process of the earlier version could not read is not a release step but a
*contract* step, run by ``python -m app.release --contract`` once no process of the earlier
version serves (after the deploy): this version reads both forms, so until then the store works
unmoved, and no earlier-version process ever meets a form it does not know.

Steps, in order (every run):

- ``recall``: each user's lexical index onto the current posting layout, and every live fact's
  recall entry up to this version's terms (``app.recall_backfill.backfill_all``; the
  facts waiting for a vector are left to the periodic embeddings sweep, which requests them at
  its pace).

Contract steps (``--contract``), after those:

- ``memory layout``: every row and its versions onto the row layout that stores a row's current
  version once (in the row) and no field at its default, and every memory_id pointer key into
  its namespace's pointer hash (``MemoryStore.relayout_user``, ``MemoryStore.move_pointers``).
  An earlier-version process would miss a moved row's current version in history, drop it when
  it rewrote the row, and not find a moved pointer: hence after the deploy.

A version that changes a stored format adds its step here, after the ones before it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.store.connection import UNAVAILABLE_ERRORS

if TYPE_CHECKING:
    from app.services import Services


@dataclass(frozen=True)
class StepResult:
    name: str
    changed: int  # what the step wrote: 0 when the store was already up to date
    summary: str


def recall_step(services: Services, say: Callable[[str], None]) -> StepResult:
    from app.recall_backfill import backfill_all

    done = backfill_all(services, written_by="loom-release", vectors=False, progress=say)
    return StepResult(
        "recall", done.moved_to_layout + done.changed,
        f"{done.moved_to_layout} facts moved to the current index layout, {done.changed} "
        f"recall entries brought up to date ({done.rows} live facts of {done.users} users)")


def memory_layout_step(services: Services, say: Callable[[str], None]) -> StepResult:
    from app.store.memory import MemoryStore

    memory = services.store(MemoryStore)
    users = rows = 0
    for org, namespace, user_id in memory.users_with_rows():
        users += 1
        rows += memory.relayout_user(org, namespace, user_id)
    say(f"memory layout: {rows} rows of {users} users moved")
    pointers = memory.move_pointers()
    return StepResult(
        "memory layout", rows + pointers,
        f"{rows} rows moved to the current row layout ({users} users), {pointers} memory_id "
        "pointers moved into their namespace's pointer hash")


Step = Callable[["Services", Callable[[str], None]], StepResult]

# Safe beside a process of the earlier version: every release runs them.
STEPS: tuple[Step, ...] = (recall_step,)
# Moves only this version reads: run with --contract once the earlier version has stopped.
CONTRACT_STEPS: tuple[Step, ...] = (memory_layout_step,)


def run_release(services: Services, say: Callable[[str], None] = print, *,
                contract: bool = False) -> list[StepResult]:
    """Every step, in order (and the contract steps after them with ``contract``); what each
    did."""
    results = []
    for step in STEPS + (CONTRACT_STEPS if contract else ()):
        result = step(services, lambda line: say(f"release: {line}"))
        say(f"release: {result.name}: {result.summary}")
        results.append(result)
    if not any(result.changed for result in results):
        say("release: the store was up to date; nothing written")
    return results


def main(argv: list[str] | None = None) -> int:
    import argparse

    from app.logs import configure_logging
    from app.services import Services
    from app.settings import SettingsError, load_settings
    from app.store.connection import RedisUrlMissing

    parser = argparse.ArgumentParser(
        prog="python -m app.release", description="The upgrade steps of this Loom version.")
    parser.add_argument(
        "--contract", action="store_true",
        help="also run the moves only this version reads (the row layout); run it once no "
             "process of the earlier version serves, after the deploy")
    options = parser.parse_args(argv)
    configure_logging()
    try:
        # The processes' own services, as a worker builds them: the release needs no web app.
        services = Services(load_settings())
    except (SettingsError, RedisUrlMissing) as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 2
    try:
        run_release(services, lambda line: print(line, flush=True), contract=options.contract)
    except UNAVAILABLE_ERRORS as exc:
        # The deploy stops here, and the version serving goes on: nothing half-done is lost,
        # since every step resumes where it stopped.
        print(f"release: the store failed ({type(exc).__name__}: {exc}); nothing after this "
              "point ran: run the release again once the store answers", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
