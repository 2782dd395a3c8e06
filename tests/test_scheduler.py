"""Periodic jobs as data, registered with the real rq-scheduler and run by a real RQ worker."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
import redis
from rq import Queue
from rq_scheduler import Scheduler

from app.clock import FrozenClock
from jobs import context
from jobs.queues import MAINTENANCE
from jobs.scheduler import JOB_ID_PREFIX, Periodic, periodic_jobs, register
from tests.support.rq_worker import BurstWorker


@pytest.fixture
def job_env(redis_url, tmp_path, monkeypatch):
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("LOOM_SECRET_KEY", "test-secret-key-for-loom")
    monkeypatch.setenv("LOOM_DATA_DIR", str(tmp_path))
    context.use_services(None)
    yield redis.Redis.from_url(redis_url)
    context.use_services(None)


def _loom_jobs(scheduler):
    return sorted(job.id for job in scheduler.get_jobs() if job.id.startswith(JOB_ID_PREFIX))


def test_registration_is_idempotent_and_drops_jobs_no_longer_defined(job_env):
    from app.settings import load_settings

    scheduler = Scheduler(connection=job_env)
    definitions = periodic_jobs(load_settings())
    first = register(scheduler, definitions)
    again = register(scheduler, definitions)
    assert first == again == _loom_jobs(scheduler)
    assert len(first) == len(definitions)
    extra = Periodic("jobs.agent_state_sweep.sweep", MAINTENANCE, 30, {"org": "o"})
    register(scheduler, [*definitions, extra])
    assert extra.job_id in _loom_jobs(scheduler)
    register(scheduler, definitions)
    assert _loom_jobs(scheduler) == first


def test_ids_are_deterministic_from_the_definition():
    one = Periodic("jobs.x.y", MAINTENANCE, 60, {"a": 1})
    assert one.job_id == Periodic("jobs.x.y", MAINTENANCE, 60, {"a": 1}).job_id
    assert one.job_id != Periodic("jobs.x.y", MAINTENANCE, 61, {"a": 1}).job_id


def test_the_scheduler_enqueues_the_sweep_and_a_worker_runs_it(job_env):
    from app.settings import load_settings

    scheduler = Scheduler(connection=job_env)
    register(scheduler, periodic_jobs(load_settings()))
    scheduler.enqueue_jobs()
    queue = Queue(MAINTENANCE, connection=job_env)
    assert queue.count == 2  # the agent-state sweep and the erasures' resume pass
    worker = BurstWorker([queue], connection=job_env)
    assert worker.work(burst=True)
    finished = {queue.fetch_job(job_id).func_name: queue.fetch_job(job_id)
                for job_id in queue.finished_job_registry.get_job_ids()}
    assert set(finished) == {"jobs.agent_state_sweep.sweep", "jobs.erasure.resume_pass"}
    result = finished["jobs.agent_state_sweep.sweep"].return_value()
    assert set(result) >= {"namespaces", "states_removed", "fields_removed"}
    assert finished["jobs.erasure.resume_pass"].return_value() == 0  # none was interrupted


def test_the_schedulers_way_out_survives_a_dead_redis():
    """rq-scheduler's register_death and remove_lock raised ConnectionError with Redis away,
    from run()'s finally and from its SIGTERM handler: the process died or kept running."""
    from app.local import free_port
    from jobs.scheduler import LoomScheduler

    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.2,
                       retry=None)  # nothing listens there
    scheduler = LoomScheduler(connection=dead, interval=5)
    scheduler.register_death()
    scheduler.remove_lock()
    with pytest.raises(redis.ConnectionError):
        Scheduler.register_death(scheduler)  # what rq-scheduler alone does


def test_the_poll_is_four_times_per_shortest_interval_and_at_most_five_seconds():
    from jobs.scheduler import poll_seconds

    assert poll_seconds([Periodic("f", MAINTENANCE, 1), Periodic("g", MAINTENANCE, 60)]) == 0.25
    assert poll_seconds([Periodic("f", MAINTENANCE, 3600)]) == 5.0
    assert poll_seconds([]) == 5.0


def test_a_periodic_job_keeps_its_hash_ten_intervals_at_least_an_hour_after_it_ran(job_env):
    """A finished job's hash expires after result_ttl, and rq-scheduler then drops its
    schedule: a 2 s one let that happen between ticks. Kept ten intervals, at least an hour."""
    assert Periodic("f", MAINTENANCE, 30).result_ttl == 3600
    assert Periodic("f", MAINTENANCE, 900).result_ttl == 9000
    definition = Periodic("jobs.agent_state_sweep.sweep", MAINTENANCE, 1)
    scheduler = Scheduler(connection=job_env)
    register(scheduler, [definition])
    scheduler.enqueue_jobs()
    BurstWorker([Queue(MAINTENANCE, connection=job_env)], connection=job_env).work(burst=True)
    assert 3000 < job_env.ttl(f"rq:job:{definition.job_id}") <= 3600  # set by the run
    assert _loom_jobs(scheduler) == [definition.job_id]


