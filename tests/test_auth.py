"""Tokens, roles, reach and read scopes with LOOM_AUTH=on."""

from __future__ import annotations

import pytest

from tests.auth_support import ADMIN_TOKEN, auth_app, bearer, mint
from tests.support.api import op_helpers
from tests.support.redis_dump import dump_everything

WM = {"namespace": "support", "agent": "bot"}


@pytest.fixture
def client(app_factory):
    return auth_app(app_factory).test_client()


call, _ = op_helpers(headers_for=lambda token: bearer(token) if token else {})


def test_auth_on_needs_a_secret_key(app_factory):
    from app.settings import SettingsError

    with pytest.raises(SettingsError, match="LOOM_SECRET_KEY"):
        app_factory(auth="on", secret_key="")


def test_no_token_unknown_token_and_malformed_header_are_401(client):
    assert call(client, "working_memory.get", **WM)[1]["error"]["code"] == "AUTH_REQUIRED"
    status, out = call(client, "working_memory.get", "loom_abc_def", **WM)
    assert (status, out["error"]["code"]) == (401, "AUTH_INVALID")
    response = client.post("/v1/working_memory.get", json=WM, headers={"Authorization": "Basic x"})
    assert response.status_code == 401


def test_the_secret_is_answered_once_and_only_its_keyed_hash_is_stored(client, redis_client):
    status, out = call(client, "token.create", ADMIN_TOKEN, namespace="support", role="writer")
    assert status == 200
    secret = out["token"]
    assert secret.startswith("loom_" + out["token_id"] + "_")
    dump = dump_everything(redis_client)
    assert secret not in dump and secret.split("_", 2)[2] not in dump
    status, listed = call(client, "token.list", ADMIN_TOKEN)
    assert status == 200
    assert [row["token_id"] for row in listed["tokens"]] == [out["token_id"]]
    assert "token" not in listed["tokens"][0] and "hash" not in listed["tokens"][0]


def test_a_minted_token_works_and_fills_identity(client):
    token = mint(client, namespace="support", role="writer", agent="bot")
    status, out = call(client, "working_memory.set", token, content="hello")
    assert status == 200, out
    assert call(client, "working_memory.get", token)[1]["content"] == "hello"


def test_revoked_token_fails_on_its_next_use(client):
    out = call(client, "token.create", ADMIN_TOKEN, namespace="support", role="writer")[1]
    assert call(client, "working_memory.get", out["token"], **WM)[0] == 200
    assert call(client, "token.revoke", ADMIN_TOKEN, token_id=out["token_id"])[0] == 200
    status, body = call(client, "working_memory.get", out["token"], **WM)
    assert (status, body["error"]["code"]) == (401, "AUTH_INVALID")
    assert call(client, "token.list", ADMIN_TOKEN)[1]["tokens"][0]["revoked"] is True


def test_expired_token_fails(app_factory, clock):
    client = auth_app(app_factory, clock=clock).test_client()
    token = mint(client, namespace="support", role="viewer", expires_at="2027-06-01T00:00:00Z")
    assert call(client, "working_memory.get", token, **WM)[0] == 200
    clock.advance(86400 * 365)
    assert call(client, "working_memory.get", token, **WM)[0] == 401


def test_expiry_in_the_past_is_refused(client):
    status, out = call(
        client, "token.create", ADMIN_TOKEN, role="viewer", expires_at="2001-01-01T00:00:00Z"
    )
    assert status == 422 and "expires_at" in out["error"]["fields"]


def test_role_ranks(client):
    viewer = mint(client, namespace="support", role="viewer")
    writer = mint(client, namespace="support", role="writer")
    status, out = call(client, "working_memory.set", viewer, content="x", **WM)
    assert (status, out["error"]["code"]) == (403, "AUTH_INSUFFICIENT")
    assert call(client, "working_memory.set", writer, content="x", **WM)[0] == 200
    assert call(client, "working_memory.get", viewer, **WM)[0] == 200
    assert call(client, "token.list", writer)[0] == 403


def test_a_token_cannot_mint_above_itself(client):
    admin_ns = mint(client, namespace="support", role="admin", read_scope="own_user")
    cases = [
        {"namespace": "other", "role": "viewer"},
        {"namespace": "*", "role": "viewer"},
        {"org": "another-org", "role": "viewer"},
        {"role": "viewer", "read_scope": "namespace"},
    ]
    for claims in cases:
        status, out = call(client, "token.create", admin_ns, **claims)
        assert (status, out["error"]["code"]) == (403, "AUTH_INSUFFICIENT"), claims
    pinned_admin = mint(client, namespace="support", role="admin", read_user_id="u1")
    status, _ = call(client, "token.create", pinned_admin, role="viewer", read_user_id="u2")
    assert status == 403
    status, out = call(client, "token.create", pinned_admin, role="viewer")
    assert status == 200 and out["read_user_id"] == "u1" and out["namespace"] == "support"


