"""profile.structured reads: scope rules, statuses, and O(1) Redis work whatever the facts."""

from __future__ import annotations

from tests.auth_support import ADMIN_TOKEN, auth_app, bearer, mint
from tests.conftest import on_cluster_skip
from tests.test_structured_worker import SCHEMA

NS = {"namespace": "support", "agent": "chat"}


def _commands(redis_client) -> int:
    stats = redis_client.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if not k.startswith(("cmdstat_info",
                                                                           "cmdstat_config")))


@on_cluster_skip  # INFO commandstats of one server
def test_a_read_costs_the_same_redis_work_with_1_or_300_facts(client, redis_client):
    client.post("/v1/profile_schema.set", json={**NS, "json_schema": SCHEMA})
    client.post("/v1/memory.set", json={**NS, "user_id": "few", "key": "k", "value": "v"})
    for i in range(300):
        client.post("/v1/memory.set", json={**NS, "user_id": "many", "key": f"k{i}",
                                            "value": f"v{i}"})
    # A first read loads the activity script (NOSCRIPT, SCRIPT LOAD); count warm reads.
    client.post("/v1/profile.structured", json={**NS, "user_id": "warm-up"})
    costs = []
    for user in ("few", "many"):
        redis_client.config_resetstat()
        out = client.post("/v1/profile.structured", json={**NS, "user_id": user}).get_json()
        assert out["status"] == "pending"
        costs.append(_commands(redis_client))
    assert costs[0] == costs[1]
    # Four HGETALLs in one MULTI (MULTI, EXEC), one activity script, and for a pending or
    # stale profile the pass schedule behind next_pass_at (a GET and an HGET).
    assert costs[0] <= 13


def test_no_schema_reads_an_empty_profile(client):
    out = client.post("/v1/profile.structured", json={**NS, "user_id": "u"}).get_json()
    assert out["status"] == "no_schema" and out["profile"] == {}
    assert out["schema_sha256"] == "" and out["version_text"] == "0"


def test_user_id_is_required(client):
    client.post("/v1/profile_schema.set", json={**NS, "json_schema": SCHEMA})
    response = client.post("/v1/profile.structured", json=NS)
    assert response.status_code == 422
    assert response.get_json()["error"]["code"] == "IDENTITY_INCOMPLETE"


def test_own_session_read_scope_is_refused(client):
    response = client.post("/v1/profile.structured",
                           json={**NS, "user_id": "u", "read_scope": "own_session"})
    assert response.status_code == 422 and "read_scope" in response.get_json()["error"]["fields"]


def test_token_scope_rules(app_factory):
    client = auth_app(app_factory).test_client()
    client.post("/v1/profile_schema.set", json={**NS, "json_schema": SCHEMA},
                headers=bearer(ADMIN_TOKEN))
    pinned = mint(client, namespace="support", role="viewer", read_user_id="u-1")
    out = client.post("/v1/profile.structured", json=NS, headers=bearer(pinned))
    assert out.status_code == 200  # the pinned user, without user_id in the body
    other = client.post("/v1/profile.structured", json={**NS, "user_id": "u-2"},
                        headers=bearer(pinned))
    assert other.status_code == 403
    bound = mint(client, namespace="support", role="viewer", session_id="s-1",
                 read_user_id="u-1")
    without = client.post("/v1/profile.structured", json={**NS, "user_id": "u-1"},
                          headers=bearer(bound))
    assert without.status_code == 422
    assert without.get_json()["error"]["code"] == "IDENTITY_INCOMPLETE"
    with_session = client.post("/v1/profile.structured",
                               json={**NS, "user_id": "u-1", "session_id": "s-1"},
                               headers=bearer(bound))
    assert with_session.status_code == 403
    assert with_session.get_json()["error"]["code"] == "AUTH_INSUFFICIENT"
    own_session = mint(client, namespace="support", role="viewer", read_scope="own_session")
    refused = client.post("/v1/profile.structured", json={**NS, "user_id": "u-1"},
                          headers=bearer(own_session))
    assert refused.get_json()["error"]["code"] == "IDENTITY_INCOMPLETE"


def test_reads_count_in_profile_activity(client):
    client.post("/v1/profile_schema.set", json={**NS, "json_schema": SCHEMA})
    client.post("/v1/profile.structured", json={**NS, "user_id": "u-1"},
                headers={"X-Loom-Client": "support-widget/2.1"})
    entries = client.post("/v1/profile.activity", json={**NS, "user_id": "u-1"}).get_json()
    assert entries["entries"][0]["client"] == "support-widget/2.1"
    assert entries["entries"][0]["agent"] == "chat"
