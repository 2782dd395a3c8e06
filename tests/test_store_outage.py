"""Redis down, hung or loading: every op answers 503 STORE_UNAVAILABLE with Retry-After, after
one unanswered command (one socket timeout), and the same app serves again once Redis is back."""

from __future__ import annotations

import socket
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


def test_hung_redis_is_503_and_the_app_recovers_when_it_resumes(client, owned_redis):
    assert _set(client, "before").status_code == 200
    owned_redis.pause()
    try:
        _assert_unavailable(_get(client), "did not answer in time")
        _assert_unavailable(_set(client, "while hung"), "did not answer in time")
    finally:
        owned_redis.resume()
    got = _get(client)
    assert got.status_code == 200, got.get_json()
    assert got.get_json()["content"] == "before"


def _sent_since(silent: socket.socket) -> list[bytes]:
    """What each connection made to ``silent`` since the last look had sent, one entry a
    connection. The kernel completes the handshakes and keeps the bytes whether or not anyone
    accepts, so when a request has answered, everything it sent is here: no wait, no window."""
    silent.setblocking(False)
    sent: list[bytes] = []
    while True:
        try:
            conn, _ = silent.accept()
        except BlockingIOError:
            return sent
        with conn:
            conn.setblocking(False)
            data = b""
            while True:
                try:
                    chunk = conn.recv(65536)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                data += chunk
        sent.append(data)


def _commands(data: bytes) -> list[list[bytes]]:
    """The RESP commands in ``data`` (arrays of bulk strings, as redis-py sends them)."""
    commands: list[list[bytes]] = []
    lines = iter(data.split(b"\r\n"))
    for head in lines:
        if not head:
            continue
        assert head.startswith(b"*"), data
        words = []
        for _ in range(int(head[1:])):
            next(lines)  # the $length line
            words.append(next(lines))
        commands.append(words)
    return commands


def test_a_hung_store_costs_a_request_one_unanswered_command(tmp_path):
    """A store that takes connections and never answers: each request sends one command on one
    connection, meets one socket timeout and answers 503. redis-py's defaults would resend it
    (a new connection and another timeout per retry): that is the wait the settings bound."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as silent:
        app = make_app(f"redis://127.0.0.1:{silent.getsockname()[1]}/0", tmp_path,
                       redis_socket_timeout_seconds=SOCKET_TIMEOUT,
                       redis_connect_timeout_seconds=SOCKET_TIMEOUT)
        client = app.test_client()
        for request in (_get, lambda c: _set(c, "while hung")):
            _assert_unavailable(request(client), "did not answer in time")
            sent = _sent_since(silent)
            assert len(sent) == 1, sent
            assert len(_commands(sent[0])) == 1, sent


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
