"""The embeddings backlog (facts waiting for a vector) and the sweep's recovery of lost jobs,
through the Flask app over a real server and the scripted embeddings server over HTTP.

The backlog is what the users' due lists hold: in ``/metrics`` for the install (read with
prometheus_client's own parser), in ``usage.get`` and on the console's namespace page for one
namespace. The sweep's recovery is the real-process case of test_recall_embed_recovery.py made
small: a queued marker whose job no longer waits in its queue is taken over by the next pass,
and one whose job waits is left alone, with no second job.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rq import Queue

from app.queue_names import BUILDS
from app.store import keys
from jobs.recall_embed import sweep_due
from tests.auth_support import ADMIN_TOKEN, auth_app, bearer
from tests.support.api import op_helpers
from tests.support.model_server import ScriptedModelServer
from tests.support.rq_worker import run_queued

NS = "support"
OTHER_NS = "billing"
MODEL = "embed-test"
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture
def srv() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer() as server:
        yield server


@pytest.fixture
def app(app_factory, srv):
    return auth_app(app_factory, embed_base_url=srv.base_url, embed_model=MODEL,
                    metrics_token="")


# Every call as the install's admin (the conftest ``client`` serves this module's ``app``).
_, ok = op_helpers(headers_for=lambda _headers: bearer(ADMIN_TOKEN))


def fact(client, user_id: str, key: str, value: str, namespace: str = NS) -> None:
    ok(client, "memory.set", namespace=namespace, agent="chat", user_id=user_id, key=key,
       value=value)


def run_jobs(app) -> None:
    run_queued(app.extensions["loom"], BUILDS)


def backlog_metrics(client) -> dict[str, float]:
    response = client.get("/metrics", headers=bearer(ADMIN_TOKEN))
    assert response.status_code == 200, response.get_data(as_text=True)
    found = {}
    for family in text_string_to_metric_families(response.get_data(as_text=True)):
        for sample in family.samples:
            if sample.name.startswith("loom_recall_vectors_backlog"):
                found[sample.name] = sample.value
    return found


def console_backlog(client) -> str:
    client.get("/console/sign-in")
    page = client.get("/console/sign-in").get_data(as_text=True)
    csrf = CSRF.search(page)
    assert csrf, page
    signed = client.post("/console/sign-in", data={"csrf_token": csrf.group(1),
                                                   "token": ADMIN_TOKEN, "next": "/console/"})
    assert signed.status_code == 302, signed.get_data(as_text=True)
    page = client.get(f"/console/ns/{NS}").get_data(as_text=True)
    found = re.search(r'<dd id="recall-backlog">([^<]*)</dd>', page)
    assert found, page
    return found.group(1)


def test_the_backlog_counts_facts_waiting_for_a_vector_until_their_jobs_run(app, client, srv):
    assert backlog_metrics(client) == {"loom_recall_vectors_backlog_facts": 0.0,
                                       "loom_recall_vectors_backlog_users": 0.0}
    fact(client, "u-1", "drink", "takes tea")
    fact(client, "u-1", "ride", "drives a car")
    fact(client, "u-2", "pet", "has a cat")
    fact(client, "u-3", "city", "lives in Lyon", namespace=OTHER_NS)
    assert backlog_metrics(client) == {"loom_recall_vectors_backlog_facts": 4.0,
                                       "loom_recall_vectors_backlog_users": 3.0}
    assert ok(client, "usage.get", namespace=NS)["recall_backlog"] == {"facts": 3, "users": 2}
    assert ok(client, "usage.get", namespace=OTHER_NS)["recall_backlog"] == {
        "facts": 1, "users": 1}
    assert console_backlog(app.test_client()) == "3 (2 users)"
    # The endpoint fails: nothing is embedded and the backlog stays.
    srv.script_embedding(status=500)
    run_jobs(app)
    assert backlog_metrics(client)["loom_recall_vectors_backlog_facts"] >= 1
    sweep_due(app.extensions["loom"])
    run_jobs(app)
    assert backlog_metrics(client) == {"loom_recall_vectors_backlog_facts": 0.0,
                                       "loom_recall_vectors_backlog_users": 0.0}
    assert ok(client, "usage.get", namespace=NS)["recall_backlog"] == {"facts": 0, "users": 0}
    assert console_backlog(app.test_client()) == "0"
    # A changed fact waits again; an unchanged write does not.
    fact(client, "u-2", "pet", "has a cat")
    fact(client, "u-1", "drink", "takes coffee")
    assert ok(client, "usage.get", namespace=NS)["recall_backlog"] == {"facts": 1, "users": 1}


def test_the_sweep_takes_over_a_marker_whose_job_is_lost_and_leaves_a_waiting_one(app, client,
                                                                                  srv):
    services = app.extensions["loom"]
    builds = Queue(BUILDS, connection=services.queue_redis)
    org = services.settings.default_org
    marker = keys.recall_vectors_queued(org, NS, "u-1")
    fact(client, "u-1", "drink", "takes tea")
    waiting = services.redis.get(marker)
    assert builds.job_ids == [waiting]
    # The job waits in its queue: the sweep leaves it, and no second job is enqueued.
    totals = sweep_due(services)
    assert (totals["requested"], totals["already_queued"]) == (0, 1)
    assert builds.job_ids == [waiting] and services.redis.get(marker) == waiting
    # The queue loses the job (its server came back without it): the marker still names it,
    # so a write enqueues nothing, and the sweep's next pass enqueues a new job.
    builds.empty()
    fact(client, "u-1", "ride", "drives a car")
    assert builds.job_ids == [] and services.redis.get(marker) == waiting
    totals = sweep_due(services)
    assert (totals["requested"], totals["already_queued"]) == (1, 0)
    assert builds.job_ids == [services.redis.get(marker)] != [waiting]
    run_jobs(app)
    assert services.redis.hlen(keys.recall_vectors(org, NS, "u-1")) == 2
    assert ok(client, "usage.get", namespace=NS)["recall_backlog"] == {"facts": 0, "users": 0}


def test_a_marker_left_by_a_failed_enqueue_or_an_older_release_holds_no_longer_than_a_sweep(
        app, client, srv):
    services = app.extensions["loom"]
    builds = Queue(BUILDS, connection=services.queue_redis)
    org = services.settings.default_org
    marker = keys.recall_vectors_queued(org, NS, "u-1")
    fact(client, "u-1", "drink", "takes tea")
    builds.empty()
    # A marker of an older release held "1", naming no job.
    services.redis.set(marker, "1", ex=600)
    assert sweep_due(services)["requested"] == 1
    assert builds.job_ids == [services.redis.get(marker)]
    run_jobs(app)
    assert services.redis.hlen(keys.recall_vectors(org, NS, "u-1")) == 1
