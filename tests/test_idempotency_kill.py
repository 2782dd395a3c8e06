"""A keyed write whose gunicorn worker is killed (kill -9) mid-write settles within seconds.

A real gunicorn (gevent, one worker) runs on a relay in front of the test server that holds
the write's script (tests/support/holding_proxy.py): either the server ran it and the reply
never comes back (the write committed), or it never reached the server (the write never ran).
With keyed writes held so, the worker is killed; 2 s later each write is sent again with its
key, as a client honouring ``Retry-After`` does, until it is answered. Every retry settles
within 5 s of its first try, with the answer of the committed write or a write that runs now,
and every write is applied once: never a duplicate, never an outcome unknown. Planes: a memory
row (``memory.set``), a working-memory append and a profile-section append.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import pytest
import requests

from app.store.lua import keyed_source, source
from tests.conftest import ON_CLUSTER, TEST_SECRET
from tests.support.holding_proxy import Hold, HoldingProxy
from tests.support.live_server import LiveServer
from tests.support.processes import wait_for

pytestmark = [pytest.mark.real, pytest.mark.slow,
              pytest.mark.skipif(ON_CLUSTER, reason="one server behind the relay")]

NS = "support"
WRITES = 4
RETRY_GAP = 2.0
SETTLE_WITHIN = 5.0


def _sha(text: str) -> bytes:
    return hashlib.sha1(text.encode()).hexdigest().encode()


def _versions(url: str, user_id: str) -> int:
    history = requests.post(f"{url}/v1/memory.history", timeout=10, json={
        "namespace": NS, "agent": "chat", "user_id": user_id, "key": "currency"})
    return len(history.json()["versions"]) if history.status_code == 200 else 0


def _block_additions(url: str, user_id: str) -> int:
    block = requests.post(f"{url}/v1/working_memory.get", timeout=10, json={
        "namespace": NS, "agent": "chat", "user_id": user_id, "block_key": "log"})
    return str(block.json().get("content", "")).count(f"step of {user_id}")


def _section_additions(url: str, user_id: str) -> int:
    section = requests.post(f"{url}/v1/memory.get", timeout=10, json={
        "namespace": NS, "agent": "chat", "user_id": user_id, "key": "notes"})
    return str((section.json().get("memory") or {}).get("value", "")).count(f"note of {user_id}")


def _state_versions(url: str, user_id: str) -> int:
    state = requests.post(f"{url}/v1/agent-state/read", timeout=10, json={
        "namespace": NS, "agent": "chat", "scope": {"kind": "conversation", "id": user_id}})
    return int(state.json().get("version", 0))


def _enable_agent_state(url: str) -> None:
    for op_name, body in (
        ("features.set", {"features": {"agent_state": True}}),
        ("object_types.set", {"types": [{
            "type": "chat_state", "ownership": "agent",
            "fields": {"step": {"type": "string"}},
            "agent_state": {"scope": "conversation", "max_bytes": 4096, "write": "both"}}]}),
    ):
        answer = requests.post(f"{url}/v1/{op_name}", json={"namespace": NS, **body}, timeout=10)
        assert answer.status_code == 200, answer.text


@dataclass(frozen=True)
class Plane:
    path: str
    body: Callable[[str], dict[str, Any]]
    script: bytes  # the SHA1 of the script the relay holds
    applied: Callable[[str, str], int]  # how many times the user's write is in the data
    method: str = "POST"
    setup: Callable[[str], None] = lambda _url: None


PLANES = {
    "memory.set": Plane(
        "/v1/memory.set",
        lambda user_id: {"namespace": NS, "agent": "chat", "user_id": user_id,
                         "key": "currency", "value": f"{user_id} prefers EUR invoices.",
                         "memory_type": "preference"},
        _sha(source("memory_set")), _versions),
    "working_memory.append": Plane(
        "/v1/working_memory.append",
        lambda user_id: {"namespace": NS, "agent": "chat", "user_id": user_id,
                         "block_key": "log", "addition": f"step of {user_id}"},
        _sha(keyed_source("working_memory_append", "working_memory")), _block_additions),
    "profile.append": Plane(
        "/v1/profile.append",
        lambda user_id: {"namespace": NS, "agent": "chat", "user_id": user_id,
                         "label": "notes", "addition": f"note of {user_id}"},
        _sha(source("memory_set")), _section_additions),
    "agent_state.put": Plane(
        "/v1/agent-state",
        lambda user_id: {"namespace": NS, "agent": "chat", "mode": "merge_by_key",
                         "scope": {"kind": "conversation", "id": user_id},
                         "body": {"step": f"step of {user_id}"}},
        _sha(keyed_source("agent_state_write", "agent_state")), _state_versions,
        method="PUT", setup=_enable_agent_state),
}


def _worker_pids(master: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == master:
                found.append(int(entry.name))
    return found


def _settle(url: str, plane: Plane, user_id: str, key: str,
            trace: list[tuple[float, str]]) -> tuple[float, requests.Response]:
    """Send the write again with its key until it is answered (anything but a 409 that asks to
    wait, a 503 or no connection); how long that took, and the answer. ``trace`` gets each
    try's time and what it met."""
    started = time.monotonic()
    while True:
        try:
            answer = requests.request(plane.method, f"{url}{plane.path}",
                                      json=plane.body(user_id),
                                      headers={"Idempotency-Key": key}, timeout=10)
        except requests.RequestException as error:
            trace.append((time.monotonic() - started, type(error).__name__))
            time.sleep(0.2)  # the master is starting a new worker
            continue
        code = (answer.json().get("error") or {}).get("code") if answer.status_code >= 400 else ""
        trace.append((time.monotonic() - started, f"{answer.status_code} {code}"))
        if answer.status_code == 503 or code == "IDEMPOTENCY_IN_PROGRESS":
            time.sleep(float(answer.headers.get("Retry-After", "1")))
            continue
        return time.monotonic() - started, answer


