"""Restarts: blocks survive a restart of every process (Redis's append-only file, the app), and
the web process comes back at once after a kill -9 of its gunicorn master."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from app.local import die_with_parent, free_port
from tests.conftest import TEST_SECRET, make_app
from tests.support.persistence import append_only_files, own_server
from tests.support.processes import ROOT, loom_env, stop, wait_for

BLOCK = {"namespace": "n", "agent": "a", "block_key": "resume", "run_id": "run-7"}


def test_blocks_survive_a_restart_of_redis_and_the_app(tmp_path):
    server = own_server(tmp_path / "redis", appendonly=True).start()
    try:
        client = make_app(server.url, tmp_path).test_client()
        written = client.post(
            "/v1/working_memory.set", json={**BLOCK, "content": "cursor: 4812", "char_limit": 99}
        ).get_json()
    finally:
        server.stop()

    assert append_only_files(tmp_path / "redis")
    restarted = own_server(tmp_path / "redis", port=server.port, appendonly=True).start()
    try:
        client = make_app(restarted.url, tmp_path).test_client()
        out = client.post("/v1/working_memory.get", json=BLOCK).get_json()
    finally:
        restarted.stop()
    assert out["found"] is True
    assert (out["content"], out["char_limit"], out["version"]) == (
        "cursor: 4812", 99, written["version"]
    )


# --- the web process after a kill -9 of its master ----------------------------------------------

def _procfile_web(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """The Procfile's web line as written (no --bind: the port comes from PORT)."""
    line = next(row.split(":", 1)[1] for row in (ROOT / "Procfile").read_text().splitlines()
                if row.startswith("web:"))
    command = shlex.split(line)
    assert command[0] == "gunicorn"
    with log.open("ab") as output:
        return subprocess.Popen([sys.executable, "-m", *command], cwd=ROOT, env=env,
                                stdout=output, stderr=subprocess.STDOUT,
                                preexec_fn=die_with_parent)


def _workers_of(master: subprocess.Popen[bytes], count: int) -> list[int]:
    def children() -> list[int]:
        found = Path(f"/proc/{master.pid}/task/{master.pid}/children").read_text().split()
        return [int(pid) for pid in found] if len(found) == count else []

    return wait_for(children, 30, f"{count} workers")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _ready(url: str) -> bool:
    try:
        return requests.get(url + "/readyz", timeout=0.5).status_code == 200
    except requests.RequestException:
        return False


class _Writers:
    """Threads appending to working memory as fast as they are answered, counting answers."""

    def __init__(self, url: str, count: int) -> None:
        self.url = url
        self.answered = 0
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._write, args=(n,), daemon=True)
                        for n in range(count)]

    def _write(self, n: int) -> None:
        session = requests.Session()
        block = {"namespace": "restart", "agent": "a", "run_id": "r", "block_key": f"b{n}"}
        while not self.stopping.is_set():
            try:
                answer = session.post(self.url + "/v1/working_memory.append",
                                      json={**block, "addition": "x"}, timeout=1)
                self.answered += answer.status_code == 200
            except requests.RequestException:
                session = requests.Session()
                time.sleep(0.05)

    def __enter__(self) -> _Writers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=5)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_REUSEPORT and /proc")
def test_a_new_master_serves_while_the_killed_masters_workers_still_hold_their_sockets(
        redis_url, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = loom_env(REDIS_URL=redis_url, LOOM_SECRET_KEY=TEST_SECRET,
                   LOOM_DATA_DIR=str(tmp_path), PORT=str(port), WEB_CONCURRENCY="2")
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = _procfile_web(env, first_log)
    second: subprocess.Popen[bytes] | None = None
    old_workers: list[int] = []
    try:
        wait_for(lambda: _ready(url), 30, "the first master's /readyz")
        old_workers = _workers_of(first, 2)
        with _Writers(url, 4) as writers:
            wait_for(lambda: writers.answered >= 20, 30, "writes under the first master")
            # The worst case of a dying generation: its workers stopped, so they hold their
            # listening sockets for as long as the test likes and answer nothing.
            for pid in old_workers:
                os.kill(pid, signal.SIGSTOP)
            first.kill()
            first.wait()
            second = _procfile_web(env, second_log)
            # Every answer now comes from the new master's workers: the old ones are stopped.
            wait_for(lambda: _ready(url), 30, "the new master's /readyz")
            assert all(_alive(pid) for pid in old_workers)
            answered = writers.answered
            wait_for(lambda: writers.answered >= answered + 20, 30, "writes under the new master")
            for pid in old_workers:
                os.kill(pid, signal.SIGCONT)
            # Their master is gone: they stop by themselves, and the new master keeps serving.
            wait_for(lambda: not any(_alive(pid) for pid in old_workers), 10,
                     "the old workers to stop")
            answered = writers.answered
            wait_for(lambda: writers.answered >= answered + 20, 30, "writes after they stopped")
        assert second.poll() is None
    finally:
        for pid in old_workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        for master in (first, second):
            if master is not None and master.poll() is None:
                stop(master)
    log = second_log.read_text(errors="replace")
    assert "Connection in use" not in log and "Retrying" not in log, log[-2000:]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract sockets")
def test_a_second_master_on_the_same_address_is_refused(redis_url, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = loom_env(REDIS_URL=redis_url, LOOM_SECRET_KEY=TEST_SECRET,
                   LOOM_DATA_DIR=str(tmp_path), PORT=str(port), WEB_CONCURRENCY="1")
    first = _procfile_web(env, tmp_path / "first.log")
    try:
        wait_for(lambda: _ready(url), 30, "the first master's /readyz")
        second = _procfile_web(env, tmp_path / "second.log")
        assert second.wait(timeout=30) != 0
        assert "another Loom web master serves 127.0.0.1:" in (
            tmp_path / "second.log").read_text()
        assert _ready(url) and first.poll() is None
    finally:
        stop(first)
    # Stopped, the first master leaves the address free for the next one.
    third = _procfile_web(env, tmp_path / "third.log")
    try:
        wait_for(lambda: _ready(url), 30, "the next master's /readyz")
    finally:
        stop(third)
