"""user.erase as a background saga, against real processes: gunicorn, ``python -m jobs.worker``
and a real redis-server.

The op answers at once with ``running``; ``erasure.status`` shows the steps done of the total,
the current step and the counts; the worker is killed with ``kill -9`` (the worker and its
work horse) mid-saga; the erasure reads ``interrupted`` once its lock
has expired; a worker started again resumes it, and it ends ``done`` with exact counts and a
clean census, nothing of the user left in Redis.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from app.local import die_with_parent
from app.store import keys
from app.store.erasure import LOCK_TTL_MS, STEPS
from tests.conftest import TEST_SECRET
from tests.support.live_server import LiveServer

pytestmark = [pytest.mark.real, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
NS = "support"
USER = "u-bg-erase-5d1e"
OTHER = "u-bg-keep-8c2a"
FACTS = 6
PAUSE_SECONDS = 1.0


def _env(redis_url: str, tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "REDIS_URL": redis_url, "LOOM_SECRET_KEY": TEST_SECRET,
           "LOOM_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(ROOT),
           "LOOM_ERASURE_STEP_PAUSE_SECONDS": str(PAUSE_SECONDS)}
    env.pop("LOOM_QUEUE_URL", None)
    return env


def _worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "jobs.worker"], cwd=ROOT, env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            preexec_fn=die_with_parent)


def _descendants(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found += [child, *_descendants(child)]
    return found


def _kill_tree(process: subprocess.Popen[bytes]) -> None:
    """kill -9 of the worker and its work horse (RQ puts the horse in a process group of its
    own, so the horse is killed by its pid)."""
    for pid in [*_descendants(process.pid), process.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait(10)


def _wait(predicate: Any, seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        found = predicate()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


class Api:
    def __init__(self, url: str) -> None:
        self.url = url
        self.session = requests.Session()
        # A new connection each request: these tests idle for seconds between requests,
        # and a kept-alive connection reused just as gunicorn's keep-alive timeout
        # (LOOM_WEB_KEEPALIVE_SECONDS, 5 s) closes it fails without an answer.
        self.session.headers["Connection"] = "close"

    def call(self, op: str, **body: Any) -> tuple[int, dict[str, Any]]:
        response = self.session.post(f"{self.url}/v1/{op}",
                                     json={"namespace": NS, "agent": "chat", **body}, timeout=30)
        return response.status_code, response.json()

    def post(self, op: str, **body: Any) -> dict[str, Any]:
        status, out = self.call(op, **body)
        assert status == 200, (op, out)
        return out


def _plant(api: Api, user: str) -> None:
    for i in range(FACTS):
        api.post("memory.set", user_id=user, key=f"k-{i}", value=f"MARK {user} {i}")
    api.post("profile.set", user_id=user, label="persona", value=f"MARK {user} persona")
    api.post("working_memory.set", user_id=user, block_key="b", content=f"MARK {user} block")


def test_a_worker_killed_mid_erasure_leaves_it_to_a_new_worker(redis_url, tmp_path):
    env = _env(redis_url, tmp_path)
    data = redis.Redis.from_url(redis_url, decode_responses=True)
    workers: list[subprocess.Popen[bytes]] = []
    with LiveServer(env, workers=1) as web:
        api = Api(web.url)
        _plant(api, USER)
        _plant(api, OTHER)
        workers.append(_worker(env, tmp_path / "worker-1.log"))
        try:
            started = api.post("user.erase", user_id=USER)
            # At once: the answer came before the saga's first step was done, not after it.
            assert started["status"] == "running" and started["steps_done"] == 0
            assert started["steps_total"] == len(STEPS)
            assert started["current_step"] == "mark"
            erasure = started["erasure_id"]
            status, out = api.call("memory.set", user_id=USER, key="late", value="x")
            assert status == 409 and out["error"]["code"] == "USER_BEING_ERASED"

            def midway() -> dict[str, Any] | None:
                receipt = api.post("erasure.status", erasure_id=erasure)
                return receipt if receipt["steps_done"] >= 3 else None

            seen = _wait(midway, 60, "the saga to reach its fourth step")
            assert seen["status"] == "running" and seen["attempts"] == 1
            assert seen["step"] == STEPS[seen["steps_done"] - 1]
            assert seen["current_step"] == STEPS[seen["steps_done"]]
            assert seen["counts"]["memory_rows"] == FACTS
            assert seen["steps_done"] < len(STEPS) - 1, seen  # killed before the census
            again = api.post("user.erase", user_id=USER)  # idempotent: the same run's receipt
            assert again["erasure_id"] == erasure and again["status"] == "running"
            assert again["attempts"] == 1

            _kill_tree(workers[0])  # kill -9, mid-saga

            def interrupted() -> dict[str, Any] | None:
                receipt = api.post("erasure.status", erasure_id=erasure)
                return receipt if receipt["status"] == "interrupted" else None

            dead = _wait(interrupted, LOCK_TTL_MS / 1000 * 3, "the dead run to read interrupted")
            assert dead["retryable"] is True and dead["current_step"] == ""
            status, _ = api.call("memory.set", user_id=USER, key="late", value="x")
            assert status == 409  # still closed while the erasure waits for a worker

            workers.append(_worker(env, tmp_path / "worker-2.log"))

            def ended() -> dict[str, Any] | None:
                receipt = api.post("erasure.status", erasure_id=erasure)
                return receipt if receipt["status"] not in ("running", "interrupted") else None

            done = _wait(ended, 120, "the resumed saga to end")
        finally:
            for worker in workers:
                _kill_tree(worker)
        logs = "".join(p.read_text() for p in tmp_path.glob("worker-*.log"))
        assert done["status"] == "done", (done, logs[-3000:])
        assert done["attempts"] == 2 and done["steps_done"] == len(STEPS)
        assert done["census"]["clean"] is True and done["census"]["found"] == {}
        assert done["counts"]["memory_rows"] == FACTS
        assert done["counts"]["profile_sections"] == 1
        assert done["counts"]["working_memory_blocks"] == 1
        # The census on the server itself: nothing under the user's tag, no id anywhere.
        tag = keys.user_tag("default", NS, USER)
        assert [k for k in data.scan_iter(count=1000) if tag in k] == []
        assert USER not in data.hgetall(keys.erasure("default", NS, erasure)).values()
        assert not data.sismember(keys.erasures_due(), erasure)
        assert api.post("memory.get", user_id=OTHER, key="k-0")["memory"]["value"] == (
            f"MARK {OTHER} 0")
        # Writes for the user start from nothing again.
        assert api.post("memory.set", user_id=USER, key="k-0", value="fresh")["created"]
    data.close()
