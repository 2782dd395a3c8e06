"""A memory write is one Redis round trip on a single server, the namespace's entries included.

Every call runs through the Flask app against the real server, with a client that counts each
round trip it makes (tests/support/command_log.py). Before the measured write, the entries the
write asserts outside the user's slot (the memory_id's pointer, the namespace's user sets, the
lists of users whose sources changed) are removed, so the test sees the one script write them
again, not find them left over from the setup. On Redis Cluster the same entries take one
pipeline after the script (tests/test_cluster.py and the memory tests run there).

With embeddings on, the same script takes the user's queued-embeddings marker: a write whose
user has a job queued already costs that one step, and the write that finds none enqueues the
job the marker names. RQ's client is counted too (the same server here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rq import Queue

from app.queue_names import BUILDS
from app.store import keys
from tests.conftest import ON_CLUSTER, make_app
from tests.support.command_log import CommandLog, recording_client
from tests.support.model_server import ScriptedModelServer

pytestmark = pytest.mark.skipif(ON_CLUSTER, reason="counts round trips on a single server")

ORG = "default"
NS = "support"
AGENT = "triage-bot"
KEY = "invoice_currency"


class Loom:
    def __init__(self, redis_url: str, tmp_path: Any, **settings: Any) -> None:
        self.log = CommandLog()
        self.redis = recording_client(redis_url, self.log)
        self.queue_redis = recording_client(redis_url, self.log, decode=False)
        self.app = make_app(redis_url, tmp_path, redis=self.redis,
                            queue_redis=self.queue_redis, **settings)
        self.client = self.app.test_client()

    def post(self, op: str, user_id: str, **body: Any) -> dict[str, Any]:
        response = self.client.post(f"/v1/{op}", json={
            "namespace": NS, "agent": AGENT, "user_id": user_id, **body})
        assert response.status_code == 200, response.get_json()
        answer: dict[str, Any] = response.get_json()
        return answer

    def fact(self, user_id: str, value: str) -> dict[str, Any]:
        return self.post("memory.set", user_id, key=KEY, value=value, memory_type="semantic")

    def first_version(self, user_id: str) -> str:
        versions = self.post("memory.history", user_id, key=KEY)["versions"]
        return str(versions[-1]["version_text"])


def _two_versions(loom: Loom, user_id: str) -> dict[str, Any]:
    loom.fact(user_id, "Prefers EUR invoices.")
    loom.fact(user_id, "Prefers CHF invoices.")
    return {"key": KEY, "version_text": loom.first_version(user_id)}


def _one_row(loom: Loom, user_id: str) -> dict[str, Any]:
    loom.fact(user_id, "Prefers EUR invoices.")
    return {"key": KEY}


def _after(op: str, **extra: Any) -> Callable[[Loom, str], dict[str, Any]]:
    def setup(loom: Loom, user_id: str) -> dict[str, Any]:
        loom.fact(user_id, "Prefers EUR invoices.")
        loom.post(op, user_id, key=KEY)
        return {"key": KEY, **extra}
    return setup


# The op, how its row is set up, and the body the setup answers.
WRITES: list[tuple[str, Callable[[Loom, str], dict[str, Any]]]] = [
    ("memory.set", lambda loom, user_id: {
        "key": KEY, "value": "Prefers EUR invoices.", "memory_type": "semantic"}),
    ("memory.delete", _one_row),
    ("memory.delete_version", _two_versions),
    ("memory.lock", _one_row),
    ("memory.unlock", _after("memory.lock")),
    ("memory.pin", _one_row),
    ("memory.unpin", _after("memory.pin")),
    ("memory.revert", _two_versions),
    ("memory.restore", _after("memory.delete")),
    ("memory.restate", _one_row),
    ("memory.reinforce", lambda loom, user_id: {**_one_row(loom, user_id), "confidence": 0.95}),
    ("memory.recall", _one_row),
]


def namespace_entries(memory_id: str, user_id: str) -> dict[str, tuple[str, str]]:
    """The entries outside the user's slot a fact's write asserts: (kind, key) by name."""
    return {
        "pointer": ("hash field", keys.memory_pointers(ORG, NS)),
        "recall users": ("set", keys.recall_users(ORG, NS)),
    }


@pytest.fixture
def loom(redis_url, tmp_path):
    return Loom(redis_url, tmp_path)


@pytest.mark.parametrize(("op", "setup"), WRITES, ids=[op for op, _ in WRITES])
def test_a_memory_write_is_one_round_trip(loom, op, setup):
    # The first run loads the scripts: what a write costs is counted once they are loaded.
    loom.post(op, "warm-user", **setup(loom, "warm-user"))
    user_id = "u-42"
    body = setup(loom, user_id)
    row_key = keys.memory_row(ORG, NS, user_id, AGENT, "-", KEY)
    memory_id = loom.redis.hget(row_key, "memory_id") or ""
    entries = namespace_entries(memory_id, user_id)
    if memory_id:
        loom.redis.hdel(entries["pointer"][1], memory_id)
    loom.redis.srem(entries["recall users"][1], user_id)
    loom.redis.zrem(keys.profile_changed_users(ORG, NS), user_id)

    with loom.log.recording() as log:
        answer = loom.post(op, user_id, **body)

    assert log.round_trips == 1, log.commands
    assert [command[0] for command in log.commands] == ["EVALSHA"]
    memory_id = answer["memory_id"]
    assert loom.redis.hget(keys.memory_pointers(ORG, NS), memory_id) is not None
    assert loom.redis.sismember(keys.recall_users(ORG, NS), user_id)
    if answer.get("digest_moved") or op in ("memory.set", "memory.delete"):
        # The fact's source entry moved: both workers' change lists name the user.
        assert loom.redis.zscore(keys.profile_changed_users(ORG, NS), user_id) is not None
        assert loom.redis.zscore(keys.consolidation_changed(ORG, NS), user_id) is not None


def test_a_profile_section_write_lists_the_user_for_renders_in_the_same_round_trip(loom):
    loom.post("profile.set", "warm-user", label="persona", value="Terse.")
    namespace_sets = [keys.profile_users(ORG, NS),
                      keys.profile_label_users(ORG, NS, "persona"),
                      keys.profile_agent_users(ORG, NS, AGENT)]
    with loom.log.recording() as log:
        loom.post("memory.set", "u-7", key="persona", value="Cites ticket ids.",
                  memory_type="profile")
    assert log.round_trips == 1, log.commands
    for name in namespace_sets:
        assert loom.redis.sismember(name, "u-7"), name
    assert not loom.redis.sismember(keys.recall_users(ORG, NS), "u-7")


def test_a_write_that_changes_nothing_asserts_nothing(loom):
    loom.fact("u-9", "Prefers EUR invoices.")
    loom.post("memory.pin", "u-9", key=KEY)
    memory_id = loom.redis.hget(keys.memory_row(ORG, NS, "u-9", AGENT, "-", KEY), "memory_id")
    pointers = keys.memory_pointers(ORG, NS)
    loom.redis.hdel(pointers, memory_id)
    with loom.log.recording() as log:
        answer = loom.post("memory.pin", "u-9", key=KEY)
    assert answer["changed"] is False
    assert log.round_trips == 1
    assert loom.redis.hget(pointers, memory_id) is None


@pytest.mark.parametrize("op", ["memory.redact", "memory.backfill"])
def test_the_writes_that_read_first_still_write_in_one_step(loom, op):
    """A redact reads the profile rows derived from the row, a backfill the row's text: each
    reads, then writes once."""
    loom.fact("warm-user", "Prefers EUR invoices.")
    loom.post(op, "warm-user", key=KEY)
    loom.fact("u-5", "Prefers EUR invoices.")
    with loom.log.recording() as log:
        loom.post(op, "u-5", key=KEY)
    assert len(log.named("EVALSHA")) == 1, log.commands
    assert not log.named("SET", "SADD", "ZADD", "HSET", "DEL")


@pytest.fixture
def embedding_loom(redis_url, tmp_path):
    with ScriptedModelServer() as server:
        yield Loom(redis_url, tmp_path, embed_base_url=server.base_url,
                   embed_model=server.model)


def embed_jobs_of(loom: Loom, user_id: str) -> list[str]:
    """The ids of the embeddings jobs waiting in the queue for ``user_id``."""
    queue = Queue(BUILDS, connection=loom.queue_redis)
    return [job.id for job in queue.jobs if job.args[2:3] == (user_id,)]


def test_a_fact_write_with_embeddings_on_is_one_round_trip_once_the_users_job_is_queued(
        embedding_loom):
    loom = embedding_loom
    loom.fact("warm-user", "Prefers EUR invoices.")
    marker = keys.recall_vectors_queued(ORG, NS, "u-11")

    with loom.log.recording() as first:
        loom.fact("u-11", "Prefers EUR invoices.")
    # No job of the user was queued: the script marked one, and the write enqueued it.
    job_id = loom.redis.get(marker)
    assert embed_jobs_of(loom, "u-11") == [job_id]
    assert first.round_trips > 1
    # The marker is set inside the write's own script: no second script, no command of its own.
    assert len(first.named("EVALSHA")) == 1, first.commands
    assert [c for c in first.touching(marker) if c[0] != "EVALSHA"] == []

    with loom.log.recording() as second:
        loom.post("memory.set", "u-11", key="shipping_window", value="Ships on Fridays.",
                  memory_type="semantic")
    assert second.round_trips == 1, second.commands
    assert [command[0] for command in second.commands] == ["EVALSHA"]
    # The job queued already embeds both rows: no second job, the marker still names it.
    assert embed_jobs_of(loom, "u-11") == [job_id]
    assert loom.redis.get(marker) == job_id
    assert loom.redis.zcard(keys.recall_vectors_due(ORG, NS, "u-11")) == 2


def test_a_write_after_the_users_job_started_enqueues_a_new_one(embedding_loom):
    loom = embedding_loom
    loom.fact("u-12", "Prefers EUR invoices.")
    first_job = loom.redis.get(keys.recall_vectors_queued(ORG, NS, "u-12"))
    # The job takes the marker down as it starts (jobs/recall_embed.py).
    loom.redis.delete(keys.recall_vectors_queued(ORG, NS, "u-12"))
    loom.fact("u-12", "Prefers CHF invoices.")
    second_job = loom.redis.get(keys.recall_vectors_queued(ORG, NS, "u-12"))
    assert second_job not in (None, first_job)
    assert embed_jobs_of(loom, "u-12") == [first_job, second_job]


def test_a_write_that_leaves_nothing_to_embed_requests_no_job(embedding_loom):
    loom = embedding_loom
    loom.fact("u-13", "Prefers EUR invoices.")
    loom.redis.delete(keys.recall_vectors_queued(ORG, NS, "u-13"))
    with loom.log.recording() as log:
        loom.post("memory.delete", "u-13", key=KEY)
    assert log.round_trips == 1, log.commands
    assert loom.redis.get(keys.recall_vectors_queued(ORG, NS, "u-13")) is None
    assert len(embed_jobs_of(loom, "u-13")) == 1
