"""Periodic jobs as data, registered with the real rq-scheduler and run by a real RQ worker."""

from __future__ import annotations

import pytest
import redis
from rq import Queue, SimpleWorker
from rq_scheduler import Scheduler

from jobs import context
from jobs.queues import MAINTENANCE
from jobs.scheduler import JOB_ID_PREFIX, Periodic, periodic_jobs, register


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
    assert queue.count == 1
    worker = SimpleWorker([queue], connection=job_env)
    assert worker.work(burst=True)
    finished = queue.finished_job_registry.get_job_ids()
    assert len(finished) == 1
    result = queue.fetch_job(finished[0]).return_value()
    assert set(result) >= {"namespaces", "states_removed", "fields_removed"}


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
