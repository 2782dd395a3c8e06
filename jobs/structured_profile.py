"""The structured_profile worker: passes that keep each user's structured profile current.

``run_pass`` is the periodic job. It takes the worker lease (a fencing token, so two passes
never plan at once), loads what the worker keeps between passes (under the holding process),
and drives ``jobs.planner.PassPlanner``: scans list the users whose sources or schema moved,
builds run for the users it hands out. Every build takes its user under a fence of the lease
(``jobs.pass_lease``) and writes the profile row only while that fence holds the pass's token,
so a pass that lost its lease writes nothing more. No user is taken once half of
LOOM_STRUCTURED_PROFILE_MAX_PASS_SECONDS has gone; at the whole of it the pass is abandoned.

Run by an RQ worker, a pass fans its builds out: one ``build_user_job`` per user on the builds
queue, and a closing ``end_pass`` job that RQ enqueues once they have all ended. No job waits
on another, so N workers on the builds queue make N builds at once. Called directly, a pass
builds in its own process, one user at a time.

One build (``build_user``, every rule of seed 000 for one user) lives in
``jobs.structured_build``.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from datetime import UTC, datetime
from typing import Any

from rq import Queue, get_current_job
from rq.job import Dependency, Job
from rq.results import Result

from app.job_queues import waited_seconds
from app.job_registry import BUILD_USER, END_PASS, STRUCTURED_PASS, declared_job
from app.logs import pass_level
from app.services import Services
from app.store.lease import STRUCTURED_PROFILE_LEASE, LeaseLost, LeaseStore
from app.store.memory import MemoryStore
from app.store.metrics import record_pass
from app.store.profile_schema import (
    ProfileSchemaStore,
    namespace_member,
    split_namespace_member,
)
from app.store.structured import StructuredStore, wakes_total
from jobs.context import services
from jobs.pass_lease import LeaseKeeper, LimitReached, PassTicket, lease_ttl
from jobs.planner import (
    BuildStep,
    NamespaceInfo,
    Outcome,
    PassPlanner,
    PlannerSettings,
    PlannerState,
    ScanStep,
    UserCandidate,
    give_back,
    record_outcome,
    refusal_fingerprint,
    state_for_generation,
)
from jobs.structured_build import BuildResult, build_user

log = logging.getLogger("loom.jobs.structured_profile")

LEASE = STRUCTURED_PROFILE_LEASE
PASS_FUNC = STRUCTURED_PASS.func
# A fanned-out build still running this long after the pass's limit is stopped by RQ.
ABANDON_GRACE_SECONDS = 5
# How long the build jobs' results stay for the closing job to read, past the pass's limit.
RESULT_KEEP_SECONDS = 600
# The scheduler's ticks come one interval apart, give or take its poll (at most a quarter of
# the interval, ``jobs.scheduler.poll_seconds``). A pass that left users behind marks the next
# one due this fraction of an interval after the tick that asked for it: the next tick always
# runs a pass, however long either pass waited in its queue behind other jobs, while a
# duplicate enqueued meanwhile (a retry, a run by hand) returns at once.
NEXT_PASS_FRACTION = 0.5


def next_pass_due(ticked: float, ended: float, delay: float, idle: bool) -> float:
    """When the next pass may run: the idle interval after an idle pass ended; otherwise
    early enough that the scheduler's next tick, one interval after the tick that asked for
    this pass, runs it (seed 000: "runs again at the worker's interval")."""
    if idle:
        return ended + delay
    return ticked + delay * NEXT_PASS_FRACTION


# --- the pass's parts: its holder, its namespaces, its scans ----------------------------------


def _holder() -> str:
    """The generation a pass's kept state lives under: the RQ worker process running it.

    RQ runs each job in a child it forks, so the parent (the worker itself) is the process
    the seed's "kept in the worker's process" state belongs to.
    """
    return f"{socket.gethostname()}:{os.getppid()}"


def _namespaces(svc: Services, wakes: dict[str, int]) -> list[NamespaceInfo]:
    infos = []
    for org, namespace, stored in svc.store(ProfileSchemaStore).all_schemas():
        member = namespace_member(org, namespace)
        infos.append(NamespaceInfo(member, stored.sha, parses=stored.doc is not None,
                                   wakes=wakes.get(member, 0)))
    return infos


def _scan(
    svc: Services, planner: PassPlanner, ns_id: str, limit: int, excluded: frozenset[str],
    schema_sha: str, now: float,
) -> list[str]:
    """The users of a namespace behind, oldest change first: from the changed-users index,
    which every fact write and every schema change feeds, so a scan reads the changed users
    only, never all users."""
    org, namespace = split_namespace_member(ns_id)
    structured = svc.store(StructuredStore)
    read_at = svc.clock.now_ns()
    structured.list_built_users_for_schema(org, namespace, schema_sha)
    structured.unpark_due(org, namespace, read_at)
    memory = svc.store(MemoryStore)
    for user in structured.expiring_users(org, namespace, read_at):
        # A counted fact passed its valid_to: taking it out moves the digest and lists the
        # user (as a removal, so the rebuild skips the cooldown).
        memory.expire_sources(org, namespace, user)
        structured.forget_expiry(org, namespace, user, read_at)
    changed = svc.store(MemoryStore).changed_users(org, namespace,
                                                   limit=limit + len(excluded) + limit)
    users = [user for user, _ in changed if user not in excluded]
    records = structured.records(org, namespace, users)
    changed_at = dict(changed)
    candidates = []
    for user in users:
        record, digest, row_version, served = records[user]
        # Fewer sources than the profile counted, or one left since the build: a deletion.
        deletion = record is not None and (
            digest.count < record.count
            or (digest.removed_at is not None and digest.removed_at > record.built_at)
        )
        changed_ns = max(changed_at[user], digest.changed_at or 0)
        changed_s = changed_ns / 1e9
        built_s = record.built_at / 1e9 if record else None
        moved = record is not None and (
            changed_ns > record.built_at
            or (record.digest, record.count) != (digest.digest, digest.count)
        )
        if moved and built_s is not None and changed_s <= built_s:
            # The digest moved since the build, but the clock did not (or seconds as floats
            # lost the nanoseconds): the change still counts as after the build.
            changed_s = math.nextafter(built_s, math.inf)
        candidates.append(UserCandidate(
            user_id=user,
            changed_at=changed_s,
            built=served,
            built_at=built_s,
            deletion=deletion,
            schema_changed=record is not None and record.schema_sha != schema_sha,
            short=bool(record and record.short),
            fingerprint=refusal_fingerprint(digest.digest, row_version, schema_sha),
        ))
    current = [c.user_id for c in candidates if c.built and not c.short
               and not c.schema_changed and not c.deletion
               and c.changed_at is not None and c.built_at is not None
               and c.changed_at <= c.built_at]
    if current:
        # Listed, but their sources are as built: drop them so the index holds only users
        # behind, and a scan's window is never filled by users with nothing to do.
        structured.forget_current(org, namespace, current, read_at)
    return planner.users_behind(ns_id, candidates, now)


def _park_if_waiting(
    svc: Services, settings: PlannerSettings, state: PlannerState, ns_id: str, user_id: str,
    result: BuildResult,
) -> None:
    """A refused, cut-off or failed user waits; park it so it does not hold the scan window."""
    if result.outcome not in (Outcome.REFUSED, Outcome.CUT_OFF, Outcome.FAILED):
        return
    wait = state.user_waits.get(ns_id, {}).get(user_id)
    if wait is None:
        return
    if wait.backoff_until is not None:
        until = wait.backoff_until
    elif wait.refusal is not None:
        until = wait.refusal.refused_at + settings.refusal_retry_seconds
    else:
        return
    org, namespace = split_namespace_member(ns_id)
    svc.store(StructuredStore).park(org, namespace, user_id, int(until * 1e9),
                                    svc.clock.now_ns())


# --- builds under the pass's lease -------------------------------------------------------------


def _build_taken(svc: Services, keeper: LeaseKeeper, ns_id: str, user_id: str) -> BuildResult:
    """Take one user now and build them under a fence: the write happens only while the pass
    still holds the user, and before its limit. A user being erased is not reached. LeaseLost
    when the lease is gone or a later pass took the user; LimitReached past the limit."""
    org, namespace = split_namespace_member(ns_id)
    fence = keeper.take(org, namespace, user_id)
    if fence is None:
        return BuildResult.not_reached("the user is being erased")
    try:
        return build_user(svc, org, namespace, user_id, fence=fence,
                          write_until=keeper.ticket.hard_until)
    finally:
        keeper.drop(fence)


@declared_job
def build_user_job(
    org: str, namespace: str, user_id: str, ticket: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One build as its own RQ job, fanned out by a pass; idempotent.

    It takes the user when it starts, so a build that starts in the pass's second half takes
    nobody; it renews the pass's lease while it runs, and writes only under the pass's fence
    and before the pass's limit. A build the pass could not make returns as not reached
    (listed for the next pass, no backoff). A job without a ticket (queued before passes
    fenced their builds) just builds.
    """
    svc = services()
    if ticket is None:
        return build_user(svc, org, namespace, user_id).to_dict()
    pass_ticket = PassTicket.from_dict(ticket)
    if svc.clock.now() >= pass_ticket.take_until:
        return BuildResult.not_reached("started in the pass's second half").to_dict()
    ns_id = namespace_member(org, namespace)
    try:
        with LeaseKeeper(svc.store(LeaseStore), pass_ticket, svc.clock) as keeper:
            return _build_taken(svc, keeper, ns_id, user_id).to_dict()
    except LimitReached:
        log.info("structured_profile: a build ran past the pass's limit; nothing written")
        return BuildResult.not_reached("abandoned at the pass's limit").to_dict()
    except LeaseLost:
        log.info("structured_profile: a build's pass lost its lease; nothing written")
        return BuildResult.not_reached("fenced off: the pass lost its lease").to_dict()


