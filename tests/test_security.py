"""What an adversarial tenant and an end user tried with auth on, one test per finding.

Each test drives the Flask app over a real redis-server with tokens minted through
``token.create``; the registry-wide walk of the same conditions is ``test_auth_matrix``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.auth_support import ADMIN_TOKEN, auth_app, bearer, mint
from tests.support.api import op_helpers

NS = "shop"
LOYALTY = {"type": "loyalty_state", "ownership": "agent",
           "fields": {"tier": {"type": "string"}, "note": {"type": "text", "pii": True}},
           "agent_state": {"scope": "subject", "max_bytes": 16384, "write": "both"}}
GUIDE = {"type": "shop_guide_state", "ownership": "agent",
         "fields": {"offer": {"type": "string"}, "note": {"type": "text", "pii": True}},
         "agent_state": {"scope": "conversation", "max_bytes": 16384, "write": "both"}}
VICTIM_HANDLES = ("victim@example.com", "+33711223344", "u2")


@pytest.fixture
def client(app_factory):
    client = auth_app(app_factory).test_client()
    admin = bearer(ADMIN_TOKEN)
    for op, body in (("features.set", {"features": {"agent_state": True}}),
                     ("object_types.set", {"types": [LOYALTY, GUIDE]})):
        response = client.post(f"/v1/{op}", json={"namespace": NS, **body}, headers=admin)
        assert response.status_code == 200, response.get_json()
    return client


call, _ = op_helpers({"namespace": NS}, headers_for=bearer)


def put_state(client, token: str, agent: str, scope: dict[str, str], body: dict[str, Any],
              **extra: Any) -> tuple[int, dict[str, Any]]:
    response = client.put("/v1/agent-state", headers=bearer(token), json={
        "namespace": NS, "agent": agent, "scope": scope, "body": body, **extra})
    return response.status_code, response.get_json()


def read_state(client, token: str, agent: str, scope: dict[str, str]):
    response = client.post("/v1/agent-state/read", headers=bearer(token),
                           json={"namespace": NS, "agent": agent, "scope": scope})
    return response.status_code, response.get_json()


def plant_victims(client) -> None:
    for handle in VICTIM_HANDLES:
        status, out = put_state(client, ADMIN_TOKEN, "loyalty",
                                {"kind": "subject", "id": handle}, {"tier": f"SECRET {handle}"})
        assert status == 200 and out["stored"], out
    status, out = put_state(client, ADMIN_TOKEN, "shop_guide",
                            {"kind": "conversation", "id": "conv-victim"},
                            {"offer": "SECRET offer"}, subject="u2")
    assert status == 200 and out["stored"], out


# --- 1. the data package of a pinned token --------------------------------------------------


def test_a_pinned_token_exports_only_its_own_user(client):
    plant_victims(client)
    put_state(client, ADMIN_TOKEN, "loyalty", {"kind": "subject", "id": "u1"}, {"tier": "mine"})
    viewer = mint(client, namespace=NS, role="viewer", read_user_id="u1")
    status, out = call(client, "subject.export", viewer, handles=list(VICTIM_HANDLES))
    assert status == 403 and list(out["error"]["fields"]) == ["handles.0"], out
    assert "SECRET" not in json.dumps(out)
    for handle in VICTIM_HANDLES:
        status, out = call(client, "subject.export", viewer, handles=["u1", handle])
        assert status == 403 and list(out["error"]["fields"]) == ["handles.1"], (handle, out)
    # Its own id as a handle is fine; without the agent_state scope the states carry no values.
    status, out = call(client, "subject.export", viewer, handles=["u1"])
    assert status == 200 and out["counts"]["agent_states"] == 1
    assert "value" not in out["agent_states"][0]["fields"]["tier"]
    assert "mine" not in json.dumps(out)
    scoped = mint(client, namespace=NS, role="writer", read_user_id="u1", scopes=["agent_state"])
    status, out = call(client, "subject.export", scoped)
    assert status == 200 and out["agent_states"][0]["fields"]["tier"]["value"] == "mine"
    # An admin still names the customer's other handles.
    status, out = call(client, "subject.export", ADMIN_TOKEN, user_id="u2",
                       handles=["victim@example.com"])
    assert status == 200 and out["counts"]["agent_states"] == 3


# --- 2. the agent-state plane and read_user_id pins ------------------------------------------


def test_a_pinned_token_reaches_only_states_about_its_user(client):
    plant_victims(client)
    pinned = mint(client, namespace=NS, role="writer", read_user_id="u1", scopes=["agent_state"])
    victim = {"kind": "subject", "id": "u2"}
    assert read_state(client, pinned, "loyalty", victim)[0] == 403
    status, _ = put_state(client, pinned, "loyalty", victim, {"tier": "overwritten"})
    assert status == 403
    assert read_state(client, ADMIN_TOKEN, "loyalty", victim)[1]["body"]["tier"] == "SECRET u2"
    conversation = {"kind": "conversation", "id": "conv-victim"}
    assert read_state(client, pinned, "shop_guide", conversation)[0] == 403
    assert put_state(client, pinned, "shop_guide", conversation, {"offer": "x"})[0] == 403
    assert put_state(client, pinned, "shop_guide", {"kind": "conversation", "id": "conv-new"},
                     {"offer": "x"}, subject="u2")[0] == 403
    for handle in VICTIM_HANDLES:
        response = client.get(f"/v1/profiles/{handle}/agent-state?namespace={NS}",
                              headers=bearer(pinned))
        assert response.status_code == 403, handle
    status, _ = call(client, "agent_state.erase", mint(client, namespace=NS, role="admin",
                                                       read_user_id="u1"),
                     scope=conversation)
    assert status == 403
    # Its own user: the subject scope, and a conversation that then names them.
    own = {"kind": "subject", "id": "u1"}
    assert put_state(client, pinned, "loyalty", own, {"tier": "gold"})[0] == 200
    assert read_state(client, pinned, "loyalty", own)[1]["body"] == {"tier": "gold"}
    mine = {"kind": "conversation", "id": "conv-mine"}
    assert put_state(client, pinned, "shop_guide", mine, {"offer": "y"})[0] == 200
    response = client.get(f"/v1/profiles/u1/agent-state?namespace={NS}", headers=bearer(pinned))
    assert response.status_code == 200 and response.get_json()["count"] == 2


# --- 5. lookups by memory_id and an agent-bound token ----------------------------------------


def test_an_agent_bound_token_cannot_act_on_another_agents_row_by_memory_id(client):
    status, row = call(client, "memory.set", ADMIN_TOKEN, agent="bot2", user_id="u1",
                       key="plan", value="bot2's plan")
    assert status == 200
    bot1 = mint(client, namespace=NS, role="writer", agent="bot1")
    memory_id = row["memory_id"]
    status, out = call(client, "memory.get", bot1, memory_id=memory_id)
    assert status == 200 and out["found"] is False
    for op in ("memory.pin", "memory.lock", "memory.unlock", "memory.unpin", "memory.delete",
               "memory.history"):
        status, out = call(client, op, bot1, memory_id=memory_id)
        assert status == 404 and out["error"]["code"] == "MEMORY_NOT_FOUND", (op, out)
    assert "bot2's plan" not in json.dumps(out)
    # bot2 still writes its row: nothing locked it.
    status, _ = call(client, "memory.set", ADMIN_TOKEN, agent="bot2", user_id="u1",
                     key="plan", value="still mine")
    assert status == 200
    bot2 = mint(client, namespace=NS, role="writer", agent="bot2")
    assert call(client, "memory.get", bot2, memory_id=memory_id)[1]["found"] is True


def test_a_pinned_token_cannot_reach_another_users_row_by_memory_id(client):
    status, row = call(client, "memory.set", ADMIN_TOKEN, agent="bot", user_id="u2",
                       key="k", value="u2's")
    assert status == 200
    pinned = mint(client, namespace=NS, role="writer", read_user_id="u1")
    for op in ("memory.get", "memory.lock", "memory.delete"):
        status, out = call(client, op, pinned, agent="bot", memory_id=row["memory_id"])
        assert "u2's" not in json.dumps(out)
        assert status == 404 or out.get("found") is False, (op, out)


# --- 9. the org's model-call switch ----------------------------------------------------------


def test_only_a_token_reaching_every_namespace_switches_the_orgs_model_calls(client):
    namespace_admin = mint(client, org="default", namespace=NS, role="admin")
    status, out = call(client, "org.set_model_calls", namespace_admin, enabled=False)
    assert status == 403 and out["error"]["code"] == "AUTH_INSUFFICIENT"
    assert call(client, "usage.get", ADMIN_TOKEN)[1]["model_calls_enabled"] is True
    org_admin = mint(client, org="default", namespace="*", role="admin")
    status, out = call(client, "org.set_model_calls", org_admin, enabled=False)
    assert status == 200 and out["model_calls_enabled"] is False


# --- 11. '*' is never a written agent --------------------------------------------------------


def test_star_is_refused_wherever_an_agent_is_written_or_fixed(client):
    status, out = call(client, "working_memory.set", ADMIN_TOKEN, agent="*", block_key="b",
                       content="x")
    assert status == 422 and "agent" in out["error"]["fields"], out
    assert "<working-memory" not in call(client, "context.pack", ADMIN_TOKEN, agent="*",
                                         user_id="-")[1].get("pack", "")
    status, out = call(client, "token.create", ADMIN_TOKEN, role="writer", agent="*")
    assert status == 422 and "agent" in out["error"]["fields"], out
    for op, body in (("profile.set", {"label": "l", "value": "v"}),
                     ("memory.set", {"key": "k", "value": "v"})):
        status, out = call(client, op, ADMIN_TOKEN, agent="*", user_id="u1", **body)
        assert status == 422, (op, out)
    status, _ = put_state(client, ADMIN_TOKEN, "*", {"kind": "subject", "id": "u1"},
                          {"tier": "x"})
    assert status == 422


# --- 12. a session-bound token is bound to its user ------------------------------------------


def test_a_session_token_is_bound_to_a_user_and_reaches_no_other(client):
    status, out = call(client, "working_memory.set", ADMIN_TOKEN, agent="bot", user_id="u2",
                       session_id="s1", block_key="b", content="u2's block")
    assert status == 200
    status, out = call(client, "token.create", ADMIN_TOKEN, role="viewer", session_id="s1")
    assert status == 422 and "read_user_id" in out["error"]["fields"]
    bound = mint(client, namespace=NS, role="viewer", session_id="s1", read_user_id="u1")
    status, out = call(client, "working_memory.get", bound, agent="bot", user_id="u2",
                       session_id="s1", block_key="b")
    assert status == 403 and "u2's block" not in json.dumps(out)


def test_a_session_token_minted_without_a_user_is_refused(client, app_factory):
    """A token minted before the rule holds a session and no user: every call is refused."""
    from app.store.tokens import TokenStore

    services = client.application.extensions["loom"]
    secret, _row = services.store(TokenStore).create(
        {"org": "default", "namespace": NS, "role": "viewer", "read_scope": "namespace",
         "read_user_id": None, "session_id": "s1", "agent": None, "scopes": [], "label": "",
         "expires_at": None}, "test")
    status, out = call(client, "working_memory.get", secret, agent="bot", user_id="u2",
                       session_id="s1", block_key="b")
    assert status == 403 and out["error"]["code"] == "AUTH_INSUFFICIENT"


# --- 8. authentication and the request budget come before the body ---------------------------


def test_a_bad_token_is_401_and_a_spent_budget_429_before_the_body_is_read(app_factory, clock):
    client = auth_app(app_factory, rate_limit=(3, 60), clock=clock).test_client()
    token = mint(client, namespace=NS, role="viewer")
    malformed = b'{"namespace": "shop", "agent": '
    for forged in ("loom_0000000000000000_forged", "not-a-token"):
        response = client.post("/v1/working_memory.get", data=malformed,
                               content_type="application/json", headers=bearer(forged))
        assert response.status_code == 401, response.get_json()
    for _ in range(3):  # malformed bodies spend the budget too
        response = client.post("/v1/working_memory.get", data=malformed,
                               content_type="application/json", headers=bearer(token))
        assert response.status_code == 400
    for body in (malformed, b"x" * 300_000):
        response = client.post("/v1/working_memory.get", data=body,
                               content_type="application/json", headers=bearer(token))
        assert response.status_code == 429, response.get_json()


def _chunked_post(port: int, token: str, body: bytes) -> tuple[int, dict[str, Any]]:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    pieces = (body[i:i + 4096] for i in range(0, len(body), 4096))
    connection.request("POST", "/v1/working_memory.get", body=pieces, encode_chunked=True,
                       headers={"Content-Type": "application/json",
                                "Transfer-Encoding": "chunked", **bearer(token)})
    response = connection.getresponse()
    out = json.loads(response.read())
    connection.close()
    return response.status, out


def test_a_chunked_body_past_the_limit_is_413_under_gunicorn(redis_url, tmp_path):
    from tests.conftest import TEST_SECRET
    from tests.support.live_server import LiveServer

    env = {"REDIS_URL": redis_url, "LOOM_SECRET_KEY": TEST_SECRET,
           "LOOM_DATA_DIR": str(tmp_path), "LOOM_AUTH": "on",
           "LOOM_ADMIN_TOKEN": ADMIN_TOKEN, "LOOM_MAX_BODY_BYTES": "4096"}
    with LiveServer(env, workers=1) as server:
        small = json.dumps({"namespace": NS, "agent": "bot", "block_key": "b"}).encode()
        status, out = _chunked_post(server.port, ADMIN_TOKEN, small)
        assert status == 200 and out["found"] is False
        # Just past the limit: small enough for the socket buffers, so the answer is read.
        large = json.dumps({"namespace": NS, "agent": "bot", "block_key": "b",
                            "pad": "a" * 6000}).encode()
        status, out = _chunked_post(server.port, ADMIN_TOKEN, large)
        assert status == 413 and out["error"]["code"] == "BODY_TOO_LARGE", out
        status, out = _chunked_post(server.port, "loom_0000000000000000_forged", large)
        assert status == 401


# --- 3. regular-expression denial of service --------------------------------------------------

CATASTROPHIC = [r"(a|aa)+b", r"(a+)+b", r"(a|a)*b", r"(.*a){12}b", r"(x+x+)+y",
                r"^(([a-z])+.)+[A-Z]([a-z])+$", r"(\w+\s?)+$"]


def test_catastrophic_rules_mask_in_linear_time():
    """Each pattern masks a 45-character hostile input in a child process bounded to 20 s in
    all (backtracking takes hours on some of them); linear matching takes milliseconds."""
    import subprocess
    import sys

    program = (
        "import json, sys\n"
        "from app.pii import validate_pii_rules, mask_text\n"
        "out = {}\n"
        "for pattern in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        rules = validate_pii_rules([{'name': 'r', 'pattern': pattern}])\n"
        "    except Exception as exc:\n"
        "        out[pattern] = 'refused:' + type(exc).__name__\n"
        "        continue\n"
        "    for text in ('a' * 45, 'x' * 45, 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!'):\n"
        "        mask_text(text, rules)\n"
        "    out[pattern] = mask_text('aab', rules)\n"
        "print(json.dumps(out))\n"
    )
    from pathlib import Path

    done = subprocess.run([sys.executable, "-c", program, json.dumps(CATASTROPHIC)],
                          capture_output=True, text=True, timeout=20,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out[r"(a|aa)+b"] == "[r]"
    assert set(out) == set(CATASTROPHIC)


def test_a_rule_that_cannot_run_in_linear_time_is_refused(client):
    for pattern in (r"(a)\1", r"a(?=b)", r"(?<!x)a", r"(?>a+)b", r"a++b"):
        status, out = call(client, "features.set", ADMIN_TOKEN, features={
            "agent_state": True, "pii_rules": [{"name": "r", "pattern": pattern}]})
        assert status == 422 and out["error"]["rule"] == "pii_rule_pattern_unsafe", out
        assert list(out["error"]["fields"]) == ["features.pii_rules[0].pattern"]


def test_a_catastrophic_rule_is_accepted_and_masks_through_the_api(client):
    # (A short run of a's: the hostile length is the child process's test above, bounded.)
    status, out = call(client, "features.set", ADMIN_TOKEN, features={
        "agent_state": True, "pii_rules": [{"name": "member", "pattern": r"(a|aa)+b"}]})
    assert status == 200, out
    status, out = put_state(client, ADMIN_TOKEN, "shop_guide",
                            {"kind": "conversation", "id": "c-redos"},
                            {"note": "a" * 20 + " then aab"})
    assert status == 200 and out["stored"], out
    body = read_state(client, ADMIN_TOKEN, "shop_guide",
                      {"kind": "conversation", "id": "c-redos"})[1]["body"]
    assert body["note"] == "a" * 20 + " then [member]"


# --- 6. masking keys and disguised text -------------------------------------------------------


def test_pii_masking_reaches_object_keys_and_disguised_text(client):
    guide = {**GUIDE, "fields": {**GUIDE["fields"],
                                 "contacts": {"type": "object", "pii": True}}}
    status, out = call(client, "object_types.set", ADMIN_TOKEN, types=[LOYALTY, guide])
    assert status == 200, out
    scope = {"kind": "conversation", "id": "c-pii"}
    status, out = put_state(client, ADMIN_TOKEN, "shop_guide", scope, {
        "contacts": {"ana@example.com": "+14155550123", "bo@example.com": "x"},
        "note": "write to ana\u200b@example.com or \uff41\uff4e\uff41@example.com, "
                "or call +1\u2060415\u00ad555\u200b0123"})
    assert status == 200 and out["stored"], out
    stored = read_state(client, ADMIN_TOKEN, "shop_guide", scope)[1]["body"]
    text = json.dumps(stored, ensure_ascii=False)
    for raw in ("ana", "bo@", "example.com", "4155550123", "415"):
        assert raw not in text, (raw, text)
    assert stored["contacts"] == {"[email]": "[phone]", "[email]#2": "x"}
    assert stored["note"] == "write to [email] or [email], or call [phone]"
    # Text with nothing to mask is kept exactly as written, non-ASCII included.
    status, _ = put_state(client, ADMIN_TOKEN, "shop_guide", scope, {"note": "caf\u00e9 \uff21"})
    assert read_state(client, ADMIN_TOKEN, "shop_guide", scope)[1]["body"]["note"] == (
        "caf\u00e9 \uff21")


# --- 7. a deep schema -------------------------------------------------------------------------


def test_a_deeply_nested_profile_schema_is_422_not_500(client):
    node: dict[str, Any] = {"type": "string"}
    for _ in range(100):
        node = {"type": "object", "properties": {"p": node}}
    status, out = call(client, "profile_schema.set", ADMIN_TOKEN, json_schema=node)
    assert status == 422, out
    assert out["error"]["rule"] == "too_deep"
    assert next(iter(out["error"]["fields"])).startswith("properties.p.properties.p")
