"""Typed agent state (seed 002) through the Flask app against a real redis-server.

Covers the feature switch, the schema (declared fields, modes, scope kind, value types), cas and
merge_by_key, the check order, the byte cap, PII masking, keyed scope ids (a scan of every key
and value), the console view, retention with an injected clock, the sweep, erasure and export.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from typing import Any

import pytest
import redis

from app.clock import FrozenClock
from app.ops import load_ops
from app.store import keys
from app.store.agent_state import AgentStateStore
from tests.auth_support import ADMIN_TOKEN, auth_app, bearer, mint
from tests.conftest import TEST_SECRET, on_cluster_skip
from tests.support.api import op_helpers
from tests.support.redis_dump import dump_everything

NS = "shop"
call, _ = op_helpers({"namespace": NS})
AGENT = "shop_guide"
CONVERSATION = {"kind": "conversation", "id": "conv-1"}
DAY = 86_400

GUIDE_TYPE: dict[str, Any] = {
    "type": "shop_guide_state",
    "ownership": "agent",
    "fields": {
        "step": {"type": "enum", "values": ["sizes", "offer", "checkout"]},
        "offer": {"type": "string"},
        "cart_note": {"type": "text", "pii": True},
        "basket": {"type": "object"},
        "count": {"type": "integer"},
    },
    "agent_state": {"scope": "conversation", "max_bytes": 16384, "write": "both"},
    "retention": {"state": "30d", "cart_note": "7d"},
}


# --- helpers (the concurrency tests import them) ------------------------------------------------


def guide_type(**changes: Any) -> dict[str, Any]:
    """GUIDE_TYPE with members replaced; ``agent_state`` members are merged into it."""
    declared = copy.deepcopy(GUIDE_TYPE)
    for name, value in changes.items():
        if name == "agent_state":
            declared["agent_state"].update(value)
        else:
            declared[name] = value
    return declared


def enable(client, types=None, headers=None, **features):
    status, out = call(client, "features.set", headers,
                        features={"agent_state": True, **features})
    assert status == 200, out
    types = [GUIDE_TYPE] if types is None else types
    status, out = call(client, "object_types.set", headers, types=types)
    assert status == 200, out


def put(client, body, scope=None, headers=None, **extra):
    payload = {"namespace": NS, "agent": AGENT, "scope": scope or CONVERSATION, "body": body,
               **extra}
    response = client.put("/v1/agent-state", json=payload, headers=headers or {})
    return response.status_code, response.get_json()


def read(client, scope=None, headers=None, **extra):
    payload = {"namespace": NS, "agent": AGENT, "scope": scope or CONVERSATION, **extra}
    response = client.post("/v1/agent-state/read", json=payload, headers=headers or {})
    return response.status_code, response.get_json()


def state_keys(redis_client) -> list[str]:
    return sorted(k for k in redis_client.scan_iter("loom:as:*"))


def stored_hash(redis_client) -> dict[str, str]:
    found = state_keys(redis_client)
    assert len(found) == 1, found
    return redis_client.hgetall(found[0])


def store_of(app) -> AgentStateStore:
    return app.extensions["loom"].store(AgentStateStore)


@pytest.fixture
def on(client):
    enable(client)
    return client


# --- the feature switch and the routes ---------------------------------------------------------


def test_off_until_an_admin_turns_it_on(client, redis_client):
    status, out = put(client, {"step": "sizes"})
    assert (status, out["error"]["code"]) == (403, "FEATURE_DISABLED")
    assert out["error"]["feature"] == "agent_state"
    assert read(client)[1]["error"]["code"] == "FEATURE_DISABLED"
    assert state_keys(redis_client) == []
    enable(client)
    assert put(client, {"step": "sizes"})[1]["stored"] is True
    call(client, "features.set", features={"agent_state": False})
    assert put(client, {"step": "offer"})[0] == 403
    assert read(client)[0] == 403
    # Turning it off keeps what is stored; the console view still shows it (governance).
    assert len(state_keys(redis_client)) == 1


def test_agent_state_is_never_an_mcp_tool_and_never_takes_a_scope_in_its_url():
    ops = {declared.name: declared for declared in load_ops()}
    plane = [declared for name, declared in ops.items() if name.startswith("agent_state.")]
    assert {d.name for d in plane} == {
        "agent_state.put", "agent_state.read", "agent_state.of_profile", "agent_state.erase"
    }
    assert all(not declared.mcp for declared in plane)
    assert ops["agent_state.put"].http_method == "PUT"
    assert ops["agent_state.put"].http_path == "/v1/agent-state"
    assert ops["agent_state.read"].http_path == "/v1/agent-state/read"
    assert ops["agent_state.of_profile"].http_path == "/v1/profiles/<profile_id>/agent-state"
    for declared in plane:
        assert "scope" not in declared.http_path
        assert declared.example, declared.name


def test_a_state_never_written_reads_empty_at_version_zero(on):
    status, out = read(on)
    assert status == 200
    assert out == {"body": {}, "version": 0,
                   "version_text": "0", "updated_at": None, "ignored_args": []}


# --- merge_by_key and cas ----------------------------------------------------------------------


def test_merge_by_key_is_the_default_and_versions_count_stored_writes(on):
    assert put(on, {"step": "sizes", "offer": "familia-plus"})[1] == {
        "stored": True, "version": 1, "version_text": "1", "reason": None, "ignored_args": []
    }
    assert put(on, {"basket": {"a": 1, "b": 2}})[1]["version"] == 2
    # A field is replaced whole: no deeper merge.
    assert put(on, {"basket": {"c": 3}})[1]["version"] == 3
    assert put(on, {"offer": {"$delete": True}})[1]["version"] == 4
    status, out = read(on)
    assert status == 200
    assert out["body"] == {"step": "sizes", "basket": {"c": 3}}
    assert out["version"] == 4
    assert out["updated_at"].endswith("Z")


def test_a_deleted_field_comes_back_only_when_written_again(on):
    put(on, {"step": "sizes", "offer": "x"})
    put(on, {"offer": {"$delete": True}})
    put(on, {"step": "offer"})
    assert "offer" not in read(on)[1]["body"]
    put(on, {"offer": "y"})
    assert read(on)[1]["body"]["offer"] == "y"
    # Deleting a field that is not there is still a stored write.
    assert put(on, {"count": {"$delete": True}})[1] == {
        "stored": True, "version": 5, "version_text": "5", "reason": None, "ignored_args": []
    }


def test_cas_replaces_the_whole_state_at_if_version(on):
    assert put(on, {"step": "sizes", "offer": "x"}, mode="cas", if_version=0)[1]["version"] == 1
    status, out = put(on, {"step": "offer"}, mode="cas", if_version=0)
    assert (status, out["error"]["code"]) == (412, "agent_state_conflict")
    assert out["error"]["version"] == 1
    assert read(on)[1]["body"] == {"step": "sizes", "offer": "x"}
    assert put(on, {"step": "checkout"}, mode="cas", if_version=1)[1]["version"] == 2
    # A field left out of a cas body is gone.
    assert read(on)[1] == {"body": {"step": "checkout"}, "version": 2, "version_text": "2",
                           "updated_at": read(on)[1]["updated_at"], "ignored_args": []}
    status, out = put(on, {"step": "sizes"}, mode="cas", if_version=7)
    assert status == 412 and read(on)[1]["version"] == 2


def test_cas_needs_if_version_and_takes_no_delete_marker(on):
    status, out = put(on, {"step": "sizes"}, mode="cas")
    assert (status, list(out["error"]["fields"])) == (422, ["if_version"])
    status, out = put(on, {"offer": {"$delete": True}}, mode="cas", if_version=0)
    assert (status, list(out["error"]["fields"])) == (422, ["body.offer"])
    assert read(on)[1]["version"] == 0


def test_merge_with_if_version_applies_only_at_that_version(on):
    put(on, {"step": "sizes"})
    status, out = put(on, {"offer": "x"}, if_version=0)
    assert (status, out["error"]["code"]) == (412, "agent_state_conflict")
    assert put(on, {"offer": "x"}, if_version=1)[1]["version"] == 2
    assert read(on)[1]["body"] == {"step": "sizes", "offer": "x"}


def test_a_mode_the_type_does_not_allow_is_refused(client):
    enable(client, types=[guide_type(agent_state={"write": "cas"})])
    status, out = put(client, {"step": "sizes"})
    assert (status, list(out["error"]["fields"])) == (422, ["mode"])
    assert put(client, {"step": "sizes"}, mode="cas", if_version=0)[1]["stored"] is True
    enable(client, types=[guide_type(agent_state={"write": "merge_by_key"})])
    status, out = put(client, {"step": "offer"}, mode="cas", if_version=1)
    assert (status, list(out["error"]["fields"])) == (422, ["mode"])
    assert put(client, {"step": "offer"})[1]["version"] == 2


def test_bad_input_is_a_422_naming_the_field_and_stores_nothing(on, redis_client):
    cases = [
        ({"body": {"step": "sizes"}, "scope": {"kind": "task", "id": "t-1"}}, "scope.kind"),
        ({"body": {"step": "flying"}}, "body.step"),
        ({"body": {"count": "3"}}, "body.count"),
        ({"body": {"step": "sizes"}, "scope": {"kind": "planet", "id": "x"}}, "scope.kind"),
        ({"body": {"step": "sizes"}, "scope": {"kind": "conversation", "id": ""}}, "scope.id"),
        ({"body": {"step": "sizes"}, "scope": "conv-1"}, "scope"),
        ({"body": ["step"]}, "body"),
        ({"body": {"step": "sizes"}, "mode": "append"}, "mode"),
        ({"body": {"step": "sizes"}, "if_version": -1}, "if_version"),
        ({"body": {"step": "sizes"}, "subject": "not an@email@x"}, "subject"),
    ]
    for body, field in cases:
        payload = {"namespace": NS, "agent": AGENT, "scope": CONVERSATION, **body}
        response = on.put("/v1/agent-state", json=payload)
        assert response.status_code == 422, (body, response.get_json())
        assert field in response.get_json()["error"]["fields"], (body, response.get_json())
    response = on.put("/v1/agent-state", data='{"namespace": "shop", "agent": "shop_guide", '
                      '"scope": {"kind": "conversation", "id": "c"}, "body": {"count": 1e400}}',
                      content_type="application/json")
    assert response.status_code == 422
    assert state_keys(redis_client) == []


# --- the schema: declared fields, which type, the check order, the cap --------------------------


def test_an_undeclared_field_refuses_the_whole_write(on):
    put(on, {"step": "sizes"})
    status, out = put(on, {"offer": "x", "colour": "blue"})
    assert status == 200
    assert out == {"stored": False, "version": 1,
                   "version_text": "1", "reason": "not_declared_field",
                   "ignored_args": []}
    assert read(on)[1]["body"] == {"step": "sizes"}
    # A delete marker for an undeclared field is refused the same way.
    assert put(on, {"colour": {"$delete": True}})[1]["reason"] == "not_declared_field"


def test_without_an_agent_owned_type_every_write_is_refused(client):
    customer = {"type": "customer_card", "ownership": "customer",
                "fields": {"step": {"type": "string"}}}
    enable(client, types=[customer])
    for body in ({"step": "sizes"}, {}):
        assert put(client, body)[1]["reason"] == "not_declared_field"
    assert read(client)[1]["version"] == 0


def test_the_type_named_like_the_agent_wins_else_the_only_agent_type(client):
    other = guide_type(type="billing_bot_state", fields={"invoice": {"type": "string"}},
                       retention={"state": "30d"})
    enable(client, types=[GUIDE_TYPE, other])
    assert put(client, {"step": "sizes"})[1]["stored"] is True
    assert put(client, {"invoice": "x"})[1]["reason"] == "not_declared_field"
    payload = {"namespace": NS, "agent": "billing-bot", "scope": CONVERSATION,
               "body": {"invoice": "x"}}
    assert on_put(client, payload)["stored"] is True
    # Two agent types and an agent named like neither: nothing declared.
    payload["agent"] = "stranger"
    assert on_put(client, payload)["reason"] == "not_declared_field"
    # One agent-owned type: it is every agent's schema.
    enable(client, types=[other])
    assert on_put(client, payload)["stored"] is True


def on_put(client, payload):
    response = client.put("/v1/agent-state", json=payload)
    assert response.status_code == 200, response.get_json()
    return response.get_json()


def test_check_order_is_version_then_declared_fields_then_cap(client):
    enable(client, types=[guide_type(agent_state={"max_bytes": 40})])
    put(client, {"step": "sizes"})
    huge = "x" * 100
    # Wrong version and an undeclared field and over the cap: the version speaks first.
    status, out = put(client, {"colour": huge}, if_version=5)
    assert status == 412
    # Right version, undeclared field and over the cap: the declared fields speak.
    assert put(client, {"colour": huge}, if_version=1)[1]["reason"] == "not_declared_field"
    assert put(client, {"offer": huge}, if_version=1)[1]["reason"] == "over_cap"
    assert read(client)[1] == {"body": {"step": "sizes"}, "version": 1, "version_text": "1",
                               "updated_at": read(client)[1]["updated_at"], "ignored_args": []}


def test_the_cap_is_on_the_stored_json_bytes_and_keeps_the_previous_state(client, redis_client):
    enable(client, types=[guide_type(agent_state={"max_bytes": 30})])
    # {"offer":"<n chars>"} is 12 bytes of JSON around the value.
    assert put(client, {"offer": "a" * 18})[1] == {"stored": True, "version": 1,
                        "version_text": "1", "reason": None,
                                                  "ignored_args": []}
    assert int(stored_hash(redis_client)["size"]) == 30
    out = put(client, {"offer": "b" * 19})[1]
    assert out == {"stored": False, "version": 1,
                   "version_text": "1", "reason": "over_cap", "ignored_args": []}
    # Bytes, not characters: 9 two-byte letters are 18 bytes.
    assert put(client, {"offer": "é" * 9})[1]["stored"] is True
    assert put(client, {"offer": "é" * 9 + "e"})[1]["reason"] == "over_cap"
    assert read(client)[1]["body"] == {"offer": "é" * 9}
    # Merged state counts: two fields together can be over where each alone is not.
    enable(client, types=[guide_type(agent_state={"max_bytes": 40})])
    put(client, {"offer": "o" * 12})
    assert put(client, {"step": "checkout"})[1]["reason"] == "over_cap"
    assert put(client, {"offer": {"$delete": True}, "step": "checkout"})[1]["stored"] is True


def test_type_validation_errors_name_the_rule(client):
    status, out = call(client, "object_types.set",
                        types=[guide_type(agent_state={"max_bytes": 65_537})])
    assert status == 422
    assert out["error"]["rule"] == "agent_state_max_bytes_invalid"
    assert list(out["error"]["fields"]) == ["types[0].agent_state.max_bytes"]


# --- PII masking --------------------------------------------------------------------------------


def test_pii_fields_are_masked_at_write_by_the_namespace_rules(client, redis_client):
    types = [guide_type(fields={
        "cart_note": {"type": "text", "pii": True},
        "contacts": {"type": "array", "pii": True},
        "offer": {"type": "string"},
    })]
    enable(client, types=types,
           pii_rules=[{"name": "loyalty", "pattern": "LOY-[0-9]{6}", "mask": "[loyalty]"}])
    note = ("mail sam@example.com or call +33 6 12 34 56 78, card 4111 1111 1111 1111, "
            "order 4111 1111 1111 1112, iban GB82 WEST 1234 5698 7654 32, member LOY-123456")
    put(client, {"cart_note": note, "contacts": [{"mail": "x@y.org"}, "+442079460958"],
                 "offer": "sam@example.com"})
    body = read(client)[1]["body"]
    assert body["cart_note"] == (
        "mail [email] or call [phone], card [card], order 4111 1111 1111 1112, "
        "iban [iban], member [loyalty]"
    )
    assert body["contacts"] == [{"mail": "[email]"}, "[phone]"]
    assert body["offer"] == "sam@example.com"  # not a pii field
    dump = dump_everything(redis_client)
    assert "4111 1111 1111 1111" not in dump and "LOY-123456" not in dump
    # The mask is stable: the same text always masks the same way.
    put(client, {"cart_note": "sam@example.com"})
    put(client, {"cart_note": "other@example.net"})
    assert read(client)[1]["body"]["cart_note"] == "[email]"


# --- scope ids are kept only as keyed digests ----------------------------------------------------

RAW_CONVERSATION = "conv-RAW-7f3a"
RAW_SUBJECT = "Sam.Customer@Example.com"
RAW_TASK = "task-RAW-19bd"
RAW_OBJECT = "order:A-RAW-5521"


def test_no_raw_scope_id_is_stored_anywhere_or_logged(client, redis_client, caplog):
    caplog.set_level(logging.DEBUG)
    task_type = guide_type(type="task_bot_state", agent_state={"scope": "task"})
    object_type = guide_type(type="order_bot_state", agent_state={"scope": "object"})
    subject_type = guide_type(type="profile_bot_state", agent_state={"scope": "subject"})
    enable(client, types=[GUIDE_TYPE, task_type, object_type, subject_type])
    conversation = {"kind": "conversation", "id": RAW_CONVERSATION}
    assert put(client, {"step": "sizes", "cart_note": "hi"}, conversation,
               subject=RAW_SUBJECT)[1]["stored"]
    for agent, scope in (
        ("task-bot", {"kind": "task", "id": RAW_TASK}),
        ("order-bot", {"kind": "object", "id": RAW_OBJECT}),
        ("profile-bot", {"kind": "subject", "id": RAW_SUBJECT}),
    ):
        payload = {"namespace": NS, "agent": agent, "scope": scope, "body": {"step": "offer"}}
        assert on_put(client, payload)["stored"] is True
    assert read(client, conversation)[1]["version"] == 1
    view = client.get(f"/v1/profiles/{RAW_SUBJECT}/agent-state?namespace={NS}").get_json()
    assert view["count"] == 2
    store = store_of(client.application)
    assert len(store.export_subject("default", NS, RAW_SUBJECT)) == 2
    assert store.sweep("default", NS)["states_removed"] == 0
    assert call(client, "agent_state.erase", scope={"kind": "task", "id": RAW_TASK})[1][
        "erased"] == 1
    assert call(client, "audit.list")[1]["count"] == 3

    dump = dump_everything(redis_client)
    assert "loom:as:" in dump and "loom:ns-audit:" in dump  # the scan saw the plane
    raw_ids = (RAW_CONVERSATION, RAW_SUBJECT, RAW_TASK, RAW_OBJECT, "A-RAW-5521",
               f"order:{NS}:A-RAW-5521")
    for raw in raw_ids:
        for form in (raw, raw.lower()):
            assert form not in dump, form
            assert form not in caplog.text, form
    # No answer carries a scope id back either.
    assert RAW_SUBJECT not in json.dumps(view) and RAW_SUBJECT.lower() not in json.dumps(view)


def test_equal_scopes_meet_and_different_ones_do_not(client):
    enable(client, types=[guide_type(agent_state={"scope": "object"})])
    put(client, {"step": "sizes"}, {"kind": "object", "id": "order:A-1"})
    # The seed's three-part form names the same object.
    assert read(client, {"kind": "object", "id": f"order:{NS}:A-1"})[1]["version"] == 1
    assert read(client, {"kind": "object", "id": "order:A-2"})[1]["version"] == 0
    # The same id in another namespace is another state.
    call(client, "features.set", features={"agent_state": True}, namespace="other")
    other = {"namespace": "other", "agent": AGENT, "scope": {"kind": "object", "id": "order:A-1"}}
    assert client.post("/v1/agent-state/read", json=other).get_json()["version"] == 0


# --- the console's view of a profile -------------------------------------------------------------


def test_profile_view_lists_states_naming_the_subject_without_content(client):
    subject_type = guide_type(type="profile_bot_state", agent_state={"scope": "subject"})
    enable(client, types=[GUIDE_TYPE, subject_type])
    put(client, {"step": "sizes", "cart_note": "secret note"}, subject="Sam@Example.com")
    put(client, {"offer": "x"}, subject="Sam@Example.com")
    put(client, {"step": "sizes"}, {"kind": "conversation", "id": "conv-2"})  # no subject
    put(client, {"step": "sizes"}, {"kind": "conversation", "id": "conv-3"},
        subject="someone@else.org")
    payload = {"namespace": NS, "agent": "profile-bot",
               "scope": {"kind": "subject", "id": " sam@example.COM "}, "body": {"offer": "y"}}
    on_put(client, payload)

    response = client.get(f"/v1/profiles/sam@example.com/agent-state?namespace={NS}")
    assert response.status_code == 200
    out = response.get_json()
    assert out["count"] == 2
    by_kind = {state["scope_kind"]: state for state in out["states"]}
    assert set(by_kind) == {"conversation", "subject"}
    conversation = by_kind["conversation"]
    assert set(conversation) == {"scope_kind", "agent", "type", "size_bytes", "version",
                                 "version_text", "created_at", "updated_at"}
    assert conversation["agent"] == AGENT and conversation["type"] == "shop_guide_state"
    assert conversation["version"] == 2
    assert conversation["size_bytes"] == len(
        json.dumps({"cart_note": "secret note", "offer": "x", "step": "sizes"},
                   separators=(",", ":")).encode()
    )
    assert conversation["created_at"] <= conversation["updated_at"]
    assert by_kind["subject"]["agent"] == "profile-bot"
    assert "secret note" not in response.get_data(as_text=True)
    # Newest first.
    assert out["states"][0]["scope_kind"] == "subject"
    # Another spelling of the same handle finds the same states; a stranger finds none.
    assert client.get(f"/v1/profiles/SAM@example.com/agent-state?namespace={NS}").get_json()[
        "count"] == 2
    assert client.get(f"/v1/profiles/nobody/agent-state?namespace={NS}").get_json()[
        "count"] == 0
    # The view works with the feature off: governance sees what is stored.
    call(client, "features.set", features={"agent_state": False})
    assert client.get(f"/v1/profiles/sam@example.com/agent-state?namespace={NS}").get_json()[
        "count"] == 2


def test_a_state_moves_to_the_subject_a_write_names(client):
    enable(client)
    put(client, {"step": "sizes"}, subject="a@example.com")
    put(client, {"step": "offer"})  # no subject: the state keeps naming a@
    assert view_count(client, "a@example.com") == 1
    put(client, {"step": "offer"}, subject="b@example.com")
    assert view_count(client, "a@example.com") == 0
    assert view_count(client, "b@example.com") == 1


def view_count(client, handle):
    return client.get(f"/v1/profiles/{handle}/agent-state?namespace={NS}").get_json()["count"]


def test_a_subject_state_names_its_own_customer_only(client):
    enable(client, types=[guide_type(agent_state={"scope": "subject"})])
    scope = {"kind": "subject", "id": "+33 6 12 34 56 78"}
    status, out = put(client, {"step": "sizes"}, scope, subject="other@example.com")
    assert (status, list(out["error"]["fields"])) == (422, ["subject"])
    assert put(client, {"step": "sizes"}, scope, subject="0033612345678")[1]["stored"] is True
    assert view_count(client, "+33612345678") == 1


# --- auth: the agent_state scope -----------------------------------------------------------------


def test_with_auth_on_a_key_needs_the_agent_state_scope(app_factory):
    client = auth_app(app_factory).test_client()
    enable(client, headers=bearer(ADMIN_TOKEN))
    plain = mint(client, namespace=NS, role="writer", agent=AGENT)
    scoped = mint(client, namespace=NS, role="writer", agent=AGENT, scopes=["agent_state"])
    viewer = mint(client, namespace=NS, role="viewer")
    scoped_viewer = mint(client, namespace=NS, role="viewer", scopes=["agent_state"])

    status, out = put(client, {"step": "sizes"}, headers=bearer(plain))
    assert (status, out["error"]["code"]) == (403, "AUTH_INSUFFICIENT")
    assert read(client, headers=bearer(plain))[1]["error"]["code"] == "AUTH_INSUFFICIENT"
    assert put(client, {"step": "sizes"}, headers=bearer(scoped))[1]["stored"] is True
    assert read(client, headers=bearer(scoped))[1]["version"] == 1
    # Reading content needs the writer role: the console's viewers see sizes, never content.
    assert read(client, headers=bearer(scoped_viewer))[0] == 403
    url = "/v1/profiles/cust-1/agent-state"
    assert client.get(url, headers=bearer(viewer)).status_code == 403
    response = client.get(url, headers=bearer(scoped_viewer))
    assert response.status_code == 200, response.get_json()
    # The admin role carries every scope; features.set is admin-only.
    assert put(client, {"step": "offer"}, headers=bearer(ADMIN_TOKEN))[1]["stored"] is True
    assert call(client, "features.set", bearer(scoped), features={})[0] == 403


# --- retention, with an injected clock -----------------------------------------------------------


@pytest.fixture
def frozen(app_factory):
    clock = FrozenClock()
    app = app_factory(clock=clock)
    client = app.test_client()
    enable(client)
    return app, client, clock


def test_a_state_is_kept_retention_days_after_its_last_write(frozen, redis_client):
    _app, client, clock = frozen
    put(client, {"step": "sizes"})
    clock.advance(20 * DAY)
    put(client, {"offer": "x"})  # the last write restarts the state's clock
    clock.advance(29 * DAY)
    assert read(client)[1]["version"] == 2
    # Redis is told too: the key expires at the last write + 30 days.
    key = state_keys(redis_client)[0]
    expires_ms = int(redis_client.hget(key, "expires_at"))
    assert expires_ms == (clock.now_ns() - 29 * DAY * 10**9) // 10**6 + 30 * DAY * 1000
    assert redis_client.pexpiretime(key) == expires_ms  # PEXPIREAT at that very instant
    clock.advance(DAY)
    assert read(client)[1] == {"body": {}, "version": 0,
                               "version_text": "0", "updated_at": None, "ignored_args": []}
    # A write after expiry starts a new state at version 1; cas at 0 works.
    assert put(client, {"step": "offer"}, mode="cas", if_version=0)[1]["version"] == 1
    assert read(client)[1]["body"] == {"step": "offer"}


def test_a_field_is_kept_its_own_days_after_its_own_last_write(frozen, redis_client):
    _app, client, clock = frozen
    put(client, {"step": "sizes", "cart_note": "wrap it"})
    clock.advance(5 * DAY)
    put(client, {"step": "offer"})  # another field's write does not renew cart_note
    clock.advance(2 * DAY)
    out = read(client)[1]
    assert out["body"] == {"step": "offer"} and out["version"] == 2
    assert "wrap it" in stored_hash(redis_client)["body"]  # still stored until the next write
    # The expired field leaves the stored state at the next write.
    put(client, {"offer": "x"})
    raw = stored_hash(redis_client)
    assert "wrap it" not in raw["body"] and "cart_note" not in json.loads(raw["written"])
    # A field written again has a new clock.
    put(client, {"cart_note": "again"})
    clock.advance(6 * DAY)
    assert read(client)[1]["body"]["cart_note"] == "again"
    clock.advance(DAY)
    assert "cart_note" not in read(client)[1]["body"]


def test_an_expired_field_does_not_count_towards_the_cap(app_factory):
    clock = FrozenClock()
    client = app_factory(clock=clock).test_client()
    enable(client, types=[guide_type(agent_state={"max_bytes": 40})])
    put(client, {"cart_note": "n" * 20})
    assert put(client, {"offer": "o" * 20})[1]["reason"] == "over_cap"
    clock.advance(8 * DAY)
    assert put(client, {"offer": "o" * 20})[1]["stored"] is True


def test_the_sweep_removes_expired_fields_states_and_index_entries(frozen, redis_client):
    app, client, clock = frozen
    store = store_of(app)
    put(client, {"step": "sizes", "cart_note": "wrap it"}, subject="sam@example.com")
    put(client, {"step": "sizes"}, {"kind": "conversation", "id": "conv-2"})
    assert store.sweep("default", NS) == {
        "states_removed": 0, "fields_removed": 0, "index_entries_removed": 0
    }
    clock.advance(8 * DAY)
    counts = store.sweep("default", NS)
    assert counts["fields_removed"] == 1 and counts["states_removed"] == 0
    for key in state_keys(redis_client):
        assert "wrap it" not in redis_client.hget(key, "body")
    assert read(client)[1]["version"] == 1  # the sweep is not a write: same version
    assert store.sweep("default", NS)["fields_removed"] == 0  # idempotent
    clock.advance(30 * DAY)
    counts = store.sweep("default", NS)
    assert counts["states_removed"] == 2
    assert counts["index_entries_removed"] >= 3  # two expiry entries, the subject's entry
    leftover = [k for k in redis_client.scan_iter("loom:as*") if k != keys.agent_state_namespaces()]
    assert leftover == []


def test_the_sweep_job_sweeps_every_namespace(app_factory, redis_url, redis_client, monkeypatch,
                                              tmp_path):
    from jobs import agent_state_sweep
    from jobs.scheduler import Periodic

    # States written ten days ago by the real clock's reckoning; the job runs on the real clock.
    clock = FrozenClock(start=time.time() - 10 * DAY)
    client = app_factory(clock=clock).test_client()
    enable(client, types=[guide_type(retention={"state": "60d", "cart_note": "7d"})])
    put(client, {"step": "sizes", "cart_note": "wrap it"})
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("LOOM_SECRET_KEY", TEST_SECRET)
    monkeypatch.setenv("LOOM_DATA_DIR", str(tmp_path))
    totals = agent_state_sweep.sweep()
    assert totals["namespaces"] == 1 and totals["fields_removed"] == 1
    assert "wrap it" not in stored_hash(redis_client)["body"]
    assert agent_state_sweep.sweep("default", NS)["fields_removed"] == 0

    from app.settings import load_settings

    entry = agent_state_sweep.periodic(load_settings())
    assert isinstance(entry, Periodic)
    assert entry.func == "jobs.agent_state_sweep.sweep" and entry.interval_seconds == 3600


# --- erasure and the data package ----------------------------------------------------------------


def test_erase_op_erases_a_scope_for_every_agent_and_is_audited(client, redis_client):
    other = guide_type(type="billing_bot_state")
    enable(client, types=[GUIDE_TYPE, other])
    put(client, {"step": "sizes"}, subject="sam@example.com")
    on_put(client, {"namespace": NS, "agent": "billing-bot", "scope": CONVERSATION,
                    "body": {"offer": "x"}})
    put(client, {"step": "sizes"}, {"kind": "conversation", "id": "conv-2"})
    status, out = call(client, "agent_state.erase", scope=CONVERSATION)
    assert (status, out["erased"]) == (200, 2)
    assert read(client)[1]["version"] == 0
    assert read(client, {"kind": "conversation", "id": "conv-2"})[1]["version"] == 1
    assert view_count(client, "sam@example.com") == 0
    assert call(client, "agent_state.erase", scope=CONVERSATION)[1]["erased"] == 0
    entry = call(client, "audit.list", limit=1)[1]["entries"][0]
    assert entry["action"] == "agent_state.erase" and entry["scope_kind"] == "conversation"
    assert entry["erased"] == 0 and entry["actor"] == "single-user"
    # Only the other conversation's keys remain.
    assert len(state_keys(redis_client)) == 1


@on_cluster_skip  # on a cluster the audit list is in another slot: the entry is its own step
@pytest.mark.parametrize("headers", [{}, {"Idempotency-Key": "erase-cut"}])
def test_an_erase_cut_right_after_its_script_still_leaves_its_audit_entry(client, monkeypatch,
                                                                          headers):
    enable(client)
    put(client, {"step": "sizes"})
    store = store_of(client.application)

    def cut(*_args, **_kwargs):
        # The erasing script ran; the connection resets (or the worker dies) before the next
        # step, the index entries' cleanup.
        raise redis.ConnectionError("connection reset after the script ran")

    monkeypatch.setattr(store, "_unindex_entries", cut)
    status, _out = call(client, "agent_state.erase", headers, scope=CONVERSATION)
    assert status >= 500
    monkeypatch.undo()
    assert read(client)[1]["version"] == 0
    # The states and their entry went in the same step: the cut could not part them.
    entries = call(client, "audit.list")[1]["entries"]
    erasures = [(e["scope_kind"], e["erased"]) for e in entries
                if e["action"] == "agent_state.erase"]
    assert erasures == [("conversation", 1)]
    if headers:
        # The retry gets the kept count and audits nothing twice.
        status, retried = call(client, "agent_state.erase", headers, scope=CONVERSATION)
        assert (status, retried["erased"]) == (200, 1)
        assert len(call(client, "audit.list")[1]["entries"]) == len(entries)


def test_erase_needs_the_admin_role(app_factory):
    client = auth_app(app_factory).test_client()
    writer = mint(client, namespace=NS, role="writer", scopes=["agent_state"])
    status, out = call(client, "agent_state.erase", bearer(writer), scope=CONVERSATION)
    assert (status, out["error"]["code"]) == (403, "AUTH_INSUFFICIENT")


def test_erase_and_export_a_subject(client, redis_client):
    subject_type = guide_type(type="profile_bot_state", agent_state={"scope": "subject"})
    enable(client, types=[GUIDE_TYPE, subject_type])
    put(client, {"step": "sizes", "cart_note": "call +33 6 12 34 56 78"},
        subject="sam@example.com")
    on_put(client, {"namespace": NS, "agent": "profile-bot",
                    "scope": {"kind": "subject", "id": "Sam@Example.com"},
                    "body": {"offer": "gold"}})
    put(client, {"step": "offer"}, {"kind": "conversation", "id": "conv-2"},
        subject="kim@example.com")
    store = store_of(client.application)

    package = store.export_subject("default", NS, "SAM@example.com")
    assert len(package) == 2
    by_agent = {state["agent"]: state for state in package}
    fields = by_agent[AGENT]["fields"]
    assert fields["cart_note"]["value"] == "call [phone]"
    assert fields["cart_note"]["pii"] is True and fields["cart_note"]["type"] == "text"
    assert fields["step"] == {**fields["step"], "value": "sizes", "declared": True,
                              "type": "enum"}
    assert by_agent["profile-bot"]["scope_kind"] == "subject"
    assert by_agent["profile-bot"]["fields"]["offer"]["value"] == "gold"

    assert store.erase_subject("default", NS, "sam@example.com") == 2
    assert store.export_subject("default", NS, "sam@example.com") == []
    assert read(client)[1]["version"] == 0
    assert view_count(client, "kim@example.com") == 1
    dump = dump_everything(redis_client)
    digest = store.subject_digest("default", NS, "sam@example.com")
    assert digest not in dump  # no index, key or member names the erased subject any more
    assert store.erase_subject("default", NS, "sam@example.com") == 0


def test_a_merge_racing_an_erasure_never_brings_erased_fields_back(client):
    enable(client)
    put(client, {"step": "sizes", "offer": "x"})
    store = store_of(client.application)
    real_store = store._store
    erased = []

    def erase_then_store(*args, **kwargs):
        # The erasure lands between this writer's read and its write.
        if not erased:
            erased.append(store.erase_scope("default", NS, "conversation", "conv-1"))
        return real_store(*args, **kwargs)

    store._store = erase_then_store
    try:
        assert put(client, {"count": 3})[1] == {"stored": True, "version": 1,
                            "version_text": "1", "reason": None,
                                               "ignored_args": []}
    finally:
        store._store = real_store
    assert erased == [1]
    assert read(client)[1]["body"] == {"count": 3}