# --- one pass ----------------------------------------------------------------------------------


def _load_state(leases: LeaseStore, holder: str) -> PlannerState:
    generation, raw = leases.load_state(LEASE)
    stored = None
    if raw:
        try:
            stored = PlannerState.from_json(raw)
            stored.generation = generation
        except ValueError:
            stored = None
    return state_for_generation(stored, holder)


def _unpark_everyone(svc: Services) -> None:
    structured = svc.store(StructuredStore)
    for org, namespace, _stored in svc.store(ProfileSchemaStore).all_schemas():
        structured.unpark_all(org, namespace)


def _scan_step(svc: Services, planner: PassPlanner, step: ScanStep, shas: dict[str, str]) -> None:
    try:
        users = _scan(svc, planner, step.namespace, step.limit, step.excluded,
                      shas[step.namespace], svc.clock.now())
        planner.record_scan(step.namespace, users, svc.clock.now())
    except Exception:  # a failing namespace backs off, the pass goes on
        log.exception("structured_profile: scan failed")
        planner.record_scan_failure(step.namespace, svc.clock.now())


def _pass_inline(
    svc: Services, planner: PassPlanner, shas: dict[str, str], keeper: LeaseKeeper
) -> tuple[list[BuildStep], list[BuildResult], list[BuildStep]]:
    """Scan and build in this process, one user at a time: the planner is asked for the next
    user only once the last build is done, so a pass whose builds are slow stops taking users
    at half time, and the users not reached stay on their scan lists. Answers the builds made
    and the one abandoned at the pass's limit (to be listed again). LeaseLost ends the pass."""
    steps: list[BuildStep] = []
    results: list[BuildResult] = []
    while (step := planner.next_step(svc.clock.now())) is not None:
        keeper.check()
        if isinstance(step, ScanStep):
            _scan_step(svc, planner, step, shas)
            continue
        try:
            result = _build_taken(svc, keeper, step.namespace, step.user_id)
        except LimitReached:
            return steps, results, [step]
        if not result.reached:
            continue  # being erased: the erasure takes them off the lists
        planner.record_result(step.namespace, step.user_id, result.outcome, svc.clock.now(),
                              result.fingerprint or None)
        _park_if_waiting(svc, planner.settings, planner.snapshot(), step.namespace,
                         step.user_id, result)
        steps.append(step)
        results.append(result)
    return steps, results, []