def _kill_mid_write(server: LiveServer, proxy: HoldingProxy, plane: Plane, hold: Hold,
                    round_name: str,
                    traces: dict[str, list[tuple[float, str]]],
                    ) -> list[tuple[float, requests.Response, str]]:
    assert server.process is not None
    [worker] = wait_for(lambda: _worker_pids(server.process.pid), 20, "one worker")
    proxy.arm(plane.script, hold)
    users = [f"{round_name}-{n}" for n in range(WRITES)]

    def first_try(user_id: str) -> None:
        try:
            requests.request(plane.method, f"{server.url}{plane.path}",
                             json=plane.body(user_id),
                             headers={"Idempotency-Key": f"key-{user_id}"}, timeout=30)
        except requests.RequestException:
            pass  # the worker is killed under it: the client meets a closed connection

    tries = [threading.Thread(target=first_try, args=(user,), daemon=True) for user in users]
    for thread in tries:
        thread.start()
    wait_for(lambda: proxy.held == WRITES, 20, "every write held mid-script")
    # Held past the lease: the worker renews it while the writes wait on the store.
    time.sleep(4.0)
    os.kill(worker, signal.SIGKILL)
    proxy.disarm()
    for thread in tries:
        thread.join(timeout=10)
    time.sleep(RETRY_GAP)
    settled: list[tuple[float, requests.Response, str]] = []
    lock = threading.Lock()

    def retry(user_id: str) -> None:
        trace: list[tuple[float, str]] = []
        took, answer = _settle(server.url, plane, user_id, f"key-{user_id}", trace)
        with lock:
            settled.append((took, answer, user_id))
            traces[user_id] = trace

    retries = [threading.Thread(target=retry, args=(user,)) for user in users]
    for thread in retries:
        thread.start()
    for thread in retries:
        thread.join(timeout=60)
    return settled


@pytest.mark.parametrize("plane_name", sorted(PLANES))
@pytest.mark.parametrize("hold", ["reply", "request"])
def test_every_retry_after_a_killed_worker_settles_within_seconds(redis_url, tmp_path, hold,
                                                                  plane_name):
    plane = PLANES[plane_name]
    upstream = urlparse(redis_url)
    proxy = HoldingProxy(upstream.port or 6379).start()
    proxied = urlunparse(upstream._replace(netloc=f"127.0.0.1:{proxy.port}"))
    env = {"REDIS_URL": proxied, "LOOM_SECRET_KEY": TEST_SECRET,
           "LOOM_DATA_DIR": str(tmp_path), "LOOM_REDIS_SOCKET_TIMEOUT_SECONDS": "30"}
    try:
        with LiveServer(env, workers=1, worker_class="gevent") as server:
            plane.setup(server.url)
            warm = requests.request(plane.method, f"{server.url}{plane.path}",
                                    json=plane.body("warm"),
                                    headers={"Idempotency-Key": "warm"}, timeout=10)
            assert warm.status_code == 200  # the write script is loaded on the server
            traces: dict[str, list[tuple[float, str]]] = {}
            settled = _kill_mid_write(server, proxy, plane, hold, hold, traces)
            assert len(settled) == WRITES, traces
            for took, answer, user_id in settled:
                assert answer.status_code == 200, answer.text
                assert took <= SETTLE_WITHIN, traces[user_id]
                # The kept answer or a write that ran now: either way applied once.
                assert plane.applied(server.url, user_id) == 1, user_id
                again = requests.request(plane.method, f"{server.url}{plane.path}",
                                         json=plane.body(user_id),
                                         headers={"Idempotency-Key": f"key-{user_id}"},
                                         timeout=10)
                assert again.json() == answer.json()
            took_s = sorted(round(took, 2) for took, _, _ in settled)
            print(f"{plane_name} hold={hold}: settled {took_s} s after the first retry, "
                  f"{RETRY_GAP} s after the kill")
    finally:
        proxy.stop()
