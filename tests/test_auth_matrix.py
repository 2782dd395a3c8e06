"""Every op in the registry x every way a caller can be out of reach.

The matrix reads the registry, so an op added later is covered without editing this file: it
only needs an ``example`` body in its declaration. Marker strings are planted in the victim's
org, namespace and user through every write op; no answer to any other caller may carry one.
The conditions: no, unknown or revoked token; another org or namespace; a role too low; a
token pinned to another user, bound to another session or fixed to another agent; the
victim's memory_id or customer handles named by such a token; an op on the whole org from a
namespace's token; and every write naming the victim while their erasure runs.
"""

from __future__ import annotations

import json
import re
from urllib.parse import urlencode

import pytest

from app.ops import load_ops
from app.principal import ROLE_RANK
from app.store import keys
from tests.auth_support import ADMIN_TOKEN, auth_app, bearer, mint
from tests.conftest import flush_data_plane

OPS = list(load_ops())
VICTIM = {"org": "victim-org", "namespace": "victim-ns", "user_id": "victim-user",
          "session_id": "victim-session"}
MARKER = "MARKER-7d41c0"
# Free-text fields a write op stores: planting puts the marker in each of them.
TEXT_FIELDS = ("content", "addition", "value", "new")


def _schema_fields(declared) -> set[str]:
    return set(declared.args().load_fields)


def _url_and_body(declared, body):
    path = declared.http_path
    body = dict(body)
    for name in re.findall(r"<(?:\w+:)?(\w+)>", path):
        path = re.sub(rf"<(?:\w+:)?{name}>", str(body.pop(name)), path)
    return path, body


def send(client, declared, body, token=None):
    headers = bearer(token) if token else {}
    path, body = _url_and_body(declared, body)
    if declared.http_method == "GET":
        response = client.get(path + ("?" + urlencode(body) if body else ""), headers=headers)
    else:
        response = client.open(path, method=declared.http_method, json=body, headers=headers)
    return response.status_code, response.get_data(as_text=True)


@pytest.fixture(scope="module")
def world(data_plane_url, tmp_path_factory):
    """An auth-on app with victim data planted through every write op, and the tokens."""
    flush_data_plane(data_plane_url)
    from tests.conftest import make_app

    app = auth_app(
        lambda **o: make_app(data_plane_url, tmp_path_factory.mktemp("matrix"), **o)
    )
    client = app.test_client()
    planted: dict[str, str] = {}
    for declared in OPS:
        if declared.kind == "read" or not declared.example:
            continue
        if declared.method.endswith(("erase", "clear", "delete", "delete_version", "revoke",
                                     "redact")):
            continue  # planting writes; these would remove what was planted
        body = {**declared.example}
        for name in ("org", "namespace", "user_id", "session_id"):
            if name in _schema_fields(declared):
                body[name] = VICTIM[name]
        for name in TEXT_FIELDS:
            if isinstance(body.get(name), str):
                body[name] = f"{MARKER} {body[name]}"
        status, text = send(client, declared, body, ADMIN_TOKEN)
        if declared.name == "memory.set":
            planted["memory_id"] = json.loads(text)["memory_id"]
    tokens = {
        "other_org": mint(client, org="other-org", namespace="*", role="admin"),
        "other_namespace": mint(client, org=VICTIM["org"], namespace="other-ns", role="admin"),
        "viewer": mint(client, org=VICTIM["org"], namespace=VICTIM["namespace"], role="viewer"),
        "writer": mint(client, org=VICTIM["org"], namespace=VICTIM["namespace"], role="writer"),
        "pinned": mint(client, org=VICTIM["org"], namespace=VICTIM["namespace"], role="admin",
                       read_user_id="other-user", scopes=["agent_state"]),
        "session_bound": mint(client, org=VICTIM["org"], namespace=VICTIM["namespace"],
                              role="admin", session_id="other-session",
                              read_user_id="other-user", scopes=["agent_state"]),
        "agent_bound": mint(client, org=VICTIM["org"], namespace=VICTIM["namespace"],
                            role="admin", agent="other-agent", scopes=["agent_state"]),
        "namespace_admin": mint(client, org=VICTIM["org"], namespace=VICTIM["namespace"],
                                role="admin", scopes=["agent_state"]),
    }
    revoked_answer = client.post(
        "/v1/token.create",
        json={"org": VICTIM["org"], "namespace": VICTIM["namespace"], "role": "admin"},
        headers=bearer(ADMIN_TOKEN),
    ).get_json()
    client.post("/v1/token.revoke", json={"token_id": revoked_answer["token_id"],
                                          "org": VICTIM["org"]}, headers=bearer(ADMIN_TOKEN))
    tokens["revoked"] = revoked_answer["token"]
    tokens["_memory_id"] = planted["memory_id"]
    tokens["_redis"] = data_plane_url
    yield client, tokens
    flush_data_plane(data_plane_url)