def _plan_all(svc: Services, planner: PassPlanner, shas: dict[str, str]) -> list[BuildStep]:
    """Every user the pass may build, handed out at once (scans run here; no model call), for
    build jobs that each take their user only when they start."""
    steps: list[BuildStep] = []
    while (step := planner.next_step(svc.clock.now())) is not None:
        if isinstance(step, ScanStep):
            _scan_step(svc, planner, step, shas)
        else:
            steps.append(step)
    return steps


def _fan_out(
    svc: Services, ticket: PassTicket, steps: list[BuildStep], next_pass_in: float, full: bool
) -> tuple[list[str], str]:
    """Enqueue one build job per user on the builds queue, and the pass's closing job, which
    RQ enqueues once every build job has ended (failed ones too): no process waits on them."""
    connection = svc.queue_redis
    now = svc.clock.now()
    left = max(1, math.ceil(ticket.hard_until - now))
    # A build still running at the pass's limit can write nothing by then (its fence lapsed);
    # RQ's job timeout stops it soon after, and the closing job runs.
    timeout = left + ABANDON_GRACE_SECONDS
    keep = left + ABANDON_GRACE_SECONDS + RESULT_KEEP_SECONDS
    datas = []
    for step in steps:
        org, namespace = split_namespace_member(step.namespace)
        datas.append(Queue.prepare_data(
            build_user_job, args=(org, namespace, step.user_id),
            kwargs={"ticket": ticket.to_dict()}, timeout=timeout, result_ttl=keep,
            failure_ttl=keep,
        ))
    jobs = Queue(BUILD_USER.queue, connection=connection).enqueue_many(datas)
    build_ids = [job.id for job in jobs]
    closing = Queue(END_PASS.queue, connection=connection).enqueue(
        end_pass, kwargs={"ticket": ticket.to_dict(), "build_job_ids": build_ids,
                          "next_pass_in": next_pass_in, "full": full},
        depends_on=Dependency(jobs=jobs, allow_failure=True),
        job_timeout=max(60, timeout), result_ttl=keep, failure_ttl=keep,
    )
    return build_ids, closing.id