def test_a_job_an_older_release_scheduled_gets_this_definitions_result_ttl(job_env):
    definition = Periodic("jobs.agent_state_sweep.sweep", MAINTENANCE, 1)
    key = f"rq:job:{definition.job_id}"
    for older_ttl, expiry in ((2, 2), (-1, None)):  # expiring before the next poll; never
        job_env.flushdb()
        scheduler = Scheduler(connection=job_env)
        scheduler.schedule(scheduled_time=datetime.now(UTC), func=definition.func, interval=1,
                           queue_name=MAINTENANCE, id=definition.job_id, result_ttl=older_ttl)
        if expiry is not None:
            job_env.expire(key, expiry)  # as a finished run of it left it
        register(scheduler, [definition])
        assert job_env.hget(key, "result_ttl") == str(definition.result_ttl).encode()
        assert 3000 < job_env.ttl(key) <= 3600
        scheduler.enqueue_jobs()
        BurstWorker([Queue(MAINTENANCE, connection=job_env)],
                     connection=job_env).work(burst=True)
        assert 3000 < job_env.ttl(key) <= 3600


def test_a_missing_hash_or_entry_is_put_back_and_a_busy_job_is_not_written_over(job_env):
    definition = Periodic("jobs.agent_state_sweep.sweep", MAINTENANCE, 30)
    scheduler = Scheduler(connection=job_env)
    register(scheduler, [definition])
    key = f"rq:job:{definition.job_id}"

    job_env.delete(key)
    register(scheduler, [definition])
    assert _loom_jobs(scheduler) == [definition.job_id] and job_env.exists(key)

    job_env.zrem(Scheduler.scheduled_jobs_key, definition.job_id)
    job_env.hset(key, "status", "started")  # a worker runs it right now
    before = int(time.time())  # read first: the due time below can only be later than this
    register(scheduler, [definition])
    assert _loom_jobs(scheduler) == [definition.job_id]
    assert job_env.hget(key, "status") == b"started"  # not written over
    due = job_env.zscore(Scheduler.scheduled_jobs_key, definition.job_id)
    assert due >= before + 30  # comes round an interval from now, not at once

    register(scheduler, [definition])
    register(scheduler, [definition])
    assert job_env.zcard(Scheduler.scheduled_jobs_key) == 1


def _pass_results_since(connection, job_id, since):
    from rq.exceptions import NoSuchJobError
    from rq.job import Job

    try:
        job = Job.fetch(job_id, connection=connection)
    except NoSuchJobError:
        return []
    return [r for r in job.results() if r.type == r.Type.SUCCESSFUL and r.created_at > since]


@pytest.mark.slow
def test_passes_at_a_one_second_interval_keep_running_and_come_back_when_deleted(
    redis_url, tmp_path
):
    """Real processes: two schedulers and a worker, LOOM_STRUCTURED_PROFILE_INTERVAL_SECONDS=1.
    Passes run about every second for as long as we watch, and come back after the job's hash
    or its schedule entry is deleted; the two schedulers keep one schedule entry."""
    from jobs.queues import PASSES
    from jobs.structured_profile import PASS_FUNC
    from tests.conftest import TEST_SECRET
    from tests.support.processes import loom_env, start, stop, wait_for

    connection = redis.Redis.from_url(redis_url)
    env = loom_env(REDIS_URL=redis_url, LOOM_SECRET_KEY=TEST_SECRET,
                   LOOM_DATA_DIR=str(tmp_path),
                   LOOM_STRUCTURED_PROFILE_INTERVAL_SECONDS="1",
                   LOOM_STRUCTURED_PROFILE_IDLE_INTERVAL_SECONDS="1")
    pass_id = Periodic(PASS_FUNC, PASSES, 1).job_id
    processes = [start("jobs.scheduler", env, tmp_path / "scheduler-1.log"),
                 start("jobs.scheduler", env, tmp_path / "scheduler-2.log"),
                 start("jobs.worker", env, tmp_path / "worker.log", PASSES)]

    def passes_since(since):
        return len(_pass_results_since(connection, pass_id, since))

    def entries():
        return [m.decode() for m in connection.zrange(Scheduler.scheduled_jobs_key, 0, -1)
                if m.decode().startswith(JOB_ID_PREFIX)]

    try:
        wait_for(lambda: passes_since(datetime.now(UTC) - timedelta(hours=1)), 60,
                 "the first pass")
        watched = datetime.now(UTC)
        # A 2 s result_ttl let the hash expire and then no pass ran at all: four more passes
        # must come (a bound generous enough for a loaded machine, not a rate window).
        wait_for(lambda: passes_since(watched) >= 4, 60, "four more passes")
        assert entries().count(pass_id) == 1

        connection.delete(f"rq:job:{pass_id}")
        deleted = datetime.now(UTC)
        wait_for(lambda: passes_since(deleted) >= 2, 30, "passes after the hash was deleted")

        connection.zrem(Scheduler.scheduled_jobs_key, pass_id)
        removed = datetime.now(UTC)
        wait_for(lambda: pass_id in entries(), 30, "the schedule entry to come back")
        wait_for(lambda: passes_since(removed) >= 2, 30,
                 "passes after the entry was removed")
        assert entries().count(pass_id) == 1
        assert len(entries()) == len(set(entries()))
    finally:
        for process in processes:
            stop(process)


