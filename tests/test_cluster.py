"""The data plane on a real three-primary Redis Cluster (``LOOM_REDIS_CLUSTER=on``).

The cluster is started by the ``redis_cluster`` fixture from the suite's own redis-server
binary; RQ stays on the plain test server (``LOOM_QUEUE_URL``), as it must.
"""

from __future__ import annotations

import pytest
import redis

from app.services import Services
from app.settings import SettingsError, load_settings
from app.store import keys
from tests.conftest import TEST_SECRET, make_app
from tests.support.erasure_worker import run_erasure_jobs
from tests.test_structured_worker import SCHEMA

NS = {"namespace": "support", "agent": "chat"}
USERS = [f"u-{i}" for i in range(12)]


@pytest.fixture
def cluster(redis_cluster):
    redis_cluster.flush()
    yield redis_cluster
    redis_cluster.flush()


@pytest.fixture
def cluster_app(cluster, queue_url, tmp_path):
    return make_app(cluster.url, tmp_path, redis_cluster="on", queue_url=queue_url)


def test_the_cluster_needs_a_queue_url_of_its_own(cluster):
    with pytest.raises(SettingsError, match="LOOM_QUEUE_URL is required"):
        load_settings(environ={"REDIS_URL": cluster.url, "LOOM_REDIS_CLUSTER": "on",
                               "LOOM_SECRET_KEY": TEST_SECRET})
    settings = load_settings(environ={"REDIS_URL": cluster.url, "LOOM_REDIS_CLUSTER": "on",
                                      "LOOM_QUEUE_URL": "redis://127.0.0.1:1/0",
                                      "LOOM_SECRET_KEY": TEST_SECRET})
    assert isinstance(Services(settings).redis, redis.RedisCluster)


def test_ops_of_every_plane_work_and_spread_over_the_primaries(cluster, cluster_app):
    client = cluster_app.test_client()

    def call(op, **body):
        answer = client.post(f"/v1/{op}", json={**NS, **body})
        assert answer.status_code == 200, (op, answer.get_json())
        return answer.get_json()

    call("profile_schema.set", json_schema=SCHEMA)
    for user in USERS:
        call("working_memory.set", user_id=user, block_key="state", content="cursor: 1")
        call("working_memory.append", user_id=user, block_key="state", addition=" 2")
        call("working_memory.replace", user_id=user, block_key="state",
             old="1", new="one")
        call("profile.set", user_id=user, label="persona", value=f"Terse with {user}")
        call("profile.append", user_id=user, label="persona", addition=" and kind")
        call("memory.set", user_id=user, key="name", value=f"Call me {user}")
    one = USERS[0]
    block = call("working_memory.get", user_id=one, block_key="state")
    assert block["content"] == "cursor: one\n 2"
    rendered = call("profile.render", user_id=one, read_scope="own_user")
    assert f"Terse with {one}\n and kind" in rendered["rendered"]
    namespace_wide = call("profile.render")
    assert namespace_wide["section_count"] >= 1
    rows = call("memory.list", user_id=one)["memories"]
    assert [row["key"] for row in rows] == ["name", "persona"]
    pack = call("context.pack", user_id=one)
    assert "cursor: one\n 2" in pack["pack"]
    assert call("profile.structured", user_id=one)["status"] in ("pending", "stale")
    exported = call("subject.export", user_id=one)
    assert exported["memory_rows"] and exported["user_id"] == one

    spread = cluster.keys_per_primary()
    assert sum(1 for count in spread.values() if count > 0) >= 2, spread


def test_an_erasure_on_the_cluster_reaches_every_primary_and_its_census_is_clean(
        cluster, cluster_app):
    client = cluster_app.test_client()
    for user in USERS:
        for op, body in (("working_memory.set", {"block_key": "b", "content": "x"}),
                         ("profile.set", {"label": "p", "value": "v"}),
                         ("memory.set", {"key": "k", "value": "v"})):
            assert client.post(f"/v1/{op}", json={**NS, "user_id": user, **body}
                               ).status_code == 200
    started = client.post("/v1/user.erase", json={**NS, "user_id": USERS[3]}).get_json()
    run_erasure_jobs(cluster_app.extensions["loom"])  # a worker runs the saga
    receipt = client.post("/v1/erasure.status", json={
        **NS, "erasure_id": started["erasure_id"]}).get_json()
    assert receipt["status"] == "done", receipt
    assert receipt["census"]["clean"] is True and receipt["census"]["found"] == {}
    data = redis.RedisCluster.from_url(cluster.url, decode_responses=True)
    tag = keys.user_tag("default", "support", USERS[3])
    assert not [key for key in data.scan_iter(match="*", count=1000) if tag in key]
    left = client.post("/v1/memory.get", json={**NS, "user_id": USERS[4], "key": "k"})
    assert left.status_code == 200 and left.get_json()["memory"]["value"] == "v"


def test_the_cluster_refuses_a_script_over_two_slots(cluster):
    """What Loom's scripts avoid: the cluster itself refuses keys of two slots in one call."""
    data = redis.RedisCluster.from_url(cluster.url, decode_responses=True)
    first = keys.user_tag("default", "support", "u-1")
    second = keys.user_tag("default", "support", "u-2")
    assert data.keyslot(first) != data.keyslot(second)
    script = data.register_script("return redis.call('SET', KEYS[1], '1')"
                                  " and redis.call('SET', KEYS[2], '1')")
    with pytest.raises(redis.RedisClusterException):
        script(keys=[f"loom:probe:{first}", f"loom:probe:{second}"])


def test_agent_states_spread_over_the_primaries_and_the_sweep_job_reaches_them_all(
        cluster, queue_url, tmp_path, monkeypatch):
    """Scopes of one namespace land in different slots; the sweep job, listing them from the
    namespace's own indexes (never a SCAN), strips an expired field on every primary."""
    import time

    from app.clock import FrozenClock
    from jobs import agent_state_sweep
    from jobs.context import use_services
    from tests.test_agent_state import enable, guide_type, put

    # Written ten days ago by the real clock's reckoning; the job runs on the real clock.
    clock = FrozenClock(start=time.time() - 10 * 86_400)
    app = make_app(cluster.url, tmp_path, redis_cluster="on", queue_url=queue_url, clock=clock)
    client = app.test_client()
    enable(client, types=[guide_type(retention={"state": "60d", "cart_note": "7d"})])
    conversations = [f"conv-{i}" for i in range(12)]
    for conversation in conversations:
        status, out = put(client, {"step": "sizes", "cart_note": "wrap it"},
                          {"kind": "conversation", "id": conversation})
        assert status == 200 and out["stored"] is True, out
    data = app.extensions["loom"].redis
    state_keys = list(data.scan_iter(match="loom:as:*"))
    assert len(state_keys) == len(conversations)
    owners = {data.get_node_from_key(key).port for key in state_keys}
    assert len(owners) >= 2, owners  # one namespace's states on more than one primary

    for name, value in {"REDIS_URL": cluster.url, "LOOM_REDIS_CLUSTER": "on",
                        "LOOM_QUEUE_URL": queue_url, "LOOM_SECRET_KEY": TEST_SECRET,
                        "LOOM_DATA_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)
    use_services(None)  # the job builds its own from the environment, as a worker does
    try:
        totals = agent_state_sweep.sweep()
    finally:
        use_services(None)
    assert totals["namespaces"] == 1 and totals["fields_removed"] == len(conversations)
    assert all("wrap it" not in data.hget(key, "body") for key in state_keys)