def _victim_body(declared, **overrides):
    body = {**declared.example}
    for name, value in {**VICTIM, **overrides}.items():
        if name in _schema_fields(declared):
            body[name] = value
    return body


def test_every_op_declares_an_example():
    missing = [declared.name for declared in OPS if not declared.example and
               _schema_fields(declared) - {"org", "namespace", "agent", "user_id",
                                           "session_id", "run_id"}]
    assert missing == [], "declare example= for these ops so the matrix can call them"


def test_markers_were_planted(world):
    client, _ = world
    out = client.post(
        "/v1/working_memory.get",
        json={**VICTIM, "agent": "triage-bot", "run_id": "run-7", "block_key": "state"},
        headers=bearer(ADMIN_TOKEN),
    ).get_json()
    assert MARKER in out["content"]


@pytest.mark.parametrize("declared", OPS, ids=lambda d: d.name)
def test_no_token_unknown_token_and_revoked_token_are_401(world, declared):
    client, tokens = world
    body = _victim_body(declared)
    for token in (None, "loom_0000000000000000_forged", tokens["revoked"]):
        status, text = send(client, declared, body, token)
        assert status == 401, (declared.name, token, text)
        assert MARKER not in text


@pytest.mark.parametrize("declared", OPS, ids=lambda d: d.name)
def test_other_org_and_other_namespace_are_403(world, declared):
    client, tokens = world
    for token in (tokens["other_org"], tokens["other_namespace"]):
        status, text = send(client, declared, _victim_body(declared), token)
        assert status == 403, (declared.name, text)
        assert MARKER not in text


@pytest.mark.parametrize("declared", OPS, ids=lambda d: d.name)
def test_role_too_low_is_403(world, declared):
    client, tokens = world
    for role in ("viewer", "writer"):
        if ROLE_RANK[role] >= ROLE_RANK[declared.role]:
            continue
        status, text = send(client, declared, _victim_body(declared), tokens[role])
        assert status == 403 and "AUTH_INSUFFICIENT" in text, (declared.name, role, text)


@pytest.mark.parametrize("declared", OPS, ids=lambda d: d.name)
def test_pinned_to_another_user_is_403(world, declared):
    if "user_id" not in _schema_fields(declared):
        pytest.skip("the op names no user")
    client, tokens = world
    status, text = send(client, declared, _victim_body(declared), tokens["pinned"])
    assert status == 403, (declared.name, text)
    assert MARKER not in text


@pytest.mark.parametrize("declared", OPS, ids=lambda d: d.name)
def test_session_bound_to_another_session_is_403(world, declared):
    if "session_id" not in _schema_fields(declared):
        pytest.skip("the op names no session")
    client, tokens = world
    status, text = send(client, declared, _victim_body(declared), tokens["session_bound"])
    assert status == 403, (declared.name, text)
    assert MARKER not in text


@pytest.mark.parametrize("declared", OPS, ids=lambda d: d.name)
def test_callers_acting_in_their_own_reach_never_see_a_marker(world, declared):
    client, tokens = world
    for name in ("other_org", "other_namespace", "pinned", "session_bound"):
        body = {k: v for k, v in declared.example.items() if k not in VICTIM}
        if name == "other_namespace" or name == "other_org":
            body["namespace"] = "other-ns"
        status, text = send(client, declared, body, tokens[name])
        assert status < 500, (declared.name, name, text)
        assert MARKER not in text, (declared.name, name)


BOUND = ("pinned", "session_bound", "agent_bound")


def _fresh_bound_tokens(client) -> dict[str, str]:
    """Tokens pinned to, bound to or fixed to someone else, minted for one test: an erasure of
    their user run by an earlier test revokes the module's own."""
    reach = {"org": VICTIM["org"], "namespace": VICTIM["namespace"], "role": "admin",
             "scopes": ["agent_state"]}
    return {
        "pinned": mint(client, **reach, read_user_id="other-user"),
        "session_bound": mint(client, **reach, session_id="other-session",
                              read_user_id="other-user"),
        "agent_bound": mint(client, **reach, agent="other-agent"),
    }


