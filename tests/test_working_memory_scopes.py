"""working_memory.scopes: a user's scopes and block counts, never content, within the token."""

from __future__ import annotations

from tests.auth_support import ADMIN_TOKEN, auth_app, bearer, mint

WHO = {"namespace": "support", "user_id": "u-42"}


def write(client, headers=None, **scope):
    body = {**WHO, "content": "cursor: ticket 4812", **scope}
    response = client.post("/v1/working_memory.set", json=body, headers=headers or {})
    assert response.status_code == 200, response.get_json()


def scopes(client, headers=None, **body):
    response = client.post("/v1/working_memory.scopes", json={**WHO, **body},
                           headers=headers or {})
    return response.status_code, response.get_json()


def test_scopes_list_agent_session_run_and_counts_in_order(client):
    write(client, agent="b-bot", run_id="run:7/x", block_key="state")
    write(client, agent="b-bot", run_id="run:7/x", block_key="cursor")
    write(client, agent="a-bot", session_id="s-1")
    write(client, agent="a-bot", user_id="u-other")
    status, out = scopes(client)
    assert status == 200
    assert out["scopes"] == [
        {"agent": "a-bot", "session_id": "s-1", "run_id": "-", "block_count": 1},
        {"agent": "b-bot", "session_id": "-", "run_id": "run:7/x", "block_count": 2},
    ]
    assert "cursor: ticket" not in str(out)


def test_a_scope_whose_last_block_is_deleted_is_not_listed(client):
    write(client, agent="a-bot", block_key="state")
    response = client.post("/v1/working_memory.delete",
                           json={**WHO, "agent": "a-bot", "block_key": "state"})
    assert response.get_json()["deleted"] is True
    assert scopes(client)[1]["scopes"] == []


def test_a_token_sees_only_its_agent_and_user(app_factory):
    client = auth_app(app_factory).test_client()
    admin = bearer(ADMIN_TOKEN)
    write(client, admin, agent="a-bot")
    write(client, admin, agent="b-bot")
    own = bearer(mint(client, namespace="support", role="viewer", agent="a-bot"))
    status, out = scopes(client, own)
    assert status == 200
    assert [scope["agent"] for scope in out["scopes"]] == ["a-bot"]
    pinned = bearer(mint(client, namespace="support", role="viewer", read_user_id="u-9"))
    status, out = scopes(client, pinned)
    assert status == 403 and out["error"]["code"] == "AUTH_INSUFFICIENT"
