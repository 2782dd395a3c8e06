"""The README's run command: an embedded, persistent redis-server and every Procfile process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from app.local import free_port

ROOT = Path(__file__).resolve().parents[1]
BLOCK = {"namespace": "support", "agent": "triage-bot", "run_id": "run-7", "block_key": "state"}


def _start(data_dir: Path, port: int, redis_port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "LOOM_DATA_DIR": str(data_dir), "PORT": str(port),
           "MCP_PORT": str(free_port()), "LOOM_LOCAL_REDIS_PORT": str(redis_port)}
    env.pop("REDIS_URL", None)
    env.pop("LOOM_SECRET_KEY", None)
    return subprocess.Popen([sys.executable, "-m", "app.local"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _wait(url: str, timeout: float = 40) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            requests.get(url + "/openapi.json", timeout=2)
            return
        except requests.RequestException:
            time.sleep(0.3)
    raise AssertionError("the local run did not start")


def _stop(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.mark.slow
def test_the_run_command_serves_and_keeps_blocks_across_restarts(tmp_path):
    port, redis_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    process = _start(tmp_path, port, redis_port)
    try:
        _wait(url)
        answer = requests.post(url + "/v1/working_memory.set",
                               json={**BLOCK, "content": "cursor: ticket 4812"}, timeout=5)
        assert answer.status_code == 200
    finally:
        _stop(process)
    assert (tmp_path / "redis" / "appendonlydir").is_dir()
    assert (tmp_path / "secret_key").read_text().strip()

    process = _start(tmp_path, port, redis_port)
    try:
        _wait(url)
        out = requests.post(url + "/v1/working_memory.get", json=BLOCK, timeout=5).json()
        assert out["found"] is True and out["content"] == "cursor: ticket 4812"
    finally:
        _stop(process)
