"""Structured-profile passes in the running system: gunicorn, ``python -m jobs.scheduler``,
``python -m jobs.worker`` processes and a slow scripted model on loopback (seed 000, Passes).

Each test starts its own processes against the suite's Redis with short
LOOM_STRUCTURED_PROFILE_* timings, writes facts through the HTTP API, and reads what
``profile.structured`` answers and what the model was asked. The model answers after a fixed
delay and counts the calls in flight, so concurrency is measured where it costs: at the model.
With a long pass interval the scheduler runs one pass at start; a test enqueues the next one
itself, as the scheduler would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from rq import Queue, Worker

from app.local import die_with_parent
from app.store import keys
from jobs.queues import BUILDS, MAINTENANCE, PASSES
from jobs.structured_profile import LEASE, PASS_FUNC
from tests.conftest import TEST_SECRET
from tests.support.live_server import LiveServer
from tests.support.model_server import ScriptedModelServer
from tests.test_structured_worker import SCHEMA

pytestmark = [pytest.mark.real, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
NS = {"namespace": "support", "agent": "chat"}
ALL_QUEUES: tuple[str, ...] = ()  # a worker with no --queues listens on every queue


class SlowModel:
    """The model's default answer: after ``delay(call_number)`` seconds, a profile naming the
    user the facts are about. Records each call's user, start and end."""

    def __init__(self, users: list[str], delay: Callable[[int], float],
                 name: Callable[[int], str] = lambda n: "Built") -> None:
        self.users = users
        self.delay = delay
        self.name = name
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls: list[dict[str, Any]] = []

    def __call__(self, body: Any) -> dict[str, Any]:
        text = body["messages"][-1]["content"]
        user = next((u for u in self.users if f"I am {u}." in text), "?")
        with self.lock:
            number = len(self.calls)
            call = {"user": user, "start": time.time(), "end": None}
            self.calls.append(call)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        time.sleep(self.delay(number))
        with self.lock:
            self.in_flight -= 1
            call["end"] = time.time()
        return {"preferred_name": self.name(number), "timezone": None, "languages": None}

    def users_called(self) -> list[str]:
        with self.lock:
            return [call["user"] for call in self.calls]