def _fanned_out_results(
    connection: Any, build_ids: list[str]
) -> list[tuple[str, str, BuildResult]]:
    """(namespace id, user, result) of each build job still there (an erasure deletes the
    jobs about its user)."""
    found = []
    for job in Job.fetch_many(build_ids, connection=connection):
        if job is None:
            continue
        org, namespace, user_id = job.args[:3]
        latest = job.latest_result()
        if latest is not None and latest.type == Result.Type.SUCCESSFUL:
            result = BuildResult.from_dict(latest.return_value or {})
        elif latest is not None and latest.type == Result.Type.FAILED:
            if "JobTimeoutException" in (latest.exc_string or ""):
                result = BuildResult.not_reached("abandoned at the pass's limit")
            else:
                result = BuildResult(Outcome.FAILED, detail="the build job failed")
        else:
            result = BuildResult.not_reached(f"build job {job.get_status(refresh=False)}")
        found.append((namespace_member(org, namespace), user_id, result))
    return found


@declared_job
def end_pass(
    ticket: dict[str, Any], build_job_ids: list[str], next_pass_in: float, full: bool = False
) -> dict[str, Any]:
    """The closing job of a pass whose builds fanned out: records each build's outcome (waits,
    backoffs, refusals), puts the users not reached back on their scan lists, stores the kept
    state and releases the lease. Nothing, when the lease is no longer the pass's."""
    svc = services()
    pass_ticket = PassTicket.from_dict(ticket)
    leases = svc.store(LeaseStore)
    lease = pass_ticket.lease_in(leases)
    if not lease.holds():
        log.warning("structured_profile: the pass lost its lease before it closed; its kept "
                    "state is left as it is")
        return {"skipped": "lease lost"}
    settings = PlannerSettings.from_settings(svc.settings)
    state = _load_state(leases, pass_ticket.holder)
    now = svc.clock.now()
    results = _fanned_out_results(svc.queue_redis, build_job_ids)
    not_reached: dict[str, list[str]] = {}
    for ns_id, user_id, result in results:
        if not result.reached or result.outcome is Outcome.DEFERRED:
            # Not built, and no failure: first on the list for the next pass.
            not_reached.setdefault(ns_id, []).append(user_id)
            continue
        record_outcome(state, ns_id, user_id, result.outcome, now, settings,
                       result.fingerprint or None)
        _park_if_waiting(svc, settings, state, ns_id, user_id, result)
    for ns_id, users in not_reached.items():
        give_back(state, ns_id, users)
    state.generation = pass_ticket.holder
    try:
        leases.save_state(lease, state.to_json())
    except LeaseLost:
        log.warning("structured_profile: the pass lost its lease as it closed")
        return {"skipped": "lease lost"}
    # A pass that fanned out handed users out, so it was not idle.
    leases.set_next_pass_due(lease, next_pass_due(pass_ticket.ticked_at, now, next_pass_in,
                                                  idle=False),
                             ticked_at=pass_ticket.ticked_at)
    reached = [r for _ns, _user, r in results if r.reached]
    record_pass(svc, LEASE, max(0.0, now - pass_ticket.started_at),
                [r.metric_outcome for r in reached], full=full)
    lease.release()
    calls = sum(r.model_calls for _ns, _user, r in results)
    log.info("structured_profile: pass built %d of %d users (%d not reached) with %d model calls",
             sum(1 for r in reached if r.outcome == Outcome.BUILT), len(results),
             len(results) - len(reached), calls)
    return {
        "built": [(ns, user, str(r.outcome) if r.reached else "not_reached")
                  for ns, user, r in results],
        "model_calls": calls,
        "next_pass_in": next_pass_in,
    }


