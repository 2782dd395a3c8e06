"""The profile_consolidation worker: folds each user's preference and decision facts into the
profile section ``consolidated_profile`` (seed 000, Profiles, "Folding facts into a profile").

Off by default (``LOOM_PROFILE_CONSOLIDATION_ENABLED``); when on, ``jobs.scheduler`` runs
``run_pass`` every ``LOOM_PROFILE_CONSOLIDATION_INTERVAL_SECONDS``. A pass holds the worker
lease, so two passes never fold at once, and visits the users the fold's own change list
(``app.store.consolidation``) names, namespace after namespace from where the last pass
stopped.

``fold_user`` is one fold, with these rules:

* Sources: the user's current ``preference`` and ``decision`` facts under the filter every
  profile fold shares (never ``high``, a duplicate, ``about:other``, an ``attribute:*``
  protected attribute, ``forget``, redacted or expired), most confident and newest first, at
  most ``FOLD_MEMORY_LIMIT`` of them in the prompt.
* An unchanged user (the fold digest of those facts equals the last fold's) costs no model
  call: the ledger counts ``skipped_unchanged``.
* A user with no such facts gets no model call: a section the fold wrote is emptied (its trace
  names no ids), and a user without a section gets nothing written, so an erased user gets no
  new row.
* The section is written with provenance ``derived``, ``source_trace``
  ``profile.fold:consolidated_profile:<ids of the facts the model read>`` and actor
  ``worker:profile_consolidation``, as a compare-and-swap on the version read. A locked,
  pinned or ``high`` section refuses (checked before the call, so it costs none), and so does
  one whose ``char_limit`` the answer passes or a row of another type at the key; a refused or
  cut-off fold is not tried again until the facts or the section change. A fact the fold read
  that is no longer current once the model answered (edited, deleted, erased meanwhile) means
  nothing is written.
* No model configured, or model calls switched off for the org: no call, the user stays
  listed. A failed fold (a model error, an answer without its text) waits as a failed
  structured build does: LOOM_STRUCTURED_PROFILE_BACKOFF_BASE_SECONDS, doubling up to
  LOOM_STRUCTURED_PROFILE_BACKOFF_CAP_SECONDS; a refused one is tried again after
  LOOM_STRUCTURED_PROFILE_REFUSAL_RETRY_SECONDS even when nothing changed.
* The call draws on the namespace's and the org's model-call budgets (``app.model.budget``): one
  that would pass either is not made, the user keeps its place, and the pass skips the rest of
  that namespace (or, for the org's budget, of that org).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from app.errors import LoomError, UserBeingErased
from app.job_registry import CONSOLIDATION_PASS, declared_job
from app.model.budget import OutOfBudget, complete_within_budget
from app.model.chat import base_max_tokens, parse_max_tokens_overrides, provider_from_settings
from app.model.errors import ModelCallFailed
from app.profile_schema import max_tokens_for
from app.services import Services
from app.store.consolidation import (
    SECTION_KEY,
    TRACE_PREFIX,
    WORKER,
    ConsolidationStore,
    FoldSources,
    refusal_fingerprint,
    section_location,
)
from app.store.lease import CONSOLIDATION_LEASE, LeaseLost, LeaseStore
from app.store.memory import DEFAULT_PROFILE_CHAR_LIMIT, Content, MemoryRow, MemoryStore
from app.store.memory import VersionMoved as SectionWrittenMeanwhile
from app.store.metrics import record_pass
from app.store.usage import UsageStore
from jobs.context import services
from jobs.planner import PlannerSettings, next_backoff

# The worker this module's costs are counted under in the ledger (usage.get by_worker).
USAGE_WORKER = "profile_consolidation"

log = logging.getLogger("loom.jobs.consolidation")

LEASE = CONSOLIDATION_LEASE
PASS_FUNC = CONSOLIDATION_PASS.func
# Most facts one fold puts in the prompt (the digest still covers them all).
FOLD_MEMORY_LIMIT = 100
# Most model calls, and most users looked at, in one pass; the rest wait for the next.
MAX_FOLDS_PER_PASS = 100
MAX_VISITS_PER_PASS = 1000
# The summary the model is asked for; the output cap is sized from it as the seed sizes a
# structured profile's: LLM_MAX_TOKENS (entry consolidated_profile) plus the answer's estimate.
SUMMARY_MAX_CHARS = 1000
ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "profile": {
            "type": "string",
            "maxLength": SUMMARY_MAX_CHARS,
            "description": "A short summary of the user's preferences and decisions.",
        },
    },
    "required": ["profile"],
    "additionalProperties": False,
}


class Outcome(StrEnum):
    FOLDED = "folded"  # the section was written
    UNCHANGED = "unchanged"  # nothing to write: no call, or the same text
    REFUSED = "refused"  # the section is locked, pinned or high, or the answer was cut off
    WAITING = "waiting"  # refused before and nothing changed since: not tried
    MODEL_OFF = "model_off"  # no model configured, or the org switched calls off
    FAILED = "failed"  # the call failed or its answer is unusable
    RACED = "raced"  # a fact or the section changed under the fold: the next pass folds again
    ERASING = "erasing"  # the user is being erased
    DEFERRED = "deferred"  # the call would pass a model-call budget: folded once there is room


@dataclass(frozen=True)
class FoldResult:
    outcome: Outcome
    model_calls: int = 0
    detail: str = ""


def _prompt(facts: list[MemoryRow]) -> list[dict[str, str]]:
    lines = [
        json.dumps({"id": row.memory_id, "type": row.memory_type, "confidence": row.confidence,
                    "fact": row.value}, ensure_ascii=False)
        for row in facts
    ]
    return [
        {
            "role": "system",
            "content": (
                "Write a short profile of a user from their stated preferences and decisions, "
                "for an agent to read before it answers them. Keep every preference and "
                "decision that still holds; when two disagree, keep the earlier one in the "
                f"list. At most {SUMMARY_MAX_CHARS} characters of plain text. Answer with one "
                'JSON object: {"profile": "<the text>"}.'
            ),
        },
        {"role": "user", "content": "Facts, most confident and most recent first, one JSON "
                                    "object per line:\n" + "\n".join(lines)},
    ]


def _ordered(sources: FoldSources) -> list[MemoryRow]:
    def order(item: tuple[MemoryRow, str]) -> tuple[float, int, str]:
        _sha, confidence, date_ns = item[1].split(":")
        return (-float(confidence), -int(date_ns), item[0].memory_id)

    return [row for row, _ in sorted(sources.facts, key=order)[:FOLD_MEMORY_LIMIT]]


def _refusal(section: MemoryRow | None) -> str:
    """Why the section's row would refuse the fold's write ('' when it would not): a lock (even
    on a tombstone), a live pin or ``high`` label, or a live row of another type at the key."""
    if section is None:
        return ""
    if section.locked:
        return "the section is locked"
    if section.live and (section.pinned or section.label == "high"):
        return "the section is pinned or labelled high"
    if section.live and section.memory_type != "profile":
        return f"a {section.memory_type} row holds the key"
    return ""


def fold_user(svc: Services, org: str, namespace: str, user_id: str) -> FoldResult:
    settings = svc.settings
    memory = svc.store(MemoryStore)
    folds = svc.store(ConsolidationStore)
    usage = svc.store(UsageStore)
    read_at = svc.clock.now_ns()

    if memory.source_digest(org, namespace, user_id).expiry_due(read_at):
        memory.expire_sources(org, namespace, user_id)
    sources = folds.sources(org, namespace, user_id, read_at)
    if sources.torn:
        return FoldResult(Outcome.RACED, detail="a fact was written while the fold read")
    digest = sources.digest
    record = folds.record(org, namespace, user_id)
    if record is not None and record.digest == digest:
        folds.clear_changed(org, namespace, user_id, read_at, sources.source_digest)
        usage.add(org, namespace, worker=USAGE_WORKER, skipped_unchanged=1)
        return FoldResult(Outcome.UNCHANGED, detail="facts unchanged since the last fold")

    location = section_location(org, namespace, user_id)
    section = memory.read(location)
    live = section is not None and section.live
    fingerprint = refusal_fingerprint(digest, section.version if section is not None else 0)
    waits = PlannerSettings.from_settings(settings)
    if record is not None and record.refused == fingerprint and (
            read_at < record.refused_at + int(waits.refusal_retry_seconds * 1e9)):
        # Tried again once the facts or the section move, or the refusal retry passed (a
        # lock that lapses on its own), as a structured build is.
        folds.requeue(org, namespace, user_id, read_at)
        return FoldResult(Outcome.WAITING, detail="refused before; nothing changed since")
    if record is not None and read_at < record.retry_at:
        # A failed fold waits its backoff (doubling to the cap), whatever changed meanwhile.
        folds.requeue(org, namespace, user_id, read_at)
        return FoldResult(Outcome.WAITING, detail="failed before; waiting its backoff")
    refusal = _refusal(section)
    if refusal:
        # Checked before the call, so a section that refuses costs no model call.
        folds.record_refusal(org, namespace, user_id, fingerprint)
        folds.requeue(org, namespace, user_id, read_at)
        usage.add(org, namespace, worker=USAGE_WORKER, refusals=1)
        return FoldResult(Outcome.REFUSED, detail=refusal)

    if not sources.facts:
        ours = (section is not None and record is not None
                and section.content_sha256 == record.content_sha256)
        if not live or not ours:
            # No facts and no section of the fold's: write nothing (an erased user gets no
            # new row; a section a caller wrote stays theirs until there is something to fold).
            folds.clear_changed(org, namespace, user_id, read_at, sources.source_digest)
            return FoldResult(Outcome.UNCHANGED, detail="no facts and no folded section")
        # Every folded fact is gone: empty the section without a model call.
        return _write(svc, org, namespace, user_id, section, "", [], sources, read_at, 0)

    provider = provider_from_settings(settings.llm_base_url, settings.llm_api_key,
                                      settings.llm_model, settings.llm_timeout_seconds)
    if provider is None or not usage.model_calls_enabled(org):
        if provider is not None:
            provider.close()
        # Stays listed (at the back), folded once calls are possible again.
        folds.requeue(org, namespace, user_id, read_at)
        return FoldResult(Outcome.MODEL_OFF, detail="no model configured, or calls off")

    facts = _ordered(sources)
    overrides = parse_max_tokens_overrides(settings.llm_max_tokens_overrides)
    max_tokens = max_tokens_for(ANSWER_SCHEMA, base_max_tokens(SECTION_KEY, overrides))
    try:
        with provider:
            completion = complete_within_budget(
                svc, org, namespace, provider, _prompt(facts), max_tokens=max_tokens,
                json_schema=ANSWER_SCHEMA, schema_name=SECTION_KEY,
                worker="profile_consolidation")
    except OutOfBudget as out:
        # Not a failure: the user keeps its place in the list (oldest change first), and the
        # pass leaves the rest of the namespace, or of the org, to a pass with room.
        return FoldResult(Outcome.DEFERRED, detail=out.scope)
    except ModelCallFailed as error:
        usage.add(org, namespace, worker=USAGE_WORKER, model_calls=1, failures=1)
        folds.record_failure(org, namespace, user_id, lambda n: next_backoff(n, waits))
        folds.requeue(org, namespace, user_id, read_at)
        log.warning("profile_consolidation: fold failed for a user of %s/%s: %s",
                    org, namespace, error)
        return FoldResult(Outcome.FAILED, 1, str(error))
    usage.add(org, namespace, worker=USAGE_WORKER, model_calls=1,
              prompt_tokens=completion.prompt_tokens or 0,
              completion_tokens=completion.completion_tokens or 0)
    if completion.cut_off:
        folds.record_refusal(org, namespace, user_id, fingerprint)
        folds.requeue(org, namespace, user_id, read_at)
        usage.add(org, namespace, worker=USAGE_WORKER, refusals=1)
        return FoldResult(Outcome.REFUSED, 1, "answer cut off at the output cap")
    text = (completion.data or {}).get("profile")
    if not isinstance(text, str):
        usage.add(org, namespace, worker=USAGE_WORKER, failures=1)
        folds.record_failure(org, namespace, user_id, lambda n: next_backoff(n, waits))
        folds.requeue(org, namespace, user_id, read_at)
        return FoldResult(Outcome.FAILED, 1, 'the answer has no "profile" text')

    # A fact read before the call that is no longer current makes the answer unsafe to keep.
    read_ids = [row.memory_id for row in facts]
    now_entries = folds.current_entries(org, namespace, user_id, read_ids)
    if any(now_entries[mid] != sources.entries[mid] for mid in read_ids):
        return FoldResult(Outcome.RACED, 1, "a fact it read changed while the model ran")
    return _write(svc, org, namespace, user_id, section, text.strip(), read_ids, sources,
                  read_at, 1)


def _write(
    svc: Services, org: str, namespace: str, user_id: str, section: MemoryRow | None,
    text: str, read_ids: list[str], sources: FoldSources, read_at: int, model_calls: int,
) -> FoldResult:
    memory = svc.store(MemoryStore)
    folds = svc.store(ConsolidationStore)
    usage = svc.store(UsageStore)
    trace = TRACE_PREFIX + ",".join(read_ids)
    live = section is not None and section.live
    if (live and section is not None and not section.redacted and section.value == text
            and section.source_trace == trace and section.provenance == "derived"):
        folds.record_fold(org, namespace, user_id, digest=sources.digest,
                          content_sha256=section.content_sha256, folded_at=read_at,
                          next_expiry=sources.next_expiry())
        folds.clear_changed(org, namespace, user_id, read_at, sources.source_digest)
        usage.add(org, namespace, worker=USAGE_WORKER, skipped_unchanged=1)
        return FoldResult(Outcome.UNCHANGED, model_calls, "same text")
    content = Content(memory_type="profile", value=text, provenance="derived",
                      source_trace=trace, actor=WORKER)
    try:
        written = memory.set(
            section_location(org, namespace, user_id),
            content,
            written_by=WORKER,
            default_char_limit=DEFAULT_PROFILE_CHAR_LIMIT,
            expected_version=str(section.version) if live and section is not None else "-",
            required_type="profile",
            refuse_pinned=True,
        )
    except SectionWrittenMeanwhile:
        # Someone wrote the section since it was read: fold again at the next pass.
        folds.requeue(org, namespace, user_id, read_at)
        return FoldResult(Outcome.RACED, model_calls, "the section was written meanwhile")
    except UserBeingErased:
        return FoldResult(Outcome.ERASING, model_calls, "the user is being erased")
    except LoomError as error:
        # Locked, pinned or high since it was read, over the section's char_limit, or a row of
        # another type: not tried again until the facts or the section change, so a section
        # that refuses does not cost a model call every pass.
        version = section.version if section is not None else 0
        folds.record_refusal(org, namespace, user_id,
                             refusal_fingerprint(sources.digest, version))
        folds.requeue(org, namespace, user_id, read_at)
        usage.add(org, namespace, worker=USAGE_WORKER, refusals=1)
        log.info("profile_consolidation: write refused for a user of %s/%s: %s",
                 org, namespace, error.code)
        return FoldResult(Outcome.REFUSED, model_calls, error.code)
    folds.record_fold(org, namespace, user_id, digest=sources.digest,
                      content_sha256=written.row.content_sha256, folded_at=read_at,
                      next_expiry=sources.next_expiry())
    folds.clear_changed(org, namespace, user_id, read_at, sources.source_digest)
    usage.add(org, namespace, worker=USAGE_WORKER, builds=1)
    return FoldResult(Outcome.FOLDED, model_calls)


# --- one pass ----------------------------------------------------------------------------------


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _rotation(namespaces: list[tuple[str, str]],
              cursor: tuple[str, str] | None) -> list[tuple[str, str]]:
    """The namespaces, starting at the cursor (or the first one after it, when it is gone)."""
    if cursor is None:
        return namespaces
    start = next((i for i, ns in enumerate(namespaces) if ns >= cursor), 0)
    return namespaces[start:] + namespaces[:start]


@dataclass
class _Tally:
    model_calls: int = 0
    visits: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def add(self, result: FoldResult) -> None:
        self.model_calls += result.model_calls
        self.visits += 1
        self.outcomes[str(result.outcome)] = self.outcomes.get(str(result.outcome), 0) + 1


@declared_job
def run_pass(svc: Services | None = None, holder: str | None = None) -> dict[str, Any]:
    """One pass; idempotent: a duplicate finds the lease taken or nobody listed.

    A pass folds at most ``MAX_FOLDS_PER_PASS`` users with a model call, looks at most at
    ``MAX_VISITS_PER_PASS``, and takes no user after half the interval, so it ends before the
    next one is due. The next pass starts at the namespace after the one this one stopped in.
    """
    svc = svc or services()
    settings = svc.settings
    if not settings.profile_consolidation_enabled:
        return {"skipped": "LOOM_PROFILE_CONSOLIDATION_ENABLED is off"}
    interval = settings.profile_consolidation_interval_seconds
    leases = svc.store(LeaseStore)
    lease = leases.acquire(LEASE, holder or _holder(), interval)
    if lease is None:
        return {"skipped": "another pass holds the lease"}
    folds = svc.store(ConsolidationStore)
    started = time.monotonic()
    deadline = started + interval / 2
    tally = _Tally()
    try:
        rotation = _rotation(folds.namespaces(), folds.cursor())
        resume_at: tuple[str, str] | None = None
        out_of_budget: set[tuple[str, str | None]] = set()
        for index, (org, namespace) in enumerate(rotation):
            if _spent(tally, deadline):
                resume_at = (org, namespace)  # not started: the next pass starts here
                break
            if (org, None) in out_of_budget:
                continue
            users = folds.users_to_fold(org, namespace, svc.clock.now_ns(),
                                        MAX_VISITS_PER_PASS - tally.visits)
            for user_id in users:
                if _spent(tally, deadline):
                    # Stopped inside this namespace: the next pass starts after it, so a
                    # namespace with many changed users cannot hold every other one back.
                    resume_at = rotation[(index + 1) % len(rotation)]
                    break
                lease.renew()
                try:
                    result = fold_user(svc, org, namespace, user_id)
                except Exception:  # one user's failure must not stop the pass
                    log.exception("profile_consolidation: fold crashed")
                    result = FoldResult(Outcome.FAILED)
                tally.add(result)
                if result.outcome is Outcome.DEFERRED:
                    # The users after this one would be deferred too: leave them listed.
                    out_of_budget.add((org, None if result.detail == "org" else namespace))
                    break
            if resume_at is not None:
                break
        folds.set_cursor(resume_at)
        record_pass(svc, LEASE, time.monotonic() - started)
        return {"namespaces": len(rotation), "visited": tally.visits,
                "model_calls": tally.model_calls, "outcomes": tally.outcomes}
    except LeaseLost:
        log.warning("profile_consolidation: lease lost mid-pass; nothing more written")
        return {"skipped": "lease lost"}
    finally:
        lease.release()


def _spent(tally: _Tally, deadline: float) -> bool:
    return (tally.model_calls >= MAX_FOLDS_PER_PASS or tally.visits >= MAX_VISITS_PER_PASS
            or time.monotonic() > deadline)
