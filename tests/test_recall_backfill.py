"""One backfill path: ``memory.backfill`` and ``flask loom recall backfill`` bring facts' recall
entries up to date through the same indexing step, and request the due users' embeddings jobs
through the sweep's loop, the org's model-calls switch included. Through the Flask app and its
CLI runner over a real server, with the scripted embeddings server over HTTP.

An install an older release wrote is made by hand: a user's rows carry no recall terms and the
user has no lexical index, no vector and nothing listed as due.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rq import Queue

from app.queue_names import BUILDS
from app.store import keys
from tests.support.api import op_helpers
from tests.support.model_server import ScriptedModelServer
from tests.support.rq_worker import run_queued
from tests.test_recall import index_matches_rows

NS = "support"
MODEL = "embed-test"
WHO = {"namespace": NS, "agent": "chat"}


@pytest.fixture
def srv() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer() as server:
        yield server


_, ok = op_helpers(WHO)


def backfill(app) -> str:
    result = app.test_cli_runner().invoke(args=["loom", "recall", "backfill"])
    assert result.exit_code == 0, result.output
    return result.output


def run_jobs(app) -> None:
    run_queued(app.extensions["loom"], BUILDS)


def as_an_older_release_wrote(app, user_id: str) -> None:
    """The user's rows without recall terms, and no index, vector or due listing."""
    services = app.extensions["loom"]
    redis = services.redis
    org = services.settings.default_org
    redis.delete(keys.recall_postings(org, NS, user_id), keys.recall_docs(org, NS, user_id),
                 keys.recall_stats(org, NS, user_id), keys.recall_vectors(org, NS, user_id),
                 keys.recall_vectors_due(org, NS, user_id))
    for row_key in redis.hvals(keys.memory_ids(org, NS, user_id)):
        redis.hset(row_key, "recall_terms", "")


def set_model_calls(client, enabled: bool) -> None:
    answer = client.post("/v1/org.set_model_calls", json={"enabled": enabled})
    assert answer.status_code == 200, answer.get_json()


def test_the_command_and_the_op_share_the_indexing_path_and_the_jobs_loop(app_factory, srv):
    before = app_factory()  # no endpoint yet: facts are listed due, no job is enqueued
    old = before.test_client()
    ok(old, "memory.set", user_id="u-1", key="drink", value="takes green tea")
    ok(old, "memory.set", user_id="u-1", key="ride", value="drives a car to work")
    ok(old, "memory.set", user_id="u-2", key="pet", value="has a cat called Miso")
    as_an_older_release_wrote(before, "u-1")
    assert ok(old, "memory.search", user_id="u-1", query="green tea")["hits"] == []

    app = app_factory(embed_base_url=srv.base_url, embed_model=MODEL)
    client = app.test_client()
    builds = Queue(BUILDS, connection=app.extensions["loom"].queue_redis)
    set_model_calls(client, False)
    out = backfill(app)
    assert "rows: 3 live rows of 2 users, 2 entries brought up to date, 0 left" in out, out
    # u-1's facts are indexed and listed for a vector; the org's calls are off: no job.
    assert ("vectors: 2 users with facts waiting, 0 jobs enqueued, 0 already queued, "
            "2 with model calls off") in out, out
    assert builds.count == 0
    index_matches_rows(app, NS, "u-1")
    hits = ok(client, "memory.search", user_id="u-1", query="green tea")["hits"]
    assert [hit["key"] for hit in hits] == ["drink"]
    # The op takes the same path and the same loop: with calls off it enqueues nothing either.
    again = ok(client, "memory.backfill", user_id="u-2", key="pet")
    assert again["changed"] is False and builds.count == 0

    set_model_calls(client, True)
    ok(client, "memory.backfill", user_id="u-2", key="pet")
    assert builds.count == 1
    out = backfill(app)
    assert "rows: 3 live rows of 2 users, 0 entries brought up to date" in out, out
    assert ("vectors: 2 users with facts waiting, 1 jobs enqueued, 1 already queued, "
            "0 with model calls off") in out, out
    assert builds.count == 2
    run_jobs(app)
    usage = ok(client, "usage.get")
    assert usage["recall_backlog"] == {"facts": 0, "users": 0}
    assert usage["by_worker"]["recall_embeddings"]["model_calls"] == 2
    hits = ok(client, "memory.search", user_id="u-1", query="car", read_scope="own_user")["hits"]
    assert hits[0]["key"] == "ride" and hits[0]["legs"] == ["lexical", "vector"]
    assert "vectors: 0 users with facts waiting, 0 jobs enqueued" in backfill(app)


def test_the_command_leaves_a_locked_row_as_it_is(app_factory, srv):
    app = app_factory(embed_base_url=srv.base_url, embed_model=MODEL)
    client = app.test_client()
    ok(client, "memory.set", user_id="u-1", key="drink", value="takes green tea")
    ok(client, "memory.set", user_id="u-1", key="ride", value="drives a car")
    ok(client, "memory.lock", user_id="u-1", key="ride")
    as_an_older_release_wrote(app, "u-1")
    out = backfill(app)
    assert "rows: 2 live rows of 1 users, 1 entries brought up to date, 1 left" in out, out
    hits = ok(client, "memory.search", user_id="u-1", query="green tea car")["hits"]
    assert [hit["key"] for hit in hits] == ["drink"]
