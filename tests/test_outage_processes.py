"""The real worker and scheduler ride out Redis outages: down at start, killed, restarted.

Both processes start while Redis is down and must stay up; once Redis answers, the scheduler
enqueues passes and the worker builds a profile against the scripted model. Then Redis is
killed (kill -9) and started again under them, and a profile for a fact written afterwards is
built too. Neither process may exit meanwhile, and both stop promptly on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.local import die_with_parent
from tests.conftest import TEST_SECRET, make_app
from tests.support.model_server import ScriptedModelServer
from tests.support.owned_redis import OwnedRedis

pytestmark = [pytest.mark.real, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
NS = "support"
SCHEMA = {
    "type": "object",
    "properties": {
        "preferred_name": {"type": "string", "description": "What the user asks to be called"},
    },
}


def _start(module: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", module], cwd=ROOT, env=env, stdout=log.open("wb"),
        stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
    )


def _wait_ready(client, user: str, processes, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        for process in processes:
            assert process.poll() is None, f"{process.args} exited with {process.returncode}"
        answer = client.post("/v1/profile.structured",
                             json={"namespace": NS, "agent": "chat", "user_id": user})
        if answer.status_code == 200 and answer.get_json()["status"] == "ready":
            return answer.get_json()
        assert time.monotonic() < deadline, answer.get_json()
        time.sleep(0.5)


def _fact(client, user: str, value: str) -> None:
    answer = client.post("/v1/memory.set", json={
        "namespace": NS, "agent": "chat", "user_id": user, "key": "name", "value": value,
        "memory_type": "semantic"})
    assert answer.status_code == 200, answer.get_json()


def test_worker_and_scheduler_ride_out_redis_down_at_start_and_a_restart(tmp_path):
    redis_server = OwnedRedis(tmp_path / "redis")  # not started: Redis is down at start
    processes: list[subprocess.Popen[bytes]] = []
    with ScriptedModelServer() as model:
        model.default = {"preferred_name": "Sam"}
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "REDIS_URL": redis_server.url,
            "LOOM_SECRET_KEY": TEST_SECRET,
            "LOOM_DATA_DIR": str(tmp_path / "data"),
            "LOOM_LLM_BASE_URL": model.base_url,
            "LOOM_LLM_MODEL": "scripted-model",
            "LOOM_STRUCTURED_PROFILE_INTERVAL_SECONDS": "1",
            "LOOM_STRUCTURED_PROFILE_IDLE_INTERVAL_SECONDS": "1",
            "LOOM_STRUCTURED_PROFILE_COOLDOWN_SECONDS": "0",
            "LOOM_STRUCTURED_PROFILE_SCAN_MAX_AGE_SECONDS": "1",
        }
        env.pop("LOOM_QUEUE_URL", None)
        try:
            processes = [_start("jobs.worker", env, tmp_path / "worker.log"),
                         _start("jobs.scheduler", env, tmp_path / "scheduler.log")]
            time.sleep(3)
            for process in processes:
                assert process.poll() is None, (tmp_path / "worker.log").read_text() + (
                    tmp_path / "scheduler.log").read_text()
            redis_server.start()
            client = make_app(redis_server.url, tmp_path / "data").test_client()
            assert client.post("/v1/profile_schema.set", json={
                "namespace": NS, "agent": "chat", "json_schema": SCHEMA}).status_code == 200
            _fact(client, "u-before", "Sam")
            assert _wait_ready(client, "u-before", processes)["profile"]["preferred_name"] == "Sam"

            redis_server.kill()
            time.sleep(4)  # past a heartbeat and a scheduler tick, both against a dead Redis
            redis_server.start()
            _fact(client, "u-after", "Sam")
            assert _wait_ready(client, "u-after", processes)["profile"]["preferred_name"] == "Sam"
        finally:
            for process in processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in processes:
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                    pytest.fail(f"{process.args} did not stop on SIGTERM")
            redis_server.stop()


def _worker_threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _other_clients(connection) -> int:
    """Connections to Redis other than this test's own: the worker's, pub/sub included."""
    own = connection.client_id()
    return sum(1 for client in connection.client_list() if int(client["id"]) != own)


def _run_job(queue, seconds: float, timeout: float = 60.0):
    """Enqueue ``time.sleep(seconds)``; the job once it has started."""
    job = queue.enqueue("time.sleep", seconds)
    deadline = time.monotonic() + timeout
    while job.get_status(refresh=True) not in ("started", "finished"):
        assert time.monotonic() < deadline, "the worker took no job"
        time.sleep(0.1)
    return job


def _idle_counts(worker, queue, connection) -> tuple[int, int]:
    """Threads and connections of a worker that just finished a job and sits idle: counted
    after the 2 s in which a leftover pub/sub thread would have reconnected."""
    job = _run_job(queue, 0.1)
    deadline = time.monotonic() + 60
    while job.get_status(refresh=True) != "finished":
        assert worker.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(5)
    return _worker_threads(worker.pid), _other_clients(connection)


def test_outages_during_jobs_leave_the_workers_threads_and_connections_flat(tmp_path):
    import redis as redis_py
    from rq import Queue

    redis_server = OwnedRedis(tmp_path / "redis").start()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": redis_server.url,
           "LOOM_SECRET_KEY": TEST_SECRET, "LOOM_DATA_DIR": str(tmp_path / "data")}
    env.pop("LOOM_QUEUE_URL", None)
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        [sys.executable, "-m", "jobs.worker", "--queues", "loom-maintenance"], cwd=ROOT, env=env,
        stdout=log.open("wb"), stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    connection = redis_py.Redis.from_url(redis_server.url)
    try:
        queue = Queue("loom-maintenance", connection=connection)
        counts = [_idle_counts(worker, queue, connection)]
        for _ in range(3):
            _run_job(queue, 3)  # a job is running when Redis goes away
            redis_server.kill()
            time.sleep(3)  # the worker's heartbeat and teardown meet a dead Redis
            redis_server.start()
            connection.connection_pool.disconnect()
            counts.append(_idle_counts(worker, queue, connection))
            assert worker.poll() is None, log.read_text()
        # The data plane's connection opened at start is not needed again (the queue and the
        # data share this Redis), so the first count may hold one connection more; after
        # that, each outage must leave the same threads and connections as the one before.
        threads, clients = counts[0]
        assert all(after[0] == threads and after[1] <= clients for after in counts[1:]), counts
        assert counts[1:] == [counts[1]] * 3, counts
        assert "could not record the worker's death" in log.read_text()  # teardown failed

    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        connection.close()
        redis_server.stop()
