"""Erasure, its census and the data package on a real three-primary Redis Cluster.

A user's data lives under their hash tag (one slot) and in other slots too: the namespace's
memory_id pointers and user indexes, the workers' state. The erasure, run by an RQ worker (RQ
on the plain test server, as ``LOOM_QUEUE_URL`` requires), scans every primary: afterwards no
primary holds a key or a value naming the user, the census says clean, and the other users'
data is whole.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from app.store import keys
from app.store.erasure.scanning import primaries, scan_keys
from tests.conftest import make_app
from tests.support.erasure_worker import run_erasure_jobs
from tests.test_erasure import GUIDE_TYPE, LOYALTY_TYPE

ORG = "default"
NS = "support"
USER = "u-cluster-erase-3b7d"
OTHERS = [f"u-cluster-keep-{i}" for i in range(6)]


@pytest.fixture
def cluster(redis_cluster):
    redis_cluster.flush()
    yield redis_cluster
    redis_cluster.flush()


@pytest.fixture
def app(cluster, redis_url, tmp_path):
    return make_app(cluster.url, tmp_path, redis_cluster="on", queue_url=redis_url)


def _everything_on(node: redis.Redis) -> list[str]:
    """Every key of one primary, and every string it holds (names and values)."""
    found = []
    for key in node.scan_iter(count=1000):
        found.append(key)
        kind = node.type(key)
        if kind == "string":
            found.append(str(node.get(key)))
        elif kind == "hash":
            found += [f"{k}={v}" for k, v in node.hgetall(key).items()]
        elif kind == "set":
            found += list(node.smembers(key))
        elif kind == "zset":
            found += list(node.zrange(key, 0, -1))
        elif kind == "list":
            found += list(node.lrange(key, 0, -1))
    return found


def test_an_erasure_reaches_every_primary_and_its_census_on_the_cluster_is_clean(app):
    client = app.test_client()
    services = app.extensions["loom"]

    def post(op: str, **body: Any) -> dict[str, Any]:
        answer = client.post(f"/v1/{op}", json={"namespace": NS, "agent": "chat", **body})
        assert answer.status_code == 200, (op, answer.get_json())
        return answer.get_json()

    post("features.set", features={"agent_state": True})
    post("object_types.set", types=[LOYALTY_TYPE, GUIDE_TYPE])

    def put_state(agent: str, scope: dict[str, str], body: dict[str, Any],
                  **extra: Any) -> None:
        answer = client.put("/v1/agent-state", json={
            "namespace": NS, "agent": agent, "scope": scope, "body": body, **extra})
        assert answer.status_code == 200 and answer.get_json()["stored"], answer.get_json()

    for user in [USER, *OTHERS]:
        # A state in the user's own subject scope, and a conversation's state naming them:
        # both slots differ from the user's tag.
        put_state("loyalty", {"kind": "subject", "id": user}, {"tier": f"MARK {user} gold"})
        put_state("shop_guide", {"kind": "conversation", "id": f"conv-{user}"},
                  {"offer": f"MARK {user} offer"}, subject=user)
        post("memory.set", user_id=user, key="name", value=f"MARK {user} name")
        post("memory.set", user_id=user, key="name", value=f"MARK {user} name again")
        post("profile.set", user_id=user, label="persona", value=f"MARK {user} persona")
        post("working_memory.set", user_id=user, block_key="b", content=f"MARK {user} block")
    ns_id = json.dumps([ORG, NS], separators=(",", ":"))
    services.redis.hset(keys.worker_state("structured_profile"), mapping={
        "generation": "g", "state": json.dumps({"scans": {ns_id: {"users": [USER, *OTHERS]}}})})

    data = services.redis
    assert isinstance(data, redis.RedisCluster)
    nodes = primaries(data)
    assert len(nodes) == 3
    holding = [i for i, node in enumerate(nodes)
               if any(USER in text for text in _everything_on(node))]
    assert len(holding) >= 2, holding  # the user's data is spread over primaries

    exported = post("subject.export", user_id=USER)
    assert exported["counts"]["memory_rows"] == 1
    assert exported["counts"]["working_memory_blocks"] == 1
    assert exported["counts"]["memory_versions"] == 3

    started = post("user.erase", user_id=USER)
    assert started["status"] == "running"
    run_erasure_jobs(services)
    receipt = post("erasure.status", erasure_id=started["erasure_id"])

    assert receipt["status"] == "done", receipt
    assert receipt["census"]["clean"] is True and receipt["census"]["found"] == {}
    assert receipt["counts"]["memory_rows"] == 1
    assert receipt["counts"]["index_entries"] > 0  # the pointers and the namespace's indexes
    assert receipt["counts"]["profile_sections"] == 1
    assert receipt["counts"]["working_memory_blocks"] == 1
    assert receipt["counts"]["agent_states"] == 2
    for node in nodes:
        left = [text for text in _everything_on(node) if USER in text]
        assert left == [], left
    tag = keys.user_tag(ORG, NS, USER)
    assert not list(scan_keys(data, "*" + keys.glob_escape(tag) + "*"))
    assert post("subject.export", user_id=USER)["counts"] == dict.fromkeys(
        exported["counts"], 0)
    for user in OTHERS:
        assert post("memory.get", user_id=user, key="name")["memory"]["value"] == (
            f"MARK {user} name again")
        assert post("subject.export", user_id=user)["counts"]["memory_versions"] == 3
        kept = client.post("/v1/agent-state/read", json={
            "namespace": NS, "agent": "loyalty", "scope": {"kind": "subject", "id": user}})
        assert kept.status_code == 200, kept.get_json()
        assert kept.get_json()["body"]["tier"] == f"MARK {user} gold"
    state = json.loads(data.hget(keys.worker_state("structured_profile"), "state"))
    assert state["scans"][ns_id]["users"] == OTHERS