class Stack:
    """Web, workers and scheduler as real processes; stopped (SIGTERM) on exit."""

    def __init__(self, tmp_path: Path, redis_url: str, model: ScriptedModelServer,
                 **settings: int) -> None:
        self.tmp_path = tmp_path
        self.redis = redis.Redis.from_url(redis_url, decode_responses=True)
        self.queue_redis = redis.Redis.from_url(redis_url)
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "REDIS_URL": redis_url,
            "LOOM_SECRET_KEY": TEST_SECRET,
            "LOOM_DATA_DIR": str(tmp_path / "data"),
            "LOOM_LLM_BASE_URL": model.base_url,
            "LOOM_LLM_MODEL": "scripted-model",
            "LOOM_STRUCTURED_PROFILE_INTERVAL_SECONDS": "3600",
            "LOOM_STRUCTURED_PROFILE_IDLE_INTERVAL_SECONDS": "3600",
            "LOOM_STRUCTURED_PROFILE_COOLDOWN_SECONDS": "0",
            **{f"LOOM_STRUCTURED_PROFILE_{name.upper()}": str(value)
               for name, value in settings.items()},
        }
        self.env.pop("LOOM_QUEUE_URL", None)
        self.web = LiveServer(self.env, workers=1, output=tmp_path / "web.log")
        self.processes: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Stack:
        self.web.start(timeout=60)
        return self

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
        self.redis.close()
        self.queue_redis.close()

    def _start(self, name: str, *args: str) -> None:
        log = (self.tmp_path / f"{name}-{len(self.processes)}.log").open("ab")
        self.processes.append(subprocess.Popen(
            [sys.executable, "-m", *args], cwd=ROOT, env=self.env, stdout=log,
            stderr=subprocess.STDOUT, preexec_fn=die_with_parent))
        log.close()

    def start_workers(self, *queue_sets: tuple[str, ...]) -> None:
        for queues in queue_sets:
            extra = ["--queues", ",".join(queues)] if queues else []
            self._start("worker", "jobs.worker", *extra)
        until(lambda: len(Worker.all(connection=self.queue_redis)) >= len(queue_sets), 90,
              "the workers registering", self)

    def start_scheduler(self) -> None:
        self._start("scheduler", "jobs.scheduler")

    def logs(self) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text()[-3000:]}"
                         for path in sorted(self.tmp_path.glob("*.log")))

    def alive(self) -> None:
        for process in self.processes:
            assert process.poll() is None, f"{process.args} exited\n{self.logs()}"

    def post(self, op: str, **body: Any) -> dict[str, Any]:
        answer = requests.post(f"{self.web.url}/v1/{op}", json={**NS, **body}, timeout=30)
        assert answer.status_code == 200, (op, answer.text)
        return answer.json()

    def facts(self, users: list[str], text: str = "I am {user}.") -> None:
        for user in users:
            self.post("memory.set", user_id=user, key="name", value=text.format(user=user),
                      memory_type="semantic")

    def statuses(self, users: list[str]) -> list[str]:
        return [self.post("profile.structured", user_id=user)["status"] for user in users]

    def lease_held(self) -> bool:
        return bool(self.redis.exists(keys.worker_lease(LEASE)))

    def pass_started_at(self) -> float:
        return float(self.redis.hget(keys.worker_lease_acquired(LEASE), "at") or 0)

    def wait_pass_over(self, model: SlowModel, timeout: float = 90) -> None:
        """Until a pass has called the model and let its lease go (the closing job ran)."""
        until(lambda: model.calls and not self.lease_held(), timeout, "the pass to end", self)

    def enqueue_pass(self) -> None:
        Queue(PASSES, connection=self.queue_redis).enqueue(PASS_FUNC, kwargs={"force": True})


def until(condition: Callable[[], Any], timeout: float, what: str, stack: Stack) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        stack.alive()
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{stack.logs()}"
        time.sleep(0.2)


def users(n: int) -> list[str]:
    return [f"u-{i}" for i in range(n)]


def start(stack: Stack, everyone: list[str], *workers: tuple[str, ...]) -> None:
    stack.post("profile_schema.set", json_schema=SCHEMA)
    stack.facts(everyone)
    stack.start_workers(*workers)
    stack.start_scheduler()


def test_a_slow_pass_stops_taking_users_at_half_time_and_the_next_pass_builds_the_rest(
    tmp_path, redis_url
):
    everyone = users(4)
    slow = SlowModel(everyone, delay=lambda n: 4.0)
    # 13 s a pass, so no user is taken from 6.5 s on: two 4 s builds start in time, the third
    # would start at about 8 s.
    with ScriptedModelServer(default=slow) as model, \
            Stack(tmp_path, redis_url, model, max_pass_seconds=13) as stack:
        start(stack, everyone, ALL_QUEUES)
        stack.wait_pass_over(slow)
        assert slow.users_called() == everyone[:2]
        assert stack.statuses(everyone) == ["ready", "ready", "pending", "pending"]

        stack.enqueue_pass()
        until(lambda: stack.statuses(everyone) == ["ready"] * 4, 90, "the rest built", stack)
        assert slow.users_called() == everyone  # the rest were taken first, each once
        assert slow.max_in_flight == 1