def test_a_writer_cannot_mint_at_all(client):
    writer = mint(client, namespace="support", role="writer")
    assert call(client, "token.create", writer, role="viewer")[0] == 403


def test_other_org_and_namespace_are_403(client):
    token = mint(client, org="acme", namespace="support", role="admin")
    assert call(client, "working_memory.get", token, org="acme", **WM)[0] == 200
    status, out = call(client, "working_memory.get", token, org="globex", **WM)
    assert (status, list(out["error"]["fields"])) == (403, ["org"])
    status, out = call(client, "working_memory.get", token, namespace="sales", agent="bot")
    assert (status, list(out["error"]["fields"])) == (403, ["namespace"])


def test_pinned_user_reads_only_that_user(client):
    admin = mint(client, namespace="support", role="admin")
    call(client, "working_memory.set", admin, content="mine", user_id="u1", **WM)
    call(client, "working_memory.set", admin, content="theirs", user_id="u2", **WM)
    pinned = mint(client, namespace="support", role="viewer", read_user_id="u1")
    assert call(client, "working_memory.get", pinned, **WM)[1]["content"] == "mine"
    assert call(client, "working_memory.get", pinned, user_id="u1", **WM)[1]["content"] == "mine"
    status, out = call(client, "working_memory.get", pinned, user_id="u2", **WM)
    assert (status, out["error"]["code"], list(out["error"]["fields"])) == (
        403, "AUTH_INSUFFICIENT", ["user_id"]
    )


def test_session_bound_token(client):
    bound = mint(client, namespace="support", role="writer", session_id="s1", read_user_id="u1")
    assert call(client, "working_memory.set", bound, content="x", **WM)[0] == 200
    assert call(client, "working_memory.get", bound, session_id="s1", **WM)[1]["found"] is True
    assert call(client, "working_memory.get", bound, session_id="s2", **WM)[0] == 403


def test_install_admin_reaches_every_org(client):
    status, _ = call(client, "working_memory.set", ADMIN_TOKEN, org="globex", content="g", **WM)
    assert status == 200
    token = mint(client, org="globex", namespace="support", role="viewer")
    assert call(client, "working_memory.get", token, **WM)[1]["content"] == "g"


def test_auth_off_honours_a_token_that_is_sent(app_factory):
    client = app_factory(admin_token=ADMIN_TOKEN).test_client()
    assert call(client, "working_memory.get", **WM)[0] == 200
    assert call(client, "working_memory.get", "loom_x_y", **WM)[0] == 401
    viewer = mint(client, namespace="support", role="viewer")
    assert call(client, "working_memory.set", viewer, content="x", **WM)[0] == 403


def test_request_budget_answers_429_with_retry_after(app_factory, clock):
    client = auth_app(app_factory, rate_limit=(3, 60), clock=clock).test_client()
    token = mint(client, namespace="support", role="viewer")
    other = mint(client, namespace="support", role="viewer")
    for _ in range(3):
        assert call(client, "working_memory.get", token, **WM)[0] == 200
    response = client.post("/v1/working_memory.get", json=WM, headers=bearer(token))
    assert response.status_code == 429
    assert response.get_json()["error"]["code"] == "RATE_LIMITED"
    assert 1 <= int(response.headers["Retry-After"]) <= 60
    assert call(client, "working_memory.get", other, **WM)[0] == 200  # per token
    clock.advance(61)
    assert call(client, "working_memory.get", token, **WM)[0] == 200


def test_request_budget_is_off_by_default_with_auth_off(client):
    token = mint(client, namespace="support", role="viewer")
    for _ in range(50):
        assert call(client, "working_memory.get", token, **WM)[0] == 200


def test_rate_limit_setting_is_checked_at_start(app_factory):
    from app.settings import SettingsError, load_settings

    with pytest.raises(SettingsError, match="LOOM_RATE_LIMIT"):
        load_settings({"LOOM_RATE_LIMIT": "lots", "LOOM_SECRET_KEY": "k"})
    assert load_settings({"LOOM_RATE_LIMIT": "100/minute", "LOOM_SECRET_KEY": "k"}).rate_limit == (
        100, 60
    )


def test_cli_mints_a_working_token(app_factory):
    app = auth_app(app_factory)
    result = app.test_cli_runner().invoke(
        args=["loom", "token", "create", "--role", "writer", "--namespace", "support"]
    )
    assert result.exit_code == 0, result.output
    secret = result.output.split("token:", 1)[1].strip()
    client = app.test_client()
    assert call(client, "working_memory.set", secret, content="cli", **WM)[0] == 200
    listed = app.test_cli_runner().invoke(args=["loom", "token", "list"])
    assert "writer" in listed.output and "support" in listed.output
    token_id = result.output.split("token_id:", 1)[1].split()[0]
    assert app.test_cli_runner().invoke(args=["loom", "token", "revoke", token_id]).exit_code == 0
    assert call(client, "working_memory.get", secret, **WM)[0] == 401
