"""Every keyed write keeps its answer in the same step as its write (app/idempotency.py).

Each write op, called with an ``Idempotency-Key``, leaves a record holding the reply its own
write step kept (``reply``) and no answer stored by a separate step (``answer``); a repeat gets
the first answer back and applies nothing. The record lives under the hash tag of the subject
the write touches: run with LOOM_TEST_CLUSTER=1, a record in another slot than the write's keys
would be refused CROSSSLOT by the write's own script or MULTI. Records keep no text of a row
and no usable token secret (a scan of every key and value), and no write op is left to answer
IDEMPOTENCY_OUTCOME_UNKNOWN.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.ops import load_ops
from tests.auth_support import ADMIN_TOKEN, auth_app, bearer
from tests.support.redis_dump import dump_everything

NS = "support"
WHO = {"namespace": NS, "agent": "chat", "user_id": "u-in-step"}
BLOCK = {**WHO, "block_key": "log"}
SCHEMA = {"type": "object", "properties": {
    "timezone": {"type": "string", "description": "IANA zone"}}}
CHAT_STATE = {
    "type": "chat_state", "ownership": "agent", "fields": {"step": {"type": "string"}},
    "agent_state": {"scope": "conversation", "max_bytes": 4096, "write": "both"},
}
CONVERSATION = {"kind": "conversation", "id": "conv-in-step"}


def test_every_write_op_settles_in_its_own_step_or_reruns():
    """No write op answers IDEMPOTENCY_OUTCOME_UNKNOWN: each keeps its answer in its write's
    step (``replay``) or is declared safe to run again (``reruns``)."""
    ops = load_ops()
    left = [declared.name for declared in ops
            if declared.kind != "read" and declared.replay is None and not declared.reruns]
    assert left == []
    assert [declared.name for declared in ops if declared.reruns] == ["user.erase"]


def _send(client, method: str, op_name: str, body: dict[str, Any], key: str | None,
          headers: dict[str, str]) -> Any:
    sent = dict(headers)
    if key is not None:
        sent["Idempotency-Key"] = key
    path = "/v1/agent-state" if op_name == "agent_state.put" else f"/v1/{op_name}"
    return client.open(path, method=method, json=body, headers=sent)


# (op, HTTP method, body): run in this order, each once with a key.
KEYED_WRITES: list[tuple[str, str, dict[str, Any]]] = [
    ("working_memory.set", "POST", {**BLOCK, "content": "first"}),
    ("working_memory.append", "POST", {**BLOCK, "addition": "second"}),
    ("working_memory.replace", "POST", {**BLOCK, "old": "first", "new": "1st"}),
    ("working_memory.delete", "POST", BLOCK),
    ("profile.set", "POST", {**WHO, "label": "persona", "value": "Terse."}),
    ("profile.append", "POST", {**WHO, "label": "persona", "addition": "Cites tickets."}),
    ("profile.replace", "POST", {**WHO, "label": "persona", "old": "Terse", "new": "Brief"}),
    ("memory.set", "POST", {**WHO, "key": "currency", "value": "EUR", "memory_type": "preference"}),
    ("memory.reinforce", "POST", {**WHO, "key": "currency"}),
    ("memory.lock", "POST", {**WHO, "key": "currency"}),
    ("memory.unlock", "POST", {**WHO, "key": "currency"}),
    ("memory.redact", "POST", {**WHO, "key": "currency"}),
    ("features.set", "POST", {"namespace": NS, "features": {"agent_state": True}}),
    ("object_types.set", "POST", {"namespace": NS, "types": [CHAT_STATE]}),
    ("agent_state.put", "PUT", {"namespace": NS, "agent": "chat", "scope": CONVERSATION,
                                "mode": "merge_by_key", "body": {"step": "sizes"}}),
    ("agent_state.erase", "POST", {"namespace": NS, "scope": CONVERSATION}),
    ("profile_schema.set", "POST", {"namespace": NS, "json_schema": SCHEMA}),
    ("profile_schema.clear", "POST", {"namespace": NS}),
    ("budget.set", "POST", {"namespace": NS, "calls": 20, "tokens": 1000}),
    ("org.set_model_calls", "POST", {"enabled": False}),
    ("structured.blacklist", "POST", {**WHO, "blacklisted": True}),
    ("token.create", "POST", {"namespace": NS, "role": "viewer", "label": "in step"}),
]


@pytest.fixture
def admin_client(app_factory):
    return auth_app(app_factory).test_client()


def test_each_keyed_write_keeps_its_answer_in_its_write_step(admin_client, redis_client):
    headers = bearer(ADMIN_TOKEN)
    for n, (op_name, method, body) in enumerate(KEYED_WRITES):
        key = f"in-step-{n}"
        first = _send(admin_client, method, op_name, body, key, headers)
        assert first.status_code == 200, (op_name, first.get_json())
        [record] = [k for k in redis_client.scan_iter(f"loom:idem:*:{op_name}:{key}")]
        kept = redis_client.hgetall(record)
        # The write's own step kept its reply; no separate step stored an answer.
        assert kept["state"] == "done" and "reply" in kept and "answer" not in kept, op_name
        again = _send(admin_client, method, op_name, body, key, headers)
        assert (again.status_code, again.get_json()) == (200, first.get_json()), op_name


def test_a_repeated_revoke_answers_alike_and_revokes_once(admin_client, redis_client):
    headers = bearer(ADMIN_TOKEN)
    created = _send(admin_client, "POST", "token.create",
                    {"namespace": NS, "role": "viewer", "label": "to revoke"}, None, headers)
    token_id = created.get_json()["token_id"]
    answers = [_send(admin_client, "POST", "token.revoke", {"token_id": token_id}, "revoke-1",
                     headers) for _ in range(3)]
    assert all(a.status_code == 200 for a in answers)
    assert len({str(a.get_json()) for a in answers}) == 1
    [record] = list(redis_client.scan_iter("loom:idem:*:token.revoke:revoke-1"))
    assert "reply" in redis_client.hgetall(record)


def test_a_keyed_token_create_answers_the_same_token_and_keeps_no_secret(admin_client,
                                                                        redis_client):
    headers = bearer(ADMIN_TOKEN)
    body = {"namespace": NS, "role": "writer", "label": "sdk"}
    first = _send(admin_client, "POST", "token.create", body, "mint-1", headers)
    again = _send(admin_client, "POST", "token.create", body, "mint-1", headers)
    assert first.status_code == 200 and again.get_json() == first.get_json()
    token = first.get_json()["token"]
    token_id = first.get_json()["token_id"]
    secret = token.rsplit("_", 1)[1]
    # The replayed token works.
    works = admin_client.post("/v1/working_memory.get", json={**BLOCK},
                              headers=bearer(token))
    assert works.status_code == 200
    everything = dump_everything(redis_client)
    assert token_id in everything  # the scan sees the token's row and the record at all
    assert secret not in everything and token not in everything


def test_keyed_memory_records_keep_no_text_and_a_redact_leaves_none(client, redis_client):
    text = "MARK-REDACT the customer's passport is X1234567"
    written = client.post("/v1/memory.set", json={**WHO, "key": "doc", "value": text,
                                                   "memory_type": "semantic"},
                          headers={"Idempotency-Key": "w-1"}).get_json()
    memory_id = written["memory_id"]
    # By memory_id with no user in the identity (the case): the record goes to the
    # row's user, not to user '-'.
    by_id = {"namespace": NS, "agent": "chat", "memory_id": memory_id}
    for op_name, key in (("memory.reinforce", "w-2"), ("memory.restate", "w-3")):
        answer = client.post(f"/v1/{op_name}", json=by_id, headers={"Idempotency-Key": key})
        assert answer.status_code == 200, answer.get_json()
    records = list(redis_client.scan_iter("loom:idem:*"))
    assert len(records) == 3
    assert all("{default/support/u-in-step}" in record for record in records)
    redacted = client.post("/v1/memory.redact", json=by_id, headers={"Idempotency-Key": "w-4"})
    assert redacted.status_code == 200, redacted.get_json()
    everything = dump_everything(redis_client)
    assert "loom:idem:" in everything and memory_id in everything
    assert "MARK-REDACT" not in everything and "X1234567" not in everything
