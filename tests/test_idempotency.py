"""Idempotency-Key on write ops, through the Flask app on a real Valkey (and a real cluster):
a repeat answers the first answer and applies nothing; a concurrent duplicate never runs twice;
a call that ends without an answer is never run again."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from app.idempotency import RUNNING_MS, fingerprint
from app.store import keys
from app.store.idempotency import DAY_MS, IdempotencyStore, KeyRecord
from tests.auth_support import auth_app, bearer, mint
from tests.conftest import make_app
from tests.support.owned_redis import OwnedRedis

BLOCK = {"namespace": "support", "agent": "triage-bot", "run_id": "run-7", "block_key": "log",
         "user_id": "u-1"}


def _append(client, addition: str, key: str | None, **headers: str):
    if key is not None:
        headers["Idempotency-Key"] = key
    return client.post("/v1/working_memory.append", json={**BLOCK, "addition": addition},
                       headers=headers)


def _content(client) -> str:
    answer = client.post("/v1/working_memory.get", json=BLOCK).get_json()
    return str(answer.get("content", ""))


def test_a_repeat_answers_the_first_answer_and_applies_nothing(client, redis_client):
    first = _append(client, "a", "key-1")
    assert first.status_code == 200
    for _ in range(3):
        again = _append(client, "a", "key-1")
        assert (again.status_code, again.get_json()) == (200, first.get_json())
    assert _content(client) == "a"
    other = _append(client, "a", "key-2")  # a new key is a new request
    assert other.status_code == 200 and other.get_json()["version"] != first.get_json()["version"]
    assert _content(client) == "a\na"
    unkeyed = _append(client, "a", None)  # no key: every call applies
    assert unkeyed.status_code == 200
    assert _content(client) == "a\na\na"
    # The record lives a day, in the identity's slot.
    [record] = redis_client.keys("loom:idem:*key-1")
    assert record.startswith(f"loom:idem:{keys.user_tag('default', 'support', 'u-1')}:")
    assert DAY_MS - 60_000 < redis_client.pttl(record) <= DAY_MS


def test_the_same_key_with_another_body_is_refused_and_applies_nothing(client):
    assert _append(client, "a", "key-1").status_code == 200
    reused = _append(client, "b", "key-1")
    assert reused.status_code == 422
    assert reused.get_json()["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert _content(client) == "a"


def test_a_key_belongs_to_one_op_one_identity_and_one_token(app_factory):
    app = auth_app(app_factory)
    client = app.test_client()
    writer = mint(client, role="writer", namespace="support")
    other = mint(client, role="writer", namespace="support")
    assert _append(client, "a", "k", **bearer(writer)).status_code == 200
    assert _append(client, "a", "k", **bearer(other)).status_code == 200  # another token
    elsewhere = client.post(
        "/v1/working_memory.append", headers={**bearer(writer), "Idempotency-Key": "k"},
        json={**BLOCK, "user_id": "u-2", "addition": "a"})
    assert elsewhere.status_code == 200  # another user: another record
    replaced = client.post(
        "/v1/working_memory.set", headers={**bearer(writer), "Idempotency-Key": "k"},
        json={**BLOCK, "content": "fresh"})
    assert replaced.status_code == 200  # another op
    assert _append(client, "a", "k", **bearer(writer)).status_code == 200  # replayed
    read = client.post("/v1/working_memory.get", json=BLOCK, headers=bearer(writer))
    assert read.get_json()["content"] == "fresh"


def test_a_refusal_is_answered_again_even_once_the_write_would_pass(client):
    replace = {**BLOCK, "old": "draft", "new": "final"}
    headers = {"Idempotency-Key": "replace-1"}
    client.post("/v1/working_memory.set", json={**BLOCK, "content": "nothing yet"})
    refused = client.post("/v1/working_memory.replace", json=replace, headers=headers)
    assert refused.status_code == 422
    client.post("/v1/working_memory.set", json={**BLOCK, "content": "the draft"})
    again = client.post("/v1/working_memory.replace", json=replace, headers=headers)
    assert (again.status_code, again.get_json()) == (422, refused.get_json())
    assert _content(client) == "the draft"
    fresh = client.post("/v1/working_memory.replace", json=replace,
                        headers={"Idempotency-Key": "replace-2"})
    assert fresh.status_code == 200 and _content(client) == "the final"


def test_a_bad_key_is_a_422_naming_the_header_and_reads_ignore_the_key(client):
    for bad in ("x" * 256, "caf\u00e9"):
        response = client.post("/v1/working_memory.append",
                               json={**BLOCK, "addition": "a"},
                               headers={"Idempotency-Key": bad.encode().decode("latin-1")})
        assert response.status_code == 422
        assert "Idempotency-Key" in response.get_json()["error"]["fields"]
    assert _content(client) == ""
    for _ in range(2):
        read = client.post("/v1/working_memory.get", json=BLOCK,
                           headers={"Idempotency-Key": "read-1"})
        assert read.status_code == 200
    assert _append(client, "a", "read-1").status_code == 200  # the read took no record


def test_concurrent_duplicates_apply_once(app):
    duplicates = 8
    start = threading.Barrier(duplicates)

    def send(_: int):
        start.wait()
        response = _append(app.test_client(), "once", "shared")
        return response.status_code, response.get_json(), response.headers.get("Retry-After")

    with ThreadPoolExecutor(max_workers=duplicates) as pool:
        answers = list(pool.map(send, range(duplicates)))
    succeeded = [body for status, body, _ in answers if status == 200]
    waiting = [(body, retry) for status, body, retry in answers if status == 409]
    assert len(succeeded) + len(waiting) == duplicates
    assert succeeded and all(body == succeeded[0] for body in succeeded)
    assert all(body["error"]["code"] == "IDEMPOTENCY_IN_PROGRESS" and retry == "1"
               for body, retry in waiting)
    assert _content(app.test_client()) == "once"


def test_a_call_that_stopped_without_an_answer_is_never_run_again(app_factory, clock):
    app = app_factory(clock=clock)
    client = app.test_client()
    services = app.extensions["loom"]
    # A first call reserved the key, then its process went away before any answer.
    record = KeyRecord("default", "support", "u-1", "single-user", "working_memory.append", "k")
    body = {**BLOCK, "addition": "a"}
    begun = services.store(IdempotencyStore).begin(record, fingerprint(body), "gone", RUNNING_MS)
    assert begun.state == "NEW"
    running = _append(client, "a", "k")
    assert running.status_code == 409 and running.headers["Retry-After"] == "1"
    assert running.get_json()["error"]["code"] == "IDEMPOTENCY_IN_PROGRESS"
    clock.advance(RUNNING_MS / 1000 + 1)
    unknown = _append(client, "a", "k")
    assert unknown.status_code == 409
    assert unknown.get_json()["error"]["code"] == "IDEMPOTENCY_OUTCOME_UNKNOWN"
    assert _content(client) == ""


@pytest.mark.real
def test_a_write_answered_503_in_a_hang_is_applied_at_most_once(tmp_path: Path):
    owned = OwnedRedis(tmp_path / "owned-redis").start()
    try:
        app = make_app(owned.url, tmp_path, redis_socket_timeout_seconds=0.3,
                       redis_connect_timeout_seconds=0.3)
        client = app.test_client()
        assert _append(client, "a", None).status_code == 200
        owned.pause()
        try:
            hung = _append(client, "b", "during-hang")
        finally:
            owned.resume()
        assert hung.status_code == 503 and hung.headers["Retry-After"]
        repeats = [_append(client, "b", "during-hang") for _ in range(3)]
        # Whatever the hang left (nothing, a reservation, or the applied write), every repeat
        # answers alike and the addition is there once at most, never twice.
        answers = {(repeat.status_code, str(repeat.get_json())) for repeat in repeats}
        assert len(answers) == 1
        [(status, _)] = answers
        assert status in (200, 409)
        if status == 200:
            assert _content(client) == "a\nb"
        else:
            assert _content(client) in ("a", "a\nb")
    finally:
        owned.stop()


@pytest.fixture
def cluster(redis_cluster):
    redis_cluster.flush()
    yield redis_cluster
    redis_cluster.flush()


@pytest.mark.real
def test_keys_work_on_a_cluster_in_the_identitys_slot(cluster, queue_url, tmp_path):
    app = make_app(cluster.url, tmp_path, redis_cluster="on", queue_url=queue_url)
    client = app.test_client()
    for user in ("u-1", "u-2", "u-3"):
        first = client.post("/v1/working_memory.append", headers={"Idempotency-Key": "k"},
                            json={**BLOCK, "user_id": user, "addition": user})
        again = client.post("/v1/working_memory.append", headers={"Idempotency-Key": "k"},
                            json={**BLOCK, "user_id": user, "addition": user})
        assert first.status_code == 200 and again.get_json() == first.get_json()
        content = client.post("/v1/working_memory.get", json={**BLOCK, "user_id": user})
        assert content.get_json()["content"] == user
    data = redis.RedisCluster.from_url(cluster.url, decode_responses=True)
    try:
        for user in ("u-1", "u-2", "u-3"):
            record = keys.idempotency("default", "support", user, "single-user",
                                      "working_memory.append", "k")
            block = keys.working_memory_scope("default", "support", user, "triage-bot", "-",
                                              "run-7")
            assert data.exists(record) and data.exists(block)
            assert data.keyslot(record) == data.keyslot(block)
    finally:
        data.close()


def test_only_the_holder_settles_a_reservation(app):
    services = app.extensions["loom"]
    store = services.store(IdempotencyStore)
    record = KeyRecord("default", "support", "u-1", "t", "working_memory.append", "k")
    assert store.begin(record, "f", "mine", RUNNING_MS).state == "NEW"
    assert not store.finish(record, "theirs", '{"status": 200, "answer": {}}')
    assert store.finish(record, "mine", '{"status": 200, "answer": {"x": 1}}')
    assert not store.release(record, "mine")  # settled once: a done record stays
    begun = store.begin(record, "f", "next", RUNNING_MS)
    assert begun.state == "DONE" and begun.answer == '{"status": 200, "answer": {"x": 1}}'
    assert store.begin(record, "other body", "next", RUNNING_MS).state == "REUSED"
