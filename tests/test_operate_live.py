"""Operating Loom's real processes: gunicorn with two workers, an RQ worker, the scheduler.

One run: a known sequence of ops, a pass the scheduler enqueues and the worker runs against a
scripted model, then ``/metrics`` scraped several times (any gunicorn worker may answer) and
parsed with prometheus_client's parser; every line the three processes wrote parsed as JSON;
then Redis stopped and started again under gunicorn while ``/readyz`` is polled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from app.local import RedisServerProcess, die_with_parent, free_port
from tests.conftest import TEST_SECRET
from tests.support.live_server import LiveServer
from tests.support.model_server import ScriptedModelServer
from tests.test_operate import samples, value
from tests.test_structured_worker import SCHEMA

ROOT = Path(__file__).resolve().parents[1]
NS = {"namespace": "support", "agent": "chat"}
USERS = ("u-secret-alpha", "u-secret-beta")


def _start(module: str, env: dict[str, str], output: Path) -> subprocess.Popen[bytes]:
    with output.open("ab") as log_file:
        return subprocess.Popen([sys.executable, "-m", module], cwd=ROOT, env=env,
                                stdout=log_file, stderr=subprocess.STDOUT,
                                preexec_fn=die_with_parent)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _json_lines(path: Path) -> list[dict]:
    lines = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"{path.name} line {number} is not JSON: {line!r}")
    return lines


@pytest.mark.slow
def test_metrics_logs_and_readiness_of_the_real_processes(tmp_path):
    redis_port = free_port()
    server = RedisServerProcess(tmp_path / "redis", port=redis_port, appendonly=False).start()
    model = ScriptedModelServer(default=lambda request: {"preferred_name": "Sam"}).start()
    env = {key: val for key, val in os.environ.items()
           if key not in ("PROMETHEUS_MULTIPROC_DIR", "REDIS_URL", "LOOM_QUEUE_URL")}
    env.update({
        "REDIS_URL": server.url, "LOOM_SECRET_KEY": TEST_SECRET, "LOOM_DATA_DIR": str(tmp_path),
        "LOOM_LOG_FORMAT": "json", "LOOM_LLM_BASE_URL": model.base_url,
        "LOOM_LLM_MODEL": "scripted-model", "LOOM_STRUCTURED_PROFILE_COOLDOWN_SECONDS": "0",
        "PYTHONPATH": str(ROOT),
    })
    logs = {name: tmp_path / f"{name}.log" for name in ("web", "worker", "scheduler")}
    web = LiveServer(env, workers=2, output=logs["web"]).start()
    background: list[subprocess.Popen[bytes]] = []
    try:
        session = requests.Session()

        def call(op: str, **body: object) -> requests.Response:
            return session.post(f"{web.url}/v1/{op}", json={**NS, **body}, timeout=10)

        # The known sequence.
        assert call("profile_schema.set", json_schema=SCHEMA).status_code == 200
        for user in USERS:
            assert call("memory.set", user_id=user, key="name",
                        value="Call me Sam").status_code == 200
        for index in range(5):
            assert call("working_memory.set", block_key=f"k{index}",
                        content="x").status_code == 200
        for _ in range(3):
            assert call("working_memory.get", block_key="").status_code == 422
        tagged = call("working_memory.get", block_key="k0",
                      **{"user_id": USERS[0]})
        assert tagged.status_code == 200

        background.append(_start("jobs.worker", env, logs["worker"]))
        background.append(_start("jobs.scheduler", env, logs["scheduler"]))

        def scrape() -> dict:
            answer = session.get(f"{web.url}/metrics", timeout=10)
            assert answer.status_code == 200
            return samples(answer.text)

        pass_label = {"pass": "structured_profile"}
        scraped = _wait_for(
            lambda: (s := scrape()) and value(s, "loom_builds_total", outcome="built") == 2 and s,
            90, "the scheduled pass to build both users")
        scraped = _wait_for(
            lambda: (s := scrape()) and value(s, "loom_passes_total", **pass_label) >= 1 and s,
            30, "the pass to be counted")
        model_calls = [r for r in model.requests if r.path.endswith("/chat/completions")]
        assert len(model_calls) == 2
        for _ in range(6):  # whichever gunicorn worker answers, the sums are the same
            scraped = scrape()
            assert value(scraped, "loom_http_requests_total", op="working_memory.set",
                         status="200") == 5
            assert value(scraped, "loom_http_requests_total", op="working_memory.get",
                         status="422") == 3
            assert value(scraped, "loom_http_requests_total", op="working_memory.get",
                         status="200") == 1
            assert value(scraped, "loom_http_requests_total", op="memory.set",
                         status="200") == 2
            assert value(scraped, "loom_http_request_duration_seconds_count",
                         op="working_memory.set") == 5
            assert value(scraped, "loom_builds_total", outcome="built") == 2
            assert value(scraped, "loom_model_calls_total", org="default") == 2
            assert value(scraped, "loom_model_prompt_tokens_total", org="default") > 0
            assert value(scraped, "loom_pass_duration_seconds_count", **pass_label) == value(
                scraped, "loom_passes_total", **pass_label)
        assert value(scraped, "loom_workers_alive", queue="loom-builds") == 1
        assert value(scraped, "loom_schedulers_alive") == 1
        assert value(scraped, "loom_queue_depth", queue="loom-builds") == 0
        assert value(scraped, "loom_scheduled_jobs") >= 1
        assert value(scraped, "loom_lease_held", lease="structured_profile") == 0

        # Every process's lines are JSON with Loom's fields, and no raw user id anywhere.
        for process in background:
            _stop(process)
        background.clear()
        web_lines = _json_lines(logs["web"])
        for line in web_lines:
            assert {"time", "level", "logger", "message"} <= set(line), line
        access = [line for line in web_lines if line["logger"] == "loom.access"]
        sets = [line for line in access if line.get("op") == "working_memory.set"]
        assert len(sets) == 5
        assert all(line["status"] == 200 and line["org"] == "default"
                   and line["namespace"] == "support" and len(line["request_id"]) == 32
                   and line["duration_ms"] >= 0 for line in sets)
        assert any(line["logger"].startswith("gunicorn") for line in web_lines)
        worker_lines = _json_lines(logs["worker"])
        in_pass = [line for line in worker_lines
                   if line.get("function") == "jobs.structured_profile.run_pass"]
        assert any(line["logger"] == "loom.jobs.structured_profile" and line["level"] == "INFO"
                   for line in in_pass), "Loom's own INFO line from the pass"
        assert all(line.get("job_id") for line in in_pass)
        assert any(line["logger"].startswith("rq.") for line in worker_lines)
        scheduler_lines = _json_lines(logs["scheduler"])
        assert any(line["logger"].startswith("rq_scheduler") for line in scheduler_lines)
        for name, path in logs.items():
            text = path.read_text()
            for user in USERS:
                assert user not in text, f"{name} logged a raw user id"
            assert TEST_SECRET not in text

        # Readiness follows Redis down and back.
        assert session.get(f"{web.url}/readyz", timeout=5).status_code == 200
        server.stop()
        down = session.get(f"{web.url}/readyz", timeout=5)
        assert down.status_code == 503
        assert down.json()["error"]["failing"] == ["redis", "queue_redis"]
        assert session.get(f"{web.url}/healthz", timeout=5).status_code == 200
        server = RedisServerProcess(tmp_path / "redis", port=redis_port,
                                    appendonly=False).start()
        _wait_for(lambda: session.get(f"{web.url}/readyz", timeout=5).status_code == 200,
                  15, "/readyz to answer 200 again")
    finally:
        for process in background:
            _stop(process)
        web.stop()
        model.close()
        server.stop()
