"""A first structured profile within a pass interval, in the running system (issue 47, point 4):
a real gunicorn, ``python -m jobs.scheduler`` and ``python -m jobs.worker`` on one Redis, a
scripted model on loopback. The idle interval and the cooldown are an hour, so a first profile
that waited for either would miss every deadline here; the deadlines themselves are generous
(a loaded CI machine), and every wait is for an event, not a time.
"""

from __future__ import annotations

import time
from datetime import datetime

import pytest
import redis
from rq.exceptions import NoSuchJobError
from rq.job import Job

from app.store import keys
from jobs.periodic import Periodic
from jobs.queues import PASSES
from jobs.structured_profile import LEASE, PASS_FUNC
from tests.conftest import TEST_SECRET
from tests.support.processes import StructuredStack, wait_for
from tests.test_structured_cadence_live import Loom, NamedModel
from tests.test_structured_worker import SCHEMA

pytestmark = [pytest.mark.real, pytest.mark.slow]

INTERVAL = 2
HOUR = 3600
IDLE = "idle until the next pass is due"
NS = "first"


@pytest.fixture(scope="module")
def loom(redis_server_url, tmp_path_factory):
    named = NamedModel()
    with StructuredStack(
        redis_server_url, tmp_path_factory.mktemp("structured-first"), named, TEST_SECRET,
        workers=1,
        LOOM_STRUCTURED_PROFILE_INTERVAL_SECONDS=str(INTERVAL),
        LOOM_STRUCTURED_PROFILE_IDLE_INTERVAL_SECONDS=str(HOUR),
        LOOM_STRUCTURED_PROFILE_COOLDOWN_SECONDS=str(HOUR),
    ) as stack:
        client = Loom(stack.url, named)
        client.queue_redis = redis.Redis.from_url(redis_server_url)
        client.logs = stack.folder
        stack.start_jobs()
        yield client


def idle_skips(loom: Loom) -> set[str]:
    """The ids of the pass job's latest results (RQ keeps ten) that skipped for the idle
    wait: a tick that ran a pass while the wait held."""
    try:
        job = Job.fetch(Periodic(PASS_FUNC, PASSES, INTERVAL).job_id,
                        connection=loom.queue_redis)
    except NoSuchJobError:  # not scheduled yet
        return set()
    return {result.id for result in job.results()
            if (result.return_value or {}).get("skipped") == IDLE}


def test_a_schema_set_and_a_new_users_first_fact_end_the_idle_wait(loom):
    # The start-up pass found no namespace and set the idle wait; later ticks return at once.
    wait_for(lambda: loom.queue_redis.exists(keys.worker_next_pass(LEASE)), 60,
             "the start-up pass")
    wait_for(lambda: idle_skips(loom), 60, "a tick skipped for the idle wait")

    loom.call("profile_schema.set", NS, json_schema=SCHEMA)
    loom.fact(NS, "ada", "name", "Call me Ada")
    pending = loom.structured(NS, "ada")
    if pending["status"] == "pending":
        # Due at a tick, not an hour away.
        due = datetime.fromisoformat(pending["next_pass_at"].replace("Z", "+00:00"))
        assert due.timestamp() < time.time() + HOUR / 2, pending
    out = wait_for(lambda: (got := loom.structured(NS, "ada"))["status"] == "ready" and got,
                   60, "ada's first profile")
    assert out["profile"]["preferred_name"] == "Ada"

    # Idle again (nobody behind), with the namespace's scan list complete and drained.
    skipped = idle_skips(loom)
    wait_for(lambda: idle_skips(loom) - skipped, 60, "the idle wait after the build")
    loom.fact(NS, "bob", "name", "Call me Bob")
    out = wait_for(lambda: (got := loom.structured(NS, "bob"))["status"] == "ready" and got,
                   60, "bob's first profile")
    assert out["profile"]["preferred_name"] == "Bob"

    # A built user's change is no wake: the idle wait holds, ticks keep skipping, no call.
    calls = len(loom.model.times("ada"))
    loom.fact(NS, "ada", "name", "Call me Adelaide")
    skipped = idle_skips(loom)
    wait_for(lambda: len(idle_skips(loom) - skipped) >= 3, 60, "three more idle ticks")
    assert len(loom.model.times("ada")) == calls
    assert loom.structured(NS, "ada")["status"] == "stale"
