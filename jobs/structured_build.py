"""One structured-profile build: every rule of seed 000 "Structured profiles" for one user.

Sources under the fold's filter, most confident and newest first, at most the memory limit; a
refusal (row locked, pinned or ``high``, or the user blacklisted) or an answer cut off at the
output cap is reported, not retried; no facts gives the all-null profile without a model call;
the answer is held to the schema; and nothing is written when a fact the build read is no
longer current once the model answered (erased, deleted or expired meanwhile).

Every way a build ends in a profile (the model's answer, or the all-null profile) goes through
one finish, ``_finish``: skip an unchanged profile, write under the pass's fence the row and
the record of what it was built from, in one step. The pass that hands users to builds is
``jobs.structured_profile``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from app.errors import LoomError
from app.model.budget import OutOfBudget, complete_within_budget
from app.model.chat import base_max_tokens, parse_max_tokens_overrides, provider_from_settings
from app.model.errors import ModelCallFailed
from app.profile_schema import max_tokens_for, null_profile, validate_answer
from app.services import Services
from app.store.identity import Identity
from app.store.lease import Fence
from app.store.memory import (
    Content,
    MemoryRow,
    MemoryStore,
    SourceDigest,
    canonical_json,
    content_sha256,
)
from app.store.structured import (
    PROFILE_KEY,
    WORKER,
    BuildRecord,
    Snapshot,
    StructuredStore,
    profile_location,
)
from app.store.usage import UsageStore
from jobs.pass_lease import LimitReached
from jobs.planner import Outcome, refusal_fingerprint

# The worker this module's costs are counted under in the ledger (usage.get by_worker).
USAGE_WORKER = "structured_profile"

log = logging.getLogger("loom.jobs.structured_profile")

TRACE_PREFIX = "profile.fold:structured_profile:"


@dataclass(frozen=True)
class BuildResult:
    outcome: Outcome
    fingerprint: str = ""
    model_calls: int = 0
    wrote: bool = False
    detail: str = ""
    short: bool = False  # written from fewer facts than it counted
    # False for a user the pass handed out but never built: taken too late (the pass's second
    # half), abandoned at its limit, or fenced off. It is neither a success nor a failure: it
    # stays listed for the next pass, with no backoff.
    reached: bool = True

    @property
    def metric_outcome(self) -> str:
        """The outcome as /metrics counts it: a short build apart from a whole one."""
        return "short" if self.outcome == Outcome.BUILT and self.short else str(self.outcome)

    def to_dict(self) -> dict[str, Any]:
        return {"outcome": str(self.outcome), "fingerprint": self.fingerprint,
                "model_calls": self.model_calls, "wrote": self.wrote, "detail": self.detail,
                "short": self.short, "reached": self.reached}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BuildResult:
        return cls(Outcome(data["outcome"]), str(data.get("fingerprint", "")),
                   int(data.get("model_calls", 0)), bool(data.get("wrote")),
                   str(data.get("detail", "")), bool(data.get("short")),
                   bool(data.get("reached", True)))

    @classmethod
    def not_reached(cls, detail: str, model_calls: int = 0) -> BuildResult:
        return cls(Outcome.UNCHANGED, model_calls=model_calls, detail=detail, reached=False)


@dataclass(frozen=True)
class _Build:
    """What one build read before its model call, carried to its finish."""

    svc: Services
    identity: Identity
    schema_doc: dict[str, Any]
    schema_sha: str
    snapshot: Snapshot
    read_at: int  # ns: when the build read its sources
    fence: Fence | None
    write_until: float | None

    @property
    def digest(self) -> SourceDigest:
        return self.snapshot.digest


def build_user(
    svc: Services, org: str, namespace: str, user_id: str, fence: Fence | None = None,
    write_until: float | None = None,
) -> BuildResult:
    """One build. With a ``fence`` (a pass's claim on the user), the profile row is written
    only while the fence holds the pass's token: LeaseLost, and nothing written, otherwise.
    Past ``write_until`` (the pass's limit, on the services' clock) it writes nothing either:
    LimitReached."""
    settings = svc.settings
    identity = Identity(org, namespace, "-", user_id)
    memory = svc.store(MemoryStore)
    usage = svc.store(UsageStore)
    read = _read_sources(svc, identity)
    if isinstance(read, BuildResult):
        return read
    snapshot, schema_doc, schema_sha, entries, chosen, facts, read_at = read
    fingerprint = refusal_fingerprint(snapshot.digest.digest, snapshot.row_state(), schema_sha)
    build = _Build(svc, identity, schema_doc, schema_sha, snapshot, read_at, fence, write_until)
    if not entries:
        return _finish(build, None, [], short=False, model_calls=0)
    short = len(facts) < len(chosen)
    if not facts:
        # Served none of the facts it counted: no model call (seed 000, Staleness).
        return _finish(build, None, [], short=True, model_calls=0)

    provider = provider_from_settings(settings.llm_base_url, settings.llm_api_key,
                                      settings.llm_model, settings.llm_timeout_seconds)
    if provider is None:
        log.warning("structured_profile: no model configured (LOOM_LLM_BASE_URL, "
                    "LOOM_LLM_MODEL); %s/%s stays as it is", org, namespace)
        return BuildResult(Outcome.UNCHANGED, detail="model calls off: no model configured")
    if not usage.model_calls_enabled(org):
        log.info("structured_profile: model calls are switched off for org %s", org)
        return BuildResult(Outcome.UNCHANGED, detail="model calls off for the org")

    overrides = parse_max_tokens_overrides(settings.llm_max_tokens_overrides)
    max_tokens = max_tokens_for(schema_doc, base_max_tokens(PROFILE_KEY, overrides))
    try:
        with provider:
            completion = complete_within_budget(
                svc, org, namespace, provider, _prompt(schema_doc, facts),
                max_tokens=max_tokens, json_schema=_answer_schema(schema_doc),
                worker="structured_profile",
            )
    except OutOfBudget as out:
        # Not a failure: no backoff, the user stays listed for the first pass with room.
        return BuildResult(Outcome.DEFERRED, detail=f"out of the {out.scope} budget")
    except ModelCallFailed as error:
        usage.add(org, namespace, worker=USAGE_WORKER, model_calls=1, failures=1)
        log.warning("structured_profile: build failed for a user of %s/%s: %s",
                    org, namespace, error)
        return BuildResult(Outcome.FAILED, model_calls=1, detail=str(error))
    usage.add(org, namespace, worker=USAGE_WORKER, model_calls=1,
              prompt_tokens=completion.prompt_tokens or 0,
              completion_tokens=completion.completion_tokens or 0)
    if completion.cut_off:
        usage.add(org, namespace, worker=USAGE_WORKER, refusals=1)
        return BuildResult(Outcome.CUT_OFF, fingerprint, model_calls=1,
                           detail="answer cut off at the output cap")
    if completion.data is None:
        usage.add(org, namespace, worker=USAGE_WORKER, failures=1)
        return BuildResult(Outcome.FAILED, model_calls=1, detail="answer is not a JSON object")

    profile = validate_answer(schema_doc, completion.data)
    # A fact read before the call that is no longer current (deleted, erased, edited, or
    # past its valid_to) makes the answer unsafe to keep: write nothing, the change stays
    # listed for the next pass (an expired fact is taken out of the digest by then).
    read_ids = [row.memory_id for row in facts]
    now_entries = memory.source_entries(org, namespace, user_id)
    if any(now_entries.get(mid) != entries.get(mid) for mid in read_ids):
        return BuildResult(Outcome.UNCHANGED, model_calls=1,
                           detail="a fact it read changed while the model ran")
    answered_at = svc.clock.now_ns()
    if any(row.expired(answered_at) for row in facts):
        # Out of the digest now, and listed as a removal: the next pass rebuilds without it.
        memory.expire_sources(org, namespace, user_id)
        return BuildResult(Outcome.UNCHANGED, model_calls=1,
                           detail="a fact it read passed its valid_to while the model ran")
    return _finish(build, profile, read_ids, short=short, model_calls=1)


_SourcesRead = tuple[Snapshot, dict[str, Any], str, dict[str, str], list[tuple[str, str]],
                     list[MemoryRow], int]


def _read_sources(svc: Services, identity: Identity) -> BuildResult | _SourcesRead:
    """The build's sources as of the moment it reads them: snapshot, schema, source entries,
    the chosen entries and the facts served from them, and that moment (ns). A fact past its
    valid_to at that moment is never among them: found among the rows read, it is taken out
    of the digest and the sources are read again (seed 000: a fact that passes its valid_to
    changes the digest). A refusal or a missing schema answers a BuildResult."""
    org, namespace, user_id = identity.org, identity.namespace, identity.user_id
    memory = svc.store(MemoryStore)
    structured = svc.store(StructuredStore)
    for _attempt in range(3):
        now_ns = svc.clock.now_ns()
        snapshot = structured.snapshot(identity)
        if snapshot.digest.expiry_due(now_ns):
            memory.expire_sources(org, namespace, user_id)
            snapshot = structured.snapshot(identity)
        schema = snapshot.schema
        if schema is None or schema.doc is None:
            return BuildResult(Outcome.FAILED, detail="no schema")
        if snapshot.refuses_builds():  # locked, pinned, labelled high, or the user blacklisted
            svc.store(UsageStore).add(org, namespace, worker=USAGE_WORKER, refusals=1)
            fingerprint = refusal_fingerprint(snapshot.digest.digest, snapshot.row_state(),
                                              schema.sha)
            return BuildResult(Outcome.REFUSED, fingerprint, detail="profile row refuses builds")
        # Of the snapshot's moment: a fact written since is in neither the digest the build
        # records nor what it reads (read apart, it reached the model uncounted, and once it
        # passed its valid_to the digest matched the record again: ready, holding it).
        entries = snapshot.entries or {}
        chosen = _ordered_sources(entries, svc.settings.structured_profile_memory_limit)
        rows = memory.rows_by_id(org, namespace, user_id, [mid for mid, _ in chosen])
        read_at = svc.clock.now_ns()
        if any(row.memory_id in entries and row.expired(read_at) for row in rows):
            # Expired between the digest's check and the read: out of the digest, read again.
            memory.expire_sources(org, namespace, user_id)
            continue
        return (snapshot, schema.doc, schema.sha, entries, chosen,
                _served_facts(rows, chosen, read_at), read_at)
    return BuildResult.not_reached("its sources kept expiring as it read them")


def _ordered_sources(entries: dict[str, str], limit: int) -> list[tuple[str, str]]:
    """Most confident first, then most recently dated (valid_at, else last change)."""

    def order(item: tuple[str, str]) -> tuple[float, int, str]:
        _sha, confidence, date_ns = item[1].split(":")
        return (-float(confidence), -int(date_ns), item[0])

    return sorted(entries.items(), key=order)[:limit]


def _prompt(schema_doc: dict[str, Any], facts: list[MemoryRow]) -> list[dict[str, str]]:
    lines = [
        json.dumps(
            {"id": row.memory_id, "type": row.memory_type, "confidence": row.confidence,
             "fact": row.value},
            ensure_ascii=False,
        )
        for row in facts
    ]
    return [
        {
            "role": "system",
            "content": (
                "Fill in a user's profile from the facts known about them. Answer with one JSON "
                "object holding exactly the schema's properties. Use null for any property the "
                "facts do not settle. Facts come most confident and most recent first; when two "
                "disagree, prefer the earlier one in the list.\n\nSchema:\n"
                + json.dumps(schema_doc, ensure_ascii=False, sort_keys=True)
            ),
        },
        {"role": "user", "content": "Facts, one JSON object per line:\n" + "\n".join(lines)},
    ]


def _answer_schema(schema_doc: dict[str, Any]) -> dict[str, Any]:
    doc = dict(schema_doc)
    doc.pop("title", None)
    doc["additionalProperties"] = False
    return doc


def _served_facts(
    rows: list[MemoryRow], chosen: list[tuple[str, str]], read_at: int
) -> list[MemoryRow]:
    """The chosen sources as served at ``read_at``, in the chosen order; a fact whose row no
    longer matches its counted entry is left out (the build is then short)."""
    by_id = {row.memory_id: row for row in rows}
    facts = []
    for memory_id, entry in chosen:
        row = by_id.get(memory_id)
        if row is None or not row.is_source(read_at):
            continue
        if entry.split(":", 1)[0] != row.content_sha256:
            continue
        facts.append(row)
    return facts


def _finish(
    build: _Build,
    profile: dict[str, Any] | None,
    read_ids: list[str],
    *,
    short: bool,
    model_calls: int,
) -> BuildResult:
    """The one end of every build that settles a profile. ``profile`` None: no facts, the
    all-null profile. An unchanged profile is not written again; otherwise the row is written
    under the pass's fence and before its limit, and what it was built from is recorded."""
    svc, identity, snapshot = build.svc, build.identity, build.snapshot
    org, namespace, user_id = identity.org, identity.namespace, identity.user_id
    memory = svc.store(MemoryStore)
    if profile is None:
        if not snapshot.worker_row():
            # No facts and no row the worker wrote: write nothing, so an erased user gets no
            # new row (seed 000) and a caller's row is not replaced by the all-null profile.
            memory.clear_changed(org, namespace, user_id, build.read_at)
            return BuildResult(Outcome.UNCHANGED, detail="no facts and no profile")
        profile = null_profile(build.schema_doc)
    digest = build.digest
    row = snapshot.row
    served = snapshot.served_row(build.read_at)
    record = snapshot.record
    if (served is not None and record is not None and served.value == profile
            and record.schema_sha == build.schema_sha and record.digest == digest.digest
            and record.count == digest.count and record.short == short):
        memory.clear_changed(org, namespace, user_id, build.read_at)
        svc.store(UsageStore).add(org, namespace, worker=USAGE_WORKER, skipped_unchanged=1)
        return BuildResult(Outcome.UNCHANGED, model_calls=model_calls, detail="same profile")
    if build.write_until is not None and svc.clock.now() >= build.write_until:
        raise LimitReached("the pass's limit passed while the build ran")
    content = Content(
        memory_type="profile",
        value=profile,
        provenance="derived",
        source_trace=TRACE_PREFIX + ",".join(read_ids),
        actor=WORKER,
    )
    record = BuildRecord(content_sha256(canonical_json(profile)), build.schema_sha,
                         digest.digest, digest.count, build.read_at, short)
    try:
        memory.set(
            profile_location(org, namespace, user_id),
            content,
            written_by=WORKER,
            char_limit=None,
            default_char_limit=None,
            expected_version=str(row.version) if row is not None else "-",
            refuse_pinned=True,
            fence=build.fence,
            # The record lands with the row, in one step: no reader sees one without the other.
            record=StructuredStore.record_fields(org, namespace, user_id, record),
        )
    except LoomError as error:
        # Locked, pinned, high, being erased, or written by someone since the snapshot.
        log.info("structured_profile: write refused for a user of %s/%s: %s",
                 org, namespace, error.code)
        fingerprint = refusal_fingerprint(digest.digest, row.version if row else 0,
                                          build.schema_sha)
        return BuildResult(Outcome.REFUSED, fingerprint, model_calls=model_calls,
                           detail=error.code)
    svc.store(StructuredStore).index_build(org, namespace, user_id, digest.next_expiry)
    memory.clear_changed(org, namespace, user_id, build.read_at)
    svc.store(UsageStore).add(org, namespace, worker=USAGE_WORKER, builds=1)
    return BuildResult(Outcome.BUILT, model_calls=model_calls, wrote=True, short=short)
