"""With LOOM_VALIDATE_ANSWERS on (the suite's setting), an answer or error body that does not
match the OpenAPI document is never sent as if it were fine: it is a 500 naming the mismatch,
logged, and recorded for the suite to fail on. Off, nothing is checked."""

from __future__ import annotations

import logging

import pytest
from marshmallow import fields as ma_fields

from app.errors import HashMismatch
from app.ops import working_memory as working_memory_ops
from app.registry import REGISTRY
from app.schemas import contract
from app.schemas.common import is_version_field
from app.store.working_memory import WorkingMemoryStore

WHO = {"namespace": "n", "agent": "a", "block_key": "k"}


@pytest.fixture
def recorded():
    """The mismatches a test provokes on purpose, kept out of the suite-wide check."""
    yield contract.VIOLATIONS
    contract.VIOLATIONS.clear()


def test_an_answer_off_its_schema_is_a_500_naming_the_field(client, monkeypatch, recorded,
                                                             caplog):
    monkeypatch.setattr(working_memory_ops, "_deleted",
                        lambda block_key, reply: {"deleted": "yes", "block_key": block_key})
    with caplog.at_level(logging.ERROR, logger="loom.contract"):
        answer = client.post("/v1/working_memory.delete", json=WHO)
    assert answer.status_code == 500
    error = answer.get_json()["error"]
    assert error["code"] == "ANSWER_CONTRACT_VIOLATION"
    assert "deleted" in error["message"] and "boolean" in error["message"]
    assert recorded and "working_memory.delete 200" in recorded[0]
    assert "answer contract violation" in caplog.text


def test_an_answer_with_a_field_the_document_does_not_declare_is_refused(client, recorded):
    declared = REGISTRY.get("working_memory.delete")
    original = declared.handler

    def with_extra(call):
        return {"deleted": False, "block_key": "k", "internal_key": "loom:wm:k"}

    object.__setattr__(declared, "handler", with_extra)  # Op is frozen; restored below
    try:
        answer = client.post("/v1/working_memory.delete", json=WHO)
    finally:
        object.__setattr__(declared, "handler", original)
    assert answer.status_code == 500
    assert "internal_key" in answer.get_json()["error"]["message"]
    assert recorded


def test_an_error_status_the_op_does_not_document_is_refused(client, monkeypatch, recorded):
    def conflict(self, identity, key):
        raise HashMismatch("a read never answers 409")

    monkeypatch.setattr(WorkingMemoryStore, "get", conflict)
    answer = client.post("/v1/working_memory.get", json=WHO)
    assert answer.status_code == 500
    assert answer.get_json()["error"]["code"] == "ANSWER_CONTRACT_VIOLATION"
    assert "409" in recorded[0] and "does not list" in recorded[0]


def test_documented_errors_pass_untouched(client):
    answer = client.post("/v1/working_memory.replace", json={**WHO, "old": "x"})
    assert answer.status_code == 404
    assert answer.get_json()["error"]["code"] == "WORKING_MEMORY_BLOCK_NOT_FOUND"
    assert contract.VIOLATIONS == []


def test_with_the_setting_off_answers_are_not_checked(app_factory, monkeypatch):
    monkeypatch.setattr(working_memory_ops, "_deleted",
                        lambda block_key, reply: {"deleted": "yes", "block_key": block_key})
    client = app_factory(validate_answers=False).test_client()
    answer = client.post("/v1/working_memory.delete", json=WHO)
    assert answer.status_code == 200 and answer.get_json()["deleted"] == "yes"
    assert contract.VIOLATIONS == []


def _version_fields_without_text(schema, path):
    """Integer version fields of ``schema`` (and the schemas it nests) with no string
    ``<name>_text`` declared beside them."""
    instance = schema() if isinstance(schema, type) else schema
    declared = {field.data_key or name: field for name, field in instance.fields.items()}
    missing = []
    for key, field in declared.items():
        inner = field.inner if isinstance(field, ma_fields.List) else field
        if isinstance(inner, ma_fields.Nested):
            missing += _version_fields_without_text(inner.schema, f"{path}.{key}")
        if is_version_field(key) and isinstance(inner, ma_fields.Integer):
            text = declared.get(f"{key}_text")
            if not isinstance(text, ma_fields.String):
                missing.append(f"{path}.{key}")
    return missing


def test_every_version_an_answer_declares_has_its_text_beside_it():
    """A new op's answer with a ``version`` or ``*_version`` integer declares
    ``<name>_text = VersionText()`` beside it; this walks every op's answer."""
    missing = [found for declared in REGISTRY
               for found in _version_fields_without_text(declared.answer, declared.name)]
    assert missing == []
    # The walk does see versions: the planes that answer them are all in it.
    seen = {declared.name for declared in REGISTRY if "version" in declared.answer().fields}
    assert {"agent_state.put", "agent_state.read", "memory.set", "profile.set",
            "working_memory.set", "profile.structured"} <= seen


def test_an_answer_with_a_version_but_not_its_text_is_refused(client, recorded):
    declared = REGISTRY.get("working_memory.set")
    original = declared.handler

    def without_text(call):
        answer = original(call)
        answer.pop("version_text")
        return answer

    object.__setattr__(declared, "handler", without_text)  # Op is frozen; restored below
    try:
        answer = client.post("/v1/working_memory.set", json={**WHO, "content": "x"})
    finally:
        object.__setattr__(declared, "handler", original)
    assert answer.status_code == 500
    assert "version_text" in answer.get_json()["error"]["message"]
    assert recorded


def test_agent_state_answers_carry_version_text(client):
    who = {"namespace": "vt-shop", "agent": "guide",
           "scope": {"kind": "conversation", "id": "c-1"}}
    client.post("/v1/features.set", json={"namespace": "vt-shop",
                                          "features": {"agent_state": True}})
    client.post("/v1/object_types.set", json={"namespace": "vt-shop", "types": [{
        "type": "guide_state", "ownership": "agent", "fields": {"step": {"type": "string"}},
        "agent_state": {"scope": "conversation", "max_bytes": 1024, "write": "both"}}]})
    written = client.put("/v1/agent-state", json={**who, "body": {"step": "a"}}).get_json()
    assert (written["version"], written["version_text"]) == (1, "1")
    read = client.post("/v1/agent-state/read", json=who).get_json()
    assert (read["version"], read["version_text"]) == (1, "1")
    conflict = client.put("/v1/agent-state", json={**who, "mode": "cas", "if_version": 5,
                                                    "body": {"step": "b"}})
    assert conflict.status_code == 412
    error = conflict.get_json()["error"]
    assert (error["version_text"], error["if_version_text"]) == ("1", "5")
    assert contract.VIOLATIONS == []
