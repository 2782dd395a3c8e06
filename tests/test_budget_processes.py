"""Budgets with the real processes: gunicorn, the scheduler and several RQ workers (builds fan
out, so reservations race), against the scripted model reporting usage over HTTP.

A namespace with a budget of N tokens stops within one build's estimate of N while another
namespace keeps building, and resumes when the rolling window moves; an org's budget caps its
namespaces together.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import requests
from rq import Queue

from app.local import die_with_parent
from app.model.chat import estimate_call_tokens
from jobs.queues import BUILDS
from tests.conftest import TEST_SECRET
from tests.support.live_server import LiveServer
from tests.support.model_server import ScriptedAnswer, ScriptedModelServer

pytestmark = [pytest.mark.real, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = {
    "type": "object",
    "properties": {
        "preferred_name": {"type": "string", "maxLength": 40,
                           "description": "What the user asks to be called"},
    },
}
WORKERS = 3


def _estimate(body: dict) -> int:
    schema = body.get("response_format", {}).get("json_schema", {}).get("schema")
    return estimate_call_tokens(body["messages"], body["max_tokens"], schema)


def _costs_its_estimate(body: dict) -> ScriptedAnswer:
    # The worst real usage a reservation allows for: exactly the estimate.
    return ScriptedAnswer(content={"preferred_name": "Sam"},
                          prompt_tokens=_estimate(body) - 5, completion_tokens=5)


class Stack:
    """The web, the scheduler and WORKERS workers over one Redis, with a short-interval pass."""

    def __init__(self, redis_url: str, tmp_path: Path, model: ScriptedModelServer,
                 window_seconds: int) -> None:
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "REDIS_URL": redis_url,
            "LOOM_SECRET_KEY": TEST_SECRET,
            "LOOM_DATA_DIR": str(tmp_path),
            "LOOM_LLM_BASE_URL": model.base_url,
            "LOOM_LLM_MODEL": "scripted-model",
            "LOOM_MODEL_BUDGET_WINDOW_SECONDS": str(window_seconds),
            "LOOM_STRUCTURED_PROFILE_INTERVAL_SECONDS": "1",
            "LOOM_STRUCTURED_PROFILE_IDLE_INTERVAL_SECONDS": "1",
            "LOOM_STRUCTURED_PROFILE_COOLDOWN_SECONDS": "0",
            "LOOM_STRUCTURED_PROFILE_SCAN_MAX_AGE_SECONDS": "1",
        }
        self.env.pop("LOOM_QUEUE_URL", None)
        self.tmp_path = tmp_path
        web_env = {k: v for k, v in self.env.items() if k.startswith(("LOOM_", "REDIS"))}
        self.web = LiveServer(web_env, workers=1, output=tmp_path / "web.log")
        self.processes: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Stack:
        self.web.start(timeout=60)
        for index in range(WORKERS):
            self._start("jobs.worker", f"worker-{index}.log")
        self._start("jobs.scheduler", "scheduler.log")
        return self

    def _start(self, module: str, log: str) -> None:
        self.processes.append(subprocess.Popen(
            [sys.executable, "-m", module], cwd=ROOT, env=self.env,
            stdout=(self.tmp_path / log).open("wb"), stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent))

    def __exit__(self, *exc: object) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.web.stop()

    def logs(self) -> str:
        return "\n".join(path.read_text(errors="replace")[-3000:]
                         for path in sorted(self.tmp_path.glob("*.log")))

    def call(self, op: str, **body: object) -> dict:
        for process in self.processes:
            assert process.poll() is None, f"{process.args} exited\n{self.logs()}"
        answer = requests.post(f"{self.web.url}/v1/{op}", json=body, timeout=10)
        assert answer.status_code == 200, (op, answer.text)
        return answer.json()

    def facts(self, namespace: str, users: list[str]) -> None:
        for user in users:
            self.call("memory.set", namespace=namespace, agent="chat", user_id=user, key="name",
                      value=f"Call me {user}", memory_type="semantic")

    def ready(self, namespace: str, users: list[str]) -> list[str]:
        return [user for user in users
                if self.call("profile.structured", namespace=namespace, agent="chat",
                             user_id=user)["status"] == "ready"]

    def wait_for(self, what: str, check, timeout: float = 120.0):
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            assert time.monotonic() < deadline, f"timed out waiting for {what}\n{self.logs()}"
            time.sleep(0.5)


@pytest.fixture
def model():
    with ScriptedModelServer(default=_costs_its_estimate) as server:
        yield server


def _one_estimate(model: ScriptedModelServer) -> int:
    return max(_estimate(request.body) for request in model.completion_requests)


def test_a_namespace_budget_stops_at_its_cap_others_go_on_and_it_resumes(
        redis_url, tmp_path, model):
    window = 25
    with Stack(redis_url, tmp_path, model, window_seconds=window) as stack:
        for namespace in ("support", "billing"):
            stack.call("profile_schema.set", namespace=namespace, json_schema=SCHEMA)
        stack.facts("billing", ["b-0"])
        stack.wait_for("the first billing build", lambda: stack.ready("billing", ["b-0"]))
        estimate = _one_estimate(model)
        cap = 2 * estimate + estimate // 2
        stack.call("budget.set", namespace="support", tokens=cap)

        support = [f"s-{i}" for i in range(6)]
        # Timed from before the first support reservation: while less than the window has
        # passed since here, none of them can have left the window.
        started = time.monotonic()
        stack.facts("support", support)
        stack.wait_for("support to run out of budget", lambda: stack.call(
            "usage.get", namespace="support")["deferred_for_budget"] >= 4)
        # Meanwhile billing, with no budget, keeps building.
        billing = [f"b-{i}" for i in range(1, 6)]
        stack.facts("billing", billing)
        stack.wait_for("billing to build meanwhile",
                       lambda: len(stack.ready("billing", billing)) == len(billing))
        elapsed = time.monotonic() - started
        budget = stack.call("budget.get", namespace="support")
        if elapsed < window - 5:
            # Still inside the window of the first builds: exactly two fit, and the cap holds
            # within one build's estimate.
            assert len(stack.ready("support", support)) == 2
            assert budget["spent_tokens"] <= cap
            assert cap - budget["spent_tokens"] < estimate
        usage = stack.call("usage.get", namespace="support")
        assert usage["failures"] == 0 and usage["builds"] <= 2 + 2 * (elapsed // window + 1)

        # The window moves past the first builds: the next ones are built.
        stack.wait_for("support to resume", lambda: len(stack.ready("support", support)) >= 4,
                       timeout=window * 3 + 60)
        assert stack.call("budget.get", namespace="support")["spent_tokens"] <= cap
        logs = stack.logs()
        # One line per namespace per window, not one per user.
        assert logs.count("default/support is out of its namespace budget") <= (
            (time.monotonic() - started) // window + 2)
        assert "billing is out of" not in logs
        # The builds ran as per-user jobs on several workers: their reservations raced.
        builds = Queue(BUILDS, connection=redis.Redis.from_url(redis_url))
        assert builds.finished_job_registry.count >= 6


def test_an_org_budget_caps_its_namespaces_together(redis_url, tmp_path, model):
    with Stack(redis_url, tmp_path, model, window_seconds=3600) as stack:
        for namespace in ("probe", "support", "billing"):
            stack.call("profile_schema.set", namespace=namespace, json_schema=SCHEMA)
        stack.facts("probe", ["p-0"])
        stack.wait_for("the probe build", lambda: stack.ready("probe", ["p-0"]))
        estimate = _one_estimate(model)
        spent = stack.call("budget.get", namespace="*")["spent_tokens"]
        cap = spent + 3 * estimate + estimate // 2
        stack.call("budget.set", namespace="*", tokens=cap)
        users = [f"u-{i}" for i in range(4)]
        stack.facts("support", users)
        stack.facts("billing", users)
        stack.wait_for("both namespaces to defer", lambda: all(
            stack.call("usage.get", namespace=ns)["deferred_for_budget"] > 0
            or len(stack.ready(ns, users)) == len(users) for ns in ("support", "billing"))
            and len(stack.ready("support", users)) + len(stack.ready("billing", users)) >= 3)
        time.sleep(3)  # a few more passes: nothing more may be built
        built = len(stack.ready("support", users)) + len(stack.ready("billing", users))
        assert built == 3
        org = stack.call("budget.get", namespace="*")
        assert org["spent_tokens"] <= cap and cap - org["spent_tokens"] < estimate
        assert org["remaining_tokens"] == cap - org["spent_tokens"]
