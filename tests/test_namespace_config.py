"""features.* / object_types.* / audit.list: the namespace's governance documents and their log."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import pytest

from app.clock import FrozenClock
from app.object_types import validate_object_types
from app.store.namespace_config import (
    AuditLog,
    NamespaceConfigStore,
    canonical_json,
    validate_features,
)
from tests.auth_support import ADMIN_TOKEN, auth_app, bearer, mint
from tests.support.api import op_helpers
from tests.test_agent_state import GUIDE_TYPE, NS, guide_type

call, _ = op_helpers({"namespace": NS})


def sha(document) -> str:
    text = json.dumps(document, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


# --- features ------------------------------------------------------------------------------------


def test_features_default_off_until_set(client):
    status, out = call(client, "features.get")
    assert status == 200
    assert out == {"features": {"agent_state": False, "pii_rules": []}, "sha256": None,
                   "updated_at": None, "ignored_args": []}


def test_features_set_replaces_the_document_normalized(client):
    rules = [{"name": "loyalty", "pattern": "LOY-[0-9]{6}"}]
    status, out = call(client, "features.set", features={"agent_state": True, "pii_rules": rules})
    assert status == 200, out
    normalized = {"agent_state": True,
                  "pii_rules": [{"name": "loyalty", "pattern": "LOY-[0-9]{6}",
                                 "mask": "[loyalty]"}]}
    assert out["features"] == normalized and out["sha256"] == sha(normalized)
    got = call(client, "features.get")[1]
    assert got["features"] == normalized and got["sha256"] == out["sha256"]
    assert got["updated_at"] == out["updated_at"]
    # The whole document is replaced: a key left out takes its default.
    call(client, "features.set", features={"pii_rules": rules})
    assert call(client, "features.get")[1]["features"]["agent_state"] is False


@pytest.mark.parametrize(
    ("features", "rule", "field"),
    [
        ([], "features_not_object", "features"),
        ({"agent_sate": True}, "features_unknown_key", "features.agent_sate"),
        ({"agent_state": "yes"}, "features_agent_state_invalid", "features.agent_state"),
        ({"pii_rules": [{"name": "x", "pattern": "("}]}, "pii_rule_pattern_invalid",
         "features.pii_rules[0].pattern"),
        ({"pii_rules": [{"name": "email", "pattern": "a"}]}, "pii_rule_name_reserved",
         "features.pii_rules[0].name"),
        ({"pii_rules": [{"name": "r", "pattern": r"(a)\1"}]}, "pii_rule_pattern_unsafe",
         "features.pii_rules[0].pattern"),
    ],
)
def test_an_invalid_features_document_is_a_422_naming_the_rule(client, features, rule, field):
    call(client, "features.set", features={"agent_state": True})
    status, out = call(client, "features.set", features=features)
    assert status == 422
    assert (out["error"]["code"], out["error"]["rule"], list(out["error"]["fields"])) == (
        "SCHEMA_INVALID", rule, [field])
    # Nothing changed and nothing was audited.
    assert call(client, "features.get")[1]["features"]["agent_state"] is True
    assert call(client, "audit.list")[1]["count"] == 1


def test_features_set_needs_the_document(client):
    status, out = call(client, "features.set")
    assert (status, list(out["error"]["fields"])) == (422, ["features"])


# --- object types --------------------------------------------------------------------------------


def test_object_types_set_replaces_the_registry_normalized(client):
    assert call(client, "object_types.get")[1] == {
        "types": [], "count": 0, "sha256": None, "updated_at": None, "ignored_args": []}
    minimal = {"type": "task_bot_state", "ownership": "agent",
               "fields": {"step": {"type": "string"}}, "agent_state": {"scope": "task"}}
    status, out = call(client, "object_types.set", types=[GUIDE_TYPE, minimal])
    assert status == 200, out
    assert out["count"] == 2
    filled = out["types"][1]
    assert filled["agent_state"] == {"scope": "task", "max_bytes": 16384, "write": "both",
                                     "over_cap": "keep_previous"}
    assert filled["retention"] == {"state": "30d"}
    assert filled["fields"]["step"] == {"type": "string", "pii": False, "sensitivity": "normal"}
    got = call(client, "object_types.get")[1]
    assert got["types"] == out["types"] and got["sha256"] == out["sha256"] == sha(out["types"])
    # Replaced whole.
    call(client, "object_types.set", types=[minimal])
    assert [t["type"] for t in call(client, "object_types.get")[1]["types"]] == [
        "task_bot_state"]


@pytest.mark.parametrize(
    ("types", "rule", "field"),
    [
        ({"type": "x"}, "types_not_list", "types"),
        ([guide_type(agent_state={"max_bytes": 70_000})], "agent_state_max_bytes_invalid",
         "types[0].agent_state.max_bytes"),
        ([guide_type(agent_state={"write": "sometimes"})], "agent_state_write_invalid",
         "types[0].agent_state.write"),
        ([guide_type(agent_state={"over_cap": "drop"})], "agent_state_over_cap_invalid",
         "types[0].agent_state.over_cap"),
        ([guide_type(agent_state={"scope": "planet"})], "agent_state_scope_invalid",
         "types[0].agent_state.scope"),
        ([guide_type(retention={"state": "181d"})], "retention_state_invalid",
         "types[0].retention.state"),
        ([guide_type(retention={"state": "10d", "cart_note": "20d"})],
         "retention_field_exceeds_state", "types[0].retention.cart_note"),
        ([guide_type(fields={"n": {"type": "date"}}, retention={})], "field_type_invalid",
         "types[0].fields.n.type"),
        ([GUIDE_TYPE, GUIDE_TYPE], "type_name_duplicate", "types[1].type"),
    ],
)
def test_an_invalid_registry_is_a_422_naming_the_rule(client, types, rule, field):
    status, out = call(client, "object_types.set", types=types)
    assert status == 422, out
    assert (out["error"]["rule"], list(out["error"]["fields"])) == (rule, [field])
    assert call(client, "object_types.get")[1]["count"] == 0
    assert call(client, "audit.list")[1]["count"] == 0


def test_stored_documents_read_back_as_the_validated_ones(client, app):
    call(client, "features.set", features={
        "agent_state": True, "pii_rules": [{"name": "r", "pattern": "R[0-9]+", "mask": "#"}]})
    call(client, "object_types.set", types=[GUIDE_TYPE])
    config = app.extensions["loom"].store(NamespaceConfigStore).get("default", NS)
    assert config.features.agent_state is True
    assert config.features.pii_rules[0].regex.pattern == "R[0-9]+"
    assert config.types == validate_object_types([GUIDE_TYPE])
    assert config.type_named("shop_guide_state").retention_for("cart_note") == 7
    assert validate_features(config.features_doc) == config.features


# --- the audit log -------------------------------------------------------------------------------


def test_changes_are_audited_newest_first_with_a_sha_chain(client):
    first = call(client, "features.set", features={"agent_state": True})[1]
    second = call(client, "features.set", features={"agent_state": False})[1]
    types = call(client, "object_types.set", types=[GUIDE_TYPE])[1]
    status, out = call(client, "audit.list")
    assert status == 200 and out["count"] == 3
    newest, middle, oldest = out["entries"]
    assert newest["action"] == "object_types.set" and newest["types"] == ["shop_guide_state"]
    assert (newest["old_sha256"], newest["new_sha256"]) == (None, types["sha256"])
    assert middle["action"] == "features.set"
    assert (middle["old_sha256"], middle["new_sha256"]) == (first["sha256"], second["sha256"])
    assert (oldest["old_sha256"], oldest["new_sha256"]) == (None, first["sha256"])
    assert all(entry["actor"] == "single-user" for entry in out["entries"])
    assert newest["at"] >= middle["at"] >= oldest["at"]
    assert call(client, "audit.list", limit=1)[1]["entries"] == [newest]


@pytest.mark.parametrize("limit", [0, 201, "5", True])
def test_audit_limit_is_1_to_200(client, limit):
    status, out = call(client, "audit.list", limit=limit)
    assert (status, list(out["error"]["fields"])) == (422, ["limit"])


def test_the_audit_log_is_capped_and_per_namespace(app, client):
    log = app.extensions["loom"].store(AuditLog)
    for i in range(1005):
        log.record("default", NS, "job", "profile_schema.set", n=i)
    entries = log.entries("default", NS, 200)
    assert len(entries) == 200 and entries[0]["n"] == 1004
    assert call(client, "audit.list", limit=200)[1]["entries"][0]["n"] == 1004
    assert log.entries("default", "other") == []
    assert len(log.redis.lrange("loom:ns-audit:{default/shop}", 0, -1)) == 1000


def test_audit_record_folds_into_a_callers_transaction(app, redis_client):
    log = app.extensions["loom"].store(AuditLog)
    with redis_client.pipeline(transaction=True) as pipe:
        pipe.set("loom:probe:{default/shop}", "1")
        entry = log.record("default", NS, "tok-1", "profile_schema.clear", pipeline=pipe,
                           old_sha256="a", new_sha256=None)
        assert log.entries("default", NS) == []  # nothing until the caller executes
        pipe.execute()
    assert log.entries("default", NS) == [json.loads(canonical_json(entry))]


def test_with_auth_on_only_admins_set_and_the_actor_is_the_token(app_factory):
    client = auth_app(app_factory).test_client()
    writer = mint(client, namespace=NS, role="writer", scopes=["agent_state"])
    viewer = mint(client, namespace=NS, role="viewer", scopes=["agent_state"])
    ns_admin = mint(client, namespace=NS, role="admin")
    # The spec's "security role" is admin: no other token turns agent_state on.
    for token in (writer, viewer):
        for op in ("features.set", "features.get", "object_types.set", "object_types.get",
                   "audit.list"):
            status, out = call(client, op, bearer(token), features={"agent_state": True},
                                types=[])
            assert (status, out["error"]["code"]) == (403, "AUTH_INSUFFICIENT"), op
    token_id = ns_admin.split("_")[1]
    assert call(client, "features.set", bearer(ns_admin), features={"agent_state": True})[0] \
        == 200
    call(client, "features.set", bearer(ADMIN_TOKEN), features={"agent_state": False})
    actors = [e["actor"] for e in call(client, "audit.list", bearer(ADMIN_TOKEN))[1]["entries"]]
    assert actors == ["install-admin", token_id]


def test_namespace_ops_are_not_mcp_tools_and_need_no_agent():
    from app.ops import load_ops

    for declared in load_ops():
        if declared.plane in ("features", "object_types", "audit"):
            assert (declared.role, declared.mcp, declared.needs_agent) == ("admin", False, False)
            assert declared.example


def test_an_entry_cut_for_a_script_is_the_entry_once_its_values_are_put_in() -> None:
    # The actor's text holds what the cut looks for: only the key itself is cut at.
    audit = AuditLog(SimpleNamespace(redis=None, clock=FrozenClock()))  # type: ignore[arg-type]
    actor = 'tok "old_calls":0 "erased":0'
    head, middle, tail = audit.parts(actor, "budget.set", ("old_calls", "old_tokens"),
                                     scope="namespace", new_calls=None, new_tokens=7)
    entry = json.loads(head + "12" + middle + "null" + tail)
    assert entry == {**entry, "actor": actor, "action": "budget.set", "old_calls": 12,
                     "old_tokens": None, "new_calls": None, "new_tokens": 7}
    assert set(entry) == {"at", "at_ns", "actor", "action", "scope", "old_calls", "old_tokens",
                          "new_calls", "new_tokens"}
    with pytest.raises(ValueError, match="order"):
        audit.parts(actor, "budget.set", ("old_tokens", "old_calls"))