@pytest.mark.parametrize("declared", OPS, ids=lambda d: d.name)
def test_the_victims_memory_id_is_out_of_reach_of_bound_tokens(world, declared):
    if "memory_id" not in _schema_fields(declared):
        pytest.skip("the op takes no memory_id")
    client, tokens = world
    bound = _fresh_bound_tokens(client)
    for name in BOUND:
        body = {k: v for k, v in declared.example.items() if k not in ("key", *VICTIM)}
        body.update(namespace=VICTIM["namespace"], memory_id=tokens["_memory_id"])
        status, text = send(client, declared, body, bound[name])
        assert MARKER not in text, (declared.name, name)
        assert status in (403, 404) or '"found":false' in text, (declared.name, name, text)


@pytest.mark.parametrize("declared", OPS, ids=lambda d: d.name)
def test_a_pinned_token_names_no_other_customers_handles(world, declared):
    if "handles" not in _schema_fields(declared):
        pytest.skip("the op takes no handles")
    client, _tokens = world
    bound = _fresh_bound_tokens(client)
    for name in ("pinned", "session_bound"):
        body = {**declared.example, "namespace": VICTIM["namespace"], "user_id": "other-user",
                "handles": [VICTIM["user_id"]]}
        status, text = send(client, declared, body, bound[name])
        # (A session-bound token may also be refused first for spanning sessions.)
        assert status == 403 and ("handles.0" in text or name == "session_bound"), (
            declared.name, name, text)
        assert MARKER not in text


@pytest.mark.parametrize("declared", OPS, ids=lambda d: d.name)
def test_pinned_tokens_reach_only_agent_state_about_their_user(world, declared):
    if declared.plane != "agent_state":
        pytest.skip("not an agent-state op")
    client, _tokens = world
    bound = _fresh_bound_tokens(client)
    body = {**declared.example, "namespace": VICTIM["namespace"]}
    if "scope" in body:
        body["scope"] = {"kind": "subject", "id": VICTIM["user_id"]}
    if "profile_id" in body:
        body["profile_id"] = VICTIM["user_id"]
    for name in ("pinned", "session_bound"):
        status, text = send(client, declared, body, bound[name])
        assert status == 403, (declared.name, name, text)


@pytest.mark.parametrize("declared", [d for d in OPS if d.org_wide], ids=lambda d: d.name)
def test_an_op_on_the_whole_org_needs_every_namespace(world, declared):
    client, tokens = world
    status, text = send(client, declared, _victim_body(declared), tokens["namespace_admin"])
    assert status == 403 and "AUTH_INSUFFICIENT" in text, (declared.name, text)


@pytest.mark.parametrize("declared", OPS, ids=lambda d: d.name)
def test_no_write_names_agent_star(world, declared):
    if declared.kind == "read" or "agent" not in _schema_fields(declared):
        pytest.skip("the op writes no agent")
    client, _tokens = world
    body = {**_victim_body(declared), "agent": "*"}
    body.pop("memory_id", None)
    status, text = send(client, declared, body, ADMIN_TOKEN)
    assert status == 422 and '"agent"' in text, (declared.name, text)


# Writes that name a user without writing the user's data, and the erasure itself; a block's
# removal leaves the erasure less to do, never more.
NOT_USER_DATA = {"token.create", "token.revoke", "user.erase", "working_memory.delete"}

@pytest.mark.parametrize("declared", OPS, ids=lambda d: d.name)
def test_every_write_naming_a_user_being_erased_is_409(world, declared):
    fields = _schema_fields(declared)
    # Ops that need no agent (schemas, the org switch) act on a namespace, whoever the body
    # names as user.
    if declared.kind == "read" or declared.name in NOT_USER_DATA or not declared.needs_agent or (
        "user_id" not in fields and "subject" not in fields
    ):
        pytest.skip("the op writes nothing about a user")

    from app.store.agent_state import AgentStateStore

    client, tokens = world
    services = client.application.extensions["loom"]
    body = _victim_body(declared)
    if "subject" in fields:
        body["subject"] = VICTIM["user_id"]
    digest = services.store(AgentStateStore).subject_digest(
        VICTIM["org"], VICTIM["namespace"], VICTIM["user_id"])
    markers = [keys.user_erasing(VICTIM["org"], VICTIM["namespace"], VICTIM["user_id"]),
               keys.agent_state_subject_erasing(VICTIM["org"], VICTIM["namespace"], digest)]
    raw = services.redis  # the data plane, one server or the cluster
    raw.set(markers[1], 1)
    raw.hset(markers[0], "since", 1)
    try:
        status, text = send(client, declared, body, ADMIN_TOKEN)
    finally:
        raw.delete(*markers)
    assert status == 409 and "USER_BEING_ERASED" in text, (declared.name, text)