def test_builds_in_flight_at_half_time_finish_and_are_not_backed_off(tmp_path, redis_url):
    everyone = users(4)
    slow = SlowModel(everyone, delay=lambda n: 4.0 if n < 4 else 0.1)
    # Two workers, 13 s a pass (half time 6.5 s): the second pair of 4 s builds starts at about
    # 4.5 s and is still at the model at half time.
    with ScriptedModelServer(default=slow) as model, \
            Stack(tmp_path, redis_url, model, max_pass_seconds=13,
                  scan_max_age_seconds=1) as stack:
        start(stack, everyone, ALL_QUEUES, ALL_QUEUES)
        stack.wait_pass_over(slow)
        half_time = stack.pass_started_at() + 6.5
        in_flight = [c["user"] for c in slow.calls
                     if c["start"] < half_time < (c["end"] or float("inf"))]
        assert sorted(in_flight) == everyone[2:], (slow.calls, half_time)
        assert stack.statuses(everyone) == ["ready"] * 4  # they finished in the second half
        assert stack.post("usage.get")["failures"] == 0

        # Recorded as built, not failed: a change is rebuilt by the next pass (its scan is over a
        # second old, so it scans again), with no 300 s backoff in the way.
        stack.facts(everyone[2:], text="I am {user}. Really.")
        stack.enqueue_pass()
        until(lambda: len(slow.calls) == 6, 60, "the changed users rebuilt", stack)
        until(lambda: stack.statuses(everyone) == ["ready"] * 4, 30, "ready again", stack)
        assert sorted(slow.users_called()[4:]) == everyone[2:]


def test_a_build_running_past_the_limit_is_abandoned_without_writing(tmp_path, redis_url):
    everyone = users(1)
    slow = SlowModel(everyone, delay=lambda n: 20.0 if n == 0 else 0.1,
                     name=lambda n: "Too late" if n == 0 else "On time")
    with ScriptedModelServer(default=slow) as model, \
            Stack(tmp_path, redis_url, model, max_pass_seconds=6) as stack:
        start(stack, everyone, ALL_QUEUES)
        stack.wait_pass_over(slow, timeout=60)
        out = stack.post("profile.structured", user_id=everyone[0])
        assert out["status"] == "pending" and out["version"] == 0
        assert stack.post("usage.get")["failures"] == 0

        stack.enqueue_pass()  # listed again at once, no backoff
        until(lambda: stack.statuses(everyone) == ["ready"], 30, "the retry", stack)
        out = stack.post("profile.structured", user_id=everyone[0])
        assert out["profile"]["preferred_name"] == "On time"
        history = stack.post("memory.history", user_id=everyone[0], key="structured_profile",
                             agent="-")
        assert len(history["versions"]) == 1
        assert len(slow.calls) == 2


def test_a_second_pass_never_builds_beside_a_slow_first_one(tmp_path, redis_url):
    everyone = users(3)
    slow = SlowModel(everyone, delay=lambda n: 5.0)
    # Passes every 5 s on two pass workers, one builds-only worker, 5 s model calls, 8 s a
    # pass: a pass outlives the scheduler's interval, and the next pass finds it still holding
    # the lease; each pass takes one user (the second would start after half time).
    with ScriptedModelServer(default=slow) as model, \
            Stack(tmp_path, redis_url, model, max_pass_seconds=8, interval_seconds=5,
                  idle_interval_seconds=5) as stack:
        start(stack, everyone, (PASSES, MAINTENANCE), (PASSES, MAINTENANCE), (BUILDS,))
        until(lambda: stack.statuses(everyone) == ["ready"] * 3, 120, "every user", stack)
        assert slow.max_in_flight == 1
        assert sorted(slow.users_called()) == everyone  # each built once


@pytest.mark.parametrize("workers", [2, 3])
def test_n_workers_make_n_builds_at_once(tmp_path, redis_url, workers):
    everyone = users(2 * workers)
    slow = SlowModel(everyone, delay=lambda n: 2.0)
    with ScriptedModelServer(default=slow) as model, \
            Stack(tmp_path, redis_url, model, max_pass_seconds=120) as stack:
        start(stack, everyone, *[ALL_QUEUES] * workers)
        until(lambda: stack.statuses(everyone) == ["ready"] * len(everyone), 90, "every user",
              stack)
        # The pass job does not hold a worker while its builds run: every worker builds.
        assert slow.max_in_flight == workers
        assert sorted(slow.users_called()) == sorted(everyone)
