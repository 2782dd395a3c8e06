"""Idempotency-Key on write ops, through the Flask app on a real Valkey (and a real cluster):
a repeat answers the first answer and applies nothing; a concurrent duplicate never runs twice;
a call that ends without an answer is never run again."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from app import idempotency
from app.errors import IdempotencyInProgress
from app.idempotency import LEASE_MS, RENEW_SECONDS, fingerprint
from app.store import keys
from app.store.idempotency import DAY_MS, HeldKey, IdempotencyStore, KeyRecord
from app.store.memory import Content, Location, MemoryStore
from tests.auth_support import auth_app, bearer, mint
from tests.conftest import make_app
from tests.support.owned_redis import OwnedRedis

BLOCK = {"namespace": "support", "agent": "triage-bot", "run_id": "run-7", "block_key": "log",
         "user_id": "u-1"}

USER_TAG = keys.user_tag("default", "support", "u-1")


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


def test_a_call_that_stopped_without_an_answer_is_run_once_by_its_retry(app_factory, clock):
    app = app_factory(clock=clock)
    client = app.test_client()
    services = app.extensions["loom"]
    # A first call reserved the key, then its process went away before its write: the append
    # keeps its answer in its own script step, so a lapsed lease proves it never ran.
    record = KeyRecord(USER_TAG, "single-user",
                       "working_memory.append", "k")
    body = {**BLOCK, "addition": "a"}
    begun = services.store(IdempotencyStore).begin(record, fingerprint(body), "gone", LEASE_MS,
                                                   recorded=True)
    assert begun.state == "NEW"
    running = _append(client, "a", "k")
    assert running.status_code == 409 and running.headers["Retry-After"] == "1"
    assert running.get_json()["error"]["code"] == "IDEMPOTENCY_IN_PROGRESS"
    clock.advance(LEASE_MS / 1000 + 1)
    retried = _append(client, "a", "k")
    assert retried.status_code == 200
    again = _append(client, "a", "k")
    assert again.status_code == 200 and again.get_json() == retried.get_json()
    assert _content(client) == "a"


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
        # Whatever the hang left (nothing, a reservation, or the write with its answer), the
        # retries settle on one answer once the lease has lapsed, and the addition is there
        # exactly once.
        repeats = _settled_retries(client, "b", "during-hang", 3)
        answers = {str(repeat.get_json()) for repeat in repeats}
        assert len(answers) == 1 and all(r.status_code == 200 for r in repeats)
        assert _content(client) == "a\nb"
    finally:
        owned.stop()


def _settled_retries(client, addition: str, key: str, count: int) -> list:
    """``count`` answers of retries with ``key``, after waiting out a cut try's lease."""
    deadline = time.monotonic() + LEASE_MS / 1000 + 5
    answers = []
    while len(answers) < count:
        answer = _append(client, addition, key)
        if answer.status_code == 409 and time.monotonic() < deadline:
            assert answer.get_json()["error"]["code"] == "IDEMPOTENCY_IN_PROGRESS"
            time.sleep(0.2)
            continue
        answers.append(answer)
    return answers


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
            record = keys.idempotency(keys.user_tag("default", "support", user), "single-user",
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
    record = KeyRecord(USER_TAG, "t", "working_memory.append", "k")
    assert store.begin(record, "f", "mine", LEASE_MS).state == "NEW"
    assert not store.finish(record, "theirs", '{"status": 200, "answer": {}}')
    assert store.finish(record, "mine", '{"status": 200, "answer": {"x": 1}}')
    assert not store.release(record, "mine")  # settled once: a done record stays
    begun = store.begin(record, "f", "next", LEASE_MS)
    assert begun.state == "DONE" and begun.answer == '{"status": 200, "answer": {"x": 1}}'
    assert store.begin(record, "other body", "next", LEASE_MS).state == "REUSED"


# --- the memory writes: the answer is kept in the write's own step ------------------------------

FACT = {"namespace": "support", "agent": "triage-bot", "user_id": "u-1", "key": "currency",
        "value": "Prefers EUR invoices.", "memory_type": "preference"}


def _set_fact(client, key: str | None, **body):
    headers = {"Idempotency-Key": key} if key is not None else {}
    return client.post("/v1/memory.set", json={**FACT, **body}, headers=headers)


def _versions(client) -> int:
    history = client.post("/v1/memory.history", json={**FACT, "value": None})
    if history.status_code == 404:
        return 0
    return len(history.get_json()["versions"])


def _fact_record(key: str) -> KeyRecord:
    return KeyRecord(USER_TAG, "single-user", "memory.set", key)


def test_a_memory_write_keeps_its_answer_in_its_own_step(client, redis_client):
    first = _set_fact(client, "fact-1", unknown_field="x")
    assert first.status_code == 200
    record = _fact_record("fact-1").redis_key
    # The write's script kept its reply; no second step stored an answer beside it.
    assert redis_client.hget(record, "state") == "done"
    assert redis_client.hget(record, "reply") and not redis_client.hexists(record, "answer")
    again = _set_fact(client, "fact-1", unknown_field="x")
    assert (again.status_code, again.get_json()) == (200, first.get_json())
    assert again.get_json()["ignored_args"] == ["unknown_field"]
    assert _versions(client) == 1


@pytest.mark.parametrize(("op", "body"), [
    ("memory.lock", {}), ("memory.restate", {}), ("memory.reinforce", {"confidence": 0.9}),
    ("memory.delete", {}), ("memory.recall", {}),
])
def test_every_kept_answer_replays_as_first_answered(client, op, body):
    assert _set_fact(client, None).status_code == 200
    target = {"namespace": "support", "agent": "triage-bot", "user_id": "u-1",
              "key": "currency", **body}
    first = client.post(f"/v1/{op}", json=target, headers={"Idempotency-Key": op})
    assert first.status_code == 200
    again = client.post(f"/v1/{op}", json=target, headers={"Idempotency-Key": op})
    assert again.get_json() == first.get_json()
    assert _versions(client) == 2


def test_a_try_that_died_before_its_write_lets_the_next_try_run_once_its_lease_lapses(
        app_factory, clock):
    app = app_factory(clock=clock)
    client = app.test_client()
    store = app.extensions["loom"].store(IdempotencyStore)
    body = {**FACT}
    begun = store.begin(_fact_record("k"), fingerprint(body), "gone", LEASE_MS, recorded=True)
    assert begun.state == "NEW"
    held = _set_fact(client, "k")
    assert held.status_code == 409 and held.headers["Retry-After"] == "1"
    assert held.get_json()["error"]["code"] == "IDEMPOTENCY_IN_PROGRESS"
    clock.advance(LEASE_MS / 1000 + 0.1)
    ran = _set_fact(client, "k")
    assert ran.status_code == 200 and ran.get_json()["created"] is True
    assert _set_fact(client, "k").get_json() == ran.get_json()
    assert _versions(client) == 1


def test_a_try_that_died_after_its_write_is_answered_what_it_wrote(app_factory, clock):
    app = app_factory(clock=clock)
    client = app.test_client()
    services = app.extensions["loom"]
    record = _fact_record("k")
    body = {**FACT}
    assert services.store(IdempotencyStore).begin(
        record, fingerprint(body), "gone", LEASE_MS, recorded=True).state == "NEW"
    # The first try's write ran, with its key; then its process died before any answer.
    location = Location("default", "support", "u-1", "triage-bot", "-", "currency")
    written = services.store(MemoryStore).set(
        location, Content(memory_type="preference", value=FACT["value"], actor="triage-bot"),
        written_by="triage-bot", held=HeldKey(record.redis_key, "gone"))
    clock.advance(LEASE_MS / 1000 + 0.1)
    answered = _set_fact(client, "k")
    assert answered.status_code == 200
    assert answered.get_json()["version_text"] == str(written.row.version)
    assert answered.get_json()["created"] is True
    assert _versions(client) == 1


def test_a_try_that_lost_its_lease_to_a_later_one_writes_nothing(app_factory, clock):
    app = app_factory(clock=clock)
    services = app.extensions["loom"]
    store = services.store(IdempotencyStore)
    record = _fact_record("k")
    assert store.begin(record, "f", "slow", LEASE_MS, recorded=True).state == "NEW"
    clock.advance(LEASE_MS / 1000 + 0.1)
    assert store.begin(record, "f", "later", LEASE_MS, recorded=True).state == "NEW"
    location = Location("default", "support", "u-1", "triage-bot", "-", "currency")
    with pytest.raises(IdempotencyInProgress):
        services.store(MemoryStore).set(
            location, Content(memory_type="preference", value="late", actor="triage-bot"),
            written_by="triage-bot", held=HeldKey(record.redis_key, "slow"))
    assert services.store(MemoryStore).read(location) is None


def test_an_op_whose_answer_is_a_separate_step_still_says_unknown_after_the_lease(
        app_factory, clock):
    app = app_factory(clock=clock)
    store = app.extensions["loom"].store(IdempotencyStore)
    record = KeyRecord(USER_TAG, "t", "working_memory.append", "k")
    assert store.begin(record, "f", "gone", LEASE_MS).state == "NEW"
    clock.advance(LEASE_MS / 1000 + 0.1)
    assert store.begin(record, "f", "next", LEASE_MS).state == "UNKNOWN"


def test_concurrent_duplicate_memory_writes_apply_once(app):
    duplicates = 8
    start = threading.Barrier(duplicates)

    def send(_: int):
        start.wait()
        response = _set_fact(app.test_client(), "shared")
        return response.status_code, response.get_json()

    with ThreadPoolExecutor(max_workers=duplicates) as pool:
        answers = list(pool.map(send, range(duplicates)))
    succeeded = [body for status, body in answers if status == 200]
    assert succeeded and all(body == succeeded[0] for body in succeeded)
    assert all(status in (200, 409) for status, _ in answers)
    assert _versions(app.test_client()) == 1


@pytest.mark.real
def test_a_running_try_keeps_its_lease_alive(app, redis_client):
    """The renewal runs on the process's own thread: a try that runs past its lease keeps the
    key, and lets go of it once it ends."""
    store = app.extensions["loom"].store(IdempotencyStore)
    record = KeyRecord(USER_TAG, "t", "memory.set", "long")
    assert store.begin(record, "f", "long-try", LEASE_MS, recorded=True).state == "NEW"
    ticket = idempotency._renewer.hold(store, record, "long-try")
    try:
        first = int(redis_client.hget(record.redis_key, "lease_until"))
        time.sleep(LEASE_MS / 1000 + RENEW_SECONDS)
        renewed = int(redis_client.hget(record.redis_key, "lease_until"))
        assert renewed > first + 1000
        assert store.begin(record, "f", "other", LEASE_MS, recorded=True).state == "RUNNING"
    finally:
        idempotency._renewer.drop(ticket)
    time.sleep(RENEW_SECONDS)  # a renewal already under way when the try ended
    ended = redis_client.hget(record.redis_key, "lease_until")
    time.sleep(2 * RENEW_SECONDS)
    assert redis_client.hget(record.redis_key, "lease_until") == ended
