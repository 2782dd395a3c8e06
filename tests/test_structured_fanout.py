"""A pass fanned out as RQ jobs, in one process on the injected clock: build jobs on the builds
queue, then the closing job RQ enqueues once they have all ended.

A SimpleWorker runs the jobs one after the other, in this process, so the scripted model can
move the frozen clock while it "thinks". The real processes, and N workers making N builds at
once, are in tests/test_structured_worker_processes.py.
"""

from __future__ import annotations

import pytest
from rq import Queue

from app.store import keys
from jobs import context
from jobs.queues import BUILDS, PASSES
from jobs.structured_profile import LEASE, run_pass
from tests.support.rq_worker import BurstWorker
from tests.test_structured_worker import SCHEMA, World, answer

USERS = [f"u-{i}" for i in range(4)]


@pytest.fixture
def world(redis_url, tmp_path, model):
    w = World(redis_url, tmp_path, model, structured_profile_max_pass_seconds=100,
              structured_profile_cooldown_seconds=0)
    w.post("profile_schema.set", json_schema=SCHEMA)
    for user in USERS:
        w.fact("name", f"I am {user}.", user=user)
    context.use_services(w.services)
    yield w
    context.use_services(None)


def fan_out_pass(world):
    """One pass as the scheduler starts it, run to its end by a worker on both queues."""
    queue_redis = world.services.queue_redis
    planned = run_pass(world.services, holder="worker-a", force=True, fan_out=True)
    assert world.services.redis.exists(keys.worker_lease(LEASE))  # carried on by the jobs
    BurstWorker([Queue(PASSES, connection=queue_redis), Queue(BUILDS, connection=queue_redis)],
                 connection=queue_redis).work(burst=True)
    assert not world.services.redis.exists(keys.worker_lease(LEASE))  # the closing job ran
    return planned


def called_users(world):
    return [next(u for u in USERS if f"I am {u}." in call.body["messages"][-1]["content"])
            for call in world.calls()]


def test_builds_run_as_jobs_and_the_closing_job_ends_the_pass(world, model):
    model.default = lambda request: answer(preferred_name="Sam")
    planned = fan_out_pass(world)
    assert planned["fanned_out"] == len(USERS)
    builds = Queue(BUILDS, connection=world.services.queue_redis)
    assert sorted(builds.finished_job_registry.get_job_ids()) == sorted(planned["build_jobs"])
    closing = Queue(PASSES, connection=world.services.queue_redis).fetch_job(
        planned["closing_job"])
    assert closing is not None and closing.return_value()["model_calls"] == len(USERS)
    assert all(world.structured(u)["status"] == "ready" for u in USERS)


def test_a_build_job_that_starts_in_the_second_half_takes_nobody(world, model):
    def thirty_seconds(request):
        world.clock.advance(30)
        return answer(preferred_name="Sam")

    model.default = thirty_seconds
    fan_out_pass(world)  # builds start at 0 s and 30 s; the third would start at 60 s of 100
    assert called_users(world) == USERS[:2]
    assert [world.structured(u)["status"] for u in USERS] == ["ready", "ready", "pending",
                                                              "pending"]
    world.clock.advance(1)
    fan_out_pass(world)  # given back to the front of the scan list: taken first, no rescan
    assert called_users(world) == USERS
    assert all(world.structured(u)["status"] == "ready" for u in USERS)


def test_a_failed_build_backs_off_and_a_build_past_the_limit_does_not(world, model):
    late = []

    def past_the_limit(request):
        if not late:
            late.append(request)
            world.clock.advance(150)  # answered after the pass's 100 s limit
        return answer(preferred_name="Sam")

    model.script(status=500, body={"error": "down"})  # u-0: a model error, 300 s backoff
    model.default = past_the_limit  # u-1: abandoned at the limit; u-2, u-3: not reached
    fan_out_pass(world)
    assert called_users(world) == USERS[:2]
    assert all(world.structured(u)["status"] == "pending" for u in USERS)
    assert world.post("usage.get")["failures"] == 1

    world.clock.advance(1)
    fan_out_pass(world)
    assert called_users(world) == USERS[:2] + ["u-1", "u-2", "u-3"]  # retried at once
    statuses = [world.structured(u)["status"] for u in USERS]
    assert statuses == ["pending", "ready", "ready", "ready"]  # u-0 waits out its backoff