def test_a_periodic_job_comes_round_one_interval_after_it_was_due_not_after_the_poll(job_env):
    """rq-scheduler schedules the next run an interval after the poll that found the job, so a
    late poll pushed every later tick back; Loom's ticks stay on the job's own times, and
    ticks missed while no scheduler ran are skipped, not run in a burst."""
    from jobs.scheduler import LoomScheduler

    definition = Periodic("jobs.agent_state_sweep.sweep", MAINTENANCE, 10)
    # Frozen at a whole second of now: the ticks below are due (rq finds due jobs by the wall
    # clock), and where the next one goes depends on this clock alone, not on the load.
    clock = FrozenClock(start=int(time.time()))
    scheduler = LoomScheduler(connection=job_env, interval=1, clock=clock)
    register(scheduler, [definition])
    key = scheduler.scheduled_jobs_key
    now = clock.now()
    due = int(now) - 3  # found by a poll three seconds late
    job_env.zadd(key, {definition.job_id: due})
    scheduler.enqueue_jobs()
    assert job_env.zscore(key, definition.job_id) == due + 10
    assert Queue(MAINTENANCE, connection=job_env).count == 1

    long_ago = int(now) - 95  # nine ticks missed, the tenth not yet due
    job_env.zadd(key, {definition.job_id: long_ago})
    scheduler.enqueue_jobs()
    assert job_env.zscore(key, definition.job_id) == long_ago + 100
    assert Queue(MAINTENANCE, connection=job_env).count == 2


@pytest.mark.slow
def test_a_scheduler_and_worker_run_log_no_line_for_an_idle_pass_nor_a_result_never_expiring(
    redis_url, tmp_path
):
    """Real processes: the scheduler and a worker at a one-second interval. The periodic jobs
    keep their hash on purpose, and RQ's INFO line calling that a leak ("result will never
    expire, clean up result key manually") came once a minute per job; it is gone. And a pass
    with nothing to do (no user here) writes no INFO line at all: neither Loom's summary nor
    RQ's four lines a job (issue 47)."""
    from jobs.queues import ALL_QUEUES, PASSES
    from jobs.structured_profile import PASS_FUNC
    from tests.conftest import TEST_SECRET
    from tests.support.processes import loom_env, start, stop, wait_for

    connection = redis.Redis.from_url(redis_url)
    env = loom_env(REDIS_URL=redis_url, LOOM_SECRET_KEY=TEST_SECRET,
                   LOOM_DATA_DIR=str(tmp_path), LOOM_LOG_FORMAT="text",
                   LOOM_STRUCTURED_PROFILE_INTERVAL_SECONDS="1",
                   LOOM_STRUCTURED_PROFILE_IDLE_INTERVAL_SECONDS="1")
    pass_id = Periodic(PASS_FUNC, PASSES, 1).job_id
    worker_log = tmp_path / "worker.log"
    processes = [start("jobs.scheduler", env, tmp_path / "scheduler.log"),
                 start("jobs.worker", env, worker_log, *ALL_QUEUES)]
    try:
        wait_for(lambda: len(_pass_results_since(
            connection, pass_id, datetime.now(UTC) - timedelta(hours=1))) >= 3, 60,
            "three passes")
    finally:
        for process in processes:
            stop(process)
    written = worker_log.read_text()
    assert "Listening on" in written  # the worker's own start is still logged
    assert pass_id not in written and JOB_ID_PREFIX not in written
    assert "structured_profile: pass" not in written and "sweep:" not in written
    assert "Job OK" not in written and "Successfully completed" not in written
    assert "never expire" not in written
    assert "clean up result key" not in written
