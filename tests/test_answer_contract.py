"""With LOOM_VALIDATE_ANSWERS on (the suite's setting), an answer or error body that does not
match the OpenAPI document is never sent as if it were fine: it is a 500 naming the mismatch,
logged, and recorded for the suite to fail on. Off, nothing is checked."""

from __future__ import annotations

import logging

import pytest

from app.errors import HashMismatch
from app.registry import REGISTRY
from app.schemas import contract
from app.store.working_memory import WorkingMemoryStore

WHO = {"namespace": "n", "agent": "a", "block_key": "k"}


@pytest.fixture
def recorded():
    """The mismatches a test provokes on purpose, kept out of the suite-wide check."""
    yield contract.VIOLATIONS
    contract.VIOLATIONS.clear()


def test_an_answer_off_its_schema_is_a_500_naming_the_field(client, monkeypatch, recorded,
                                                             caplog):
    monkeypatch.setattr(WorkingMemoryStore, "delete", lambda self, identity, key: "yes")
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
    monkeypatch.setattr(WorkingMemoryStore, "delete", lambda self, identity, key: "yes")
    client = app_factory(validate_answers=False).test_client()
    answer = client.post("/v1/working_memory.delete", json=WHO)
    assert answer.status_code == 200 and answer.get_json()["deleted"] == "yes"
    assert contract.VIOLATIONS == []
