"""Redis down, hung or loading: every op answers 503 STORE_UNAVAILABLE with Retry-After, within
about one socket timeout, and the same app serves again once Redis is back."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from app.store.tokens import TOKEN_PREFIX
from tests.conftest import make_app
from tests.support.owned_redis import OwnedRedis

pytestmark = pytest.mark.real

SOCKET_TIMEOUT = 0.5
BLOCK = {"namespace": "support", "agent": "triage-bot", "run_id": "run-7", "block_key": "state"}


@pytest.fixture
def owned_redis(tmp_path: Path):
    server = OwnedRedis(tmp_path / "owned-redis").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def client(owned_redis: OwnedRedis, tmp_path: Path):
    app = make_app(owned_redis.url, tmp_path, redis_socket_timeout_seconds=SOCKET_TIMEOUT,
                   redis_connect_timeout_seconds=SOCKET_TIMEOUT)
    return app.test_client()


def _set(client, content: str):
    return client.post("/v1/working_memory.set", json={**BLOCK, "content": content})


def _get(client):
    return client.post("/v1/working_memory.get", json=BLOCK)


def _assert_unavailable(response, reason: str) -> None:
    assert response.status_code == 503, response.get_json()
    error = response.get_json()["error"]
    assert error["code"] == "STORE_UNAVAILABLE"
    assert reason in error["message"]
    assert int(response.headers["Retry-After"]) > 0


def test_killed_redis_is_503_and_the_app_recovers_when_it_restarts(client, owned_redis):
    assert _set(client, "before the outage").status_code == 200
    owned_redis.kill()
    _assert_unavailable(_get(client), "unreachable")
    _assert_unavailable(_set(client, "during the outage"), "unreachable")
    owned_redis.start()
    # The pool's connections died with the old server; the same app reconnects by itself,
    # and the append-only file brought the acknowledged write back.
    got = _get(client)
    assert got.status_code == 200, got.get_json()
    assert got.get_json()["content"] == "before the outage"
    assert _set(client, "after the outage").status_code == 200


def test_hung_redis_is_503_within_about_one_socket_timeout(client, owned_redis):
    assert _set(client, "before").status_code == 200
    owned_redis.pause()
    try:
        started = time.monotonic()
        _assert_unavailable(_get(client), "did not answer in time")
        elapsed = time.monotonic() - started
        # Bounded by the setting (redis-py's defaults retried ten times: over 50 s).
        assert elapsed < SOCKET_TIMEOUT * 4, elapsed
        _assert_unavailable(_set(client, "while hung"), "did not answer in time")
    finally:
        owned_redis.resume()
    got = _get(client)
    assert got.status_code == 200, got.get_json()
    assert got.get_json()["content"] == "before"


def test_redis_loading_its_append_only_file_is_503_until_loaded(client, owned_redis):
    assert _set(client, "kept").status_code == 200
    owned_redis.fill_and_rewrite(20_000)
    # About 10 s of loading: on a loaded machine the server may take seconds before it first
    # answers, and it must still be loading then.
    owned_redis.restart_loading(keys_load_delay_us=500)
    _assert_unavailable(_get(client), "loading")
    owned_redis.wait_ready(timeout=60)
    got = _get(client)
    assert got.status_code == 200, got.get_json()
    assert got.get_json()["content"] == "kept"


def test_a_token_lookup_against_a_dead_redis_is_503_not_401(owned_redis, tmp_path):
    app = make_app(owned_redis.url, tmp_path, auth="on", admin_token="admin-secret",
                   redis_socket_timeout_seconds=SOCKET_TIMEOUT,
                   redis_connect_timeout_seconds=SOCKET_TIMEOUT)
    owned_redis.kill()
    well_formed = f"Bearer {TOKEN_PREFIX}abc123_def456"  # looked up in Redis, not refused
    response = app.test_client().post(
        "/v1/working_memory.get", json=BLOCK, headers={"Authorization": well_formed}
    )
    _assert_unavailable(response, "unreachable")
