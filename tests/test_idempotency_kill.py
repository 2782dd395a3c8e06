"""A keyed write whose gunicorn worker is killed (kill -9) mid-write settles within seconds.

A real gunicorn (gevent, one worker) runs on a relay in front of the test server that holds
the memory write's script (tests/support/holding_proxy.py): either the server ran it and the
reply never comes back (the write committed), or it never reached the server (the write never
ran). With keyed writes held so, the worker is killed; 2 s later each write is sent again with
its key, as a client honouring ``Retry-After`` does, until it is answered. Every retry settles
within 5 s of its first try, with the answer of the committed write or a write that runs now,
and every row holds one version: never a duplicate.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import pytest
import requests

from app.store.lua import source
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
WRITE_SCRIPT = hashlib.sha1(source("memory_set").encode()).hexdigest().encode()


def _body(user_id: str) -> dict[str, str]:
    return {"namespace": NS, "agent": "chat", "user_id": user_id, "key": "currency",
            "value": f"{user_id} prefers EUR invoices.", "memory_type": "preference"}


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


def _settle(url: str, user_id: str, key: str,
            trace: list[tuple[float, str]]) -> tuple[float, requests.Response]:
    """Send the write again with its key until it is answered (anything but a 409 that asks to
    wait, a 503 or no connection); how long that took, and the answer. ``trace`` gets each
    try's time and what it met."""
    started = time.monotonic()
    while True:
        try:
            answer = requests.post(f"{url}/v1/memory.set", json=_body(user_id),
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


def _versions(url: str, user_id: str) -> int:
    history = requests.post(f"{url}/v1/memory.history", timeout=10, json={
        "namespace": NS, "agent": "chat", "user_id": user_id, "key": "currency"})
    return len(history.json()["versions"]) if history.status_code == 200 else 0


def _kill_mid_write(server: LiveServer, proxy: HoldingProxy, hold: Hold, round_name: str,
                    traces: dict[str, list[tuple[float, str]]],
                    ) -> list[tuple[float, requests.Response, str]]:
    assert server.process is not None
    [worker] = wait_for(lambda: _worker_pids(server.process.pid), 20, "one worker")
    proxy.arm(WRITE_SCRIPT, hold)
    users = [f"{round_name}-{n}" for n in range(WRITES)]

    def first_try(user_id: str) -> None:
        try:
            requests.post(f"{server.url}/v1/memory.set", json=_body(user_id),
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
        took, answer = _settle(server.url, user_id, f"key-{user_id}", trace)
        with lock:
            settled.append((took, answer, user_id))
            traces[user_id] = trace

    retries = [threading.Thread(target=retry, args=(user,)) for user in users]
    for thread in retries:
        thread.start()
    for thread in retries:
        thread.join(timeout=60)
    return settled


@pytest.mark.parametrize("hold", ["reply", "request"])
def test_every_retry_after_a_killed_worker_settles_within_seconds(redis_url, tmp_path, hold):
    upstream = urlparse(redis_url)
    proxy = HoldingProxy(upstream.port or 6379).start()
    proxied = urlunparse(upstream._replace(netloc=f"127.0.0.1:{proxy.port}"))
    env = {"REDIS_URL": proxied, "LOOM_SECRET_KEY": TEST_SECRET,
           "LOOM_DATA_DIR": str(tmp_path), "LOOM_REDIS_SOCKET_TIMEOUT_SECONDS": "30"}
    try:
        with LiveServer(env, workers=1, worker_class="gevent") as server:
            warm = requests.post(f"{server.url}/v1/memory.set", json=_body("warm"), timeout=10)
            assert warm.status_code == 200  # the write script is loaded on the server
            traces: dict[str, list[tuple[float, str]]] = {}
            settled = _kill_mid_write(server, proxy, hold, hold, traces)
            assert len(settled) == WRITES, traces
            for took, answer, user_id in settled:
                assert answer.status_code == 200, answer.text
                assert took <= SETTLE_WITHIN, traces[user_id]
                assert _versions(server.url, user_id) == 1, user_id
                # The kept answer or a write that ran now: either way the row's only version.
                assert answer.json()["created"] is True
            print(f"hold={hold}: settled {sorted(round(took, 2) for took, _, _ in settled)} s "
                  f"after the first retry, {RETRY_GAP} s after the kill")
    finally:
        proxy.stop()