@declared_job
def run_pass(
    svc: Services | None = None, holder: str | None = None, force: bool = False,
    fan_out: bool | None = None,
) -> dict[str, Any]:
    """One pass; idempotent: a duplicate pass finds the lease taken or nobody behind.

    After a pass that found nobody behind, the passes the scheduler enqueues at the worker's
    interval return at once until the idle interval is over (``force`` runs one anyway).

    Run as an RQ job (``fan_out`` None), the pass plans and hands its builds to the builds
    queue, then returns: the build jobs and the closing job ``end_pass`` carry the lease on.
    Called directly, it builds here, one user at a time.
    """
    svc = svc or services()
    if fan_out is None:
        fan_out = get_current_job() is not None
    planner_settings = PlannerSettings.from_settings(svc.settings)
    leases = svc.store(LeaseStore)
    holder = holder or _holder()
    lease = leases.acquire(LEASE, holder, lease_ttl(planner_settings.max_pass_seconds))
    if lease is None:
        return {"skipped": "another pass holds the lease"}
    started = svc.clock.now()
    started_monotonic = time.monotonic()
    # The wait is read on the wall clock RQ's enqueue time is on (0 for a pass called
    # directly), the pass's times on the services' clock.
    ticket = PassTicket.start(lease, started, planner_settings.max_pass_seconds,
                              waited_seconds(get_current_job(), datetime.now(UTC)))
    handed_on = False
    try:
        state = _load_state(leases, holder)
        if not state.user_waits and not state.scans:
            # Started over (another process took the lease, or nothing was kept): the users
            # parked on a wait kept by the last holder are listed again, so no wait outlives
            # the process that kept it (seed 000).
            _unpark_everyone(svc)
        # Read before the namespaces and their scans: a wake after this read is one the pass
        # may have missed, and it ends the idle wait this pass may set.
        wakes = svc.store(StructuredStore).wakes()
        stored = leases.next_pass_due(LEASE)
        if not force and stored.wait_holds(started, wakes_total(wakes)):
            return {"skipped": "idle until the next pass is due"}
        infos = _namespaces(svc, wakes)
        shas = {info.id: info.schema_sha for info in infos}
        planner = PassPlanner(state, infos, planner_settings, started)
        results: list[BuildResult] = []
        abandoned: list[BuildStep] = []
        if fan_out:
            steps = _plan_all(svc, planner, shas)
            if steps:
                # The users handed out leave the scan lists now; the closing job puts back the
                # ones no build reached.
                new_state, delay = planner.finish(svc.clock.now())
                new_state.generation = holder
                leases.save_state(lease, new_state.to_json())
                build_ids, closing = _fan_out(svc, ticket, steps, delay,
                                              full=planner.budget_left <= 0)
                handed_on = True
                log.info("structured_profile: pass handed %d builds to the builds queue; "
                         "its closing job records them", len(build_ids))
                return {"namespaces": len(infos), "fanned_out": len(build_ids),
                        "build_jobs": build_ids, "closing_job": closing, "next_pass_in": delay}
        else:
            with LeaseKeeper(leases, ticket, svc.clock) as keeper:
                steps, results, abandoned = _pass_inline(svc, planner, shas, keeper)
        new_state, delay = planner.finish(svc.clock.now())
        for step in abandoned:
            give_back(new_state, step.namespace, [step.user_id])
        new_state.generation = holder
        leases.save_state(lease, new_state.to_json())
        leases.set_next_pass_due(lease, next_pass_due(ticket.ticked_at, svc.clock.now(), delay,
                                                      planner.idle),
                                 wakes_total(wakes), ticket.ticked_at)
        record_pass(svc, LEASE, time.monotonic() - started_monotonic,
                    [result.metric_outcome for result in results],
                    full=planner.budget_left <= 0)
        calls = sum(result.model_calls for result in results)
        log.log(pass_level(len(results)),
                "structured_profile: pass built %d of %d users in %.3f s with %d model calls",
                sum(1 for r in results if r.outcome == Outcome.BUILT), len(results),
                time.monotonic() - started_monotonic, calls)
        return {
            "namespaces": len(infos),
            "built": [(step.namespace, step.user_id, str(r.outcome))
                      for step, r in zip(steps, results, strict=True)],
            "model_calls": calls,
            "next_pass_in": delay,
        }
    except LeaseLost:
        log.warning("structured_profile: lease lost mid-pass; nothing more written")
        return {"skipped": "lease lost"}
    finally:
        if not handed_on:
            lease.release()
