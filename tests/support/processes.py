"""Loom's own processes (``python -m jobs.worker``, ``python -m jobs.scheduler``) started for
end-to-end tests, each writing to a log file, stopped with SIGTERM and dying with the test run;
and the whole structured-profile stack (web, scheduler, worker, scripted model) the live tests
of the structured worker share."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import redis

from app.local import die_with_parent
from tests.support.live_server import LiveServer
from tests.support.model_server import ScriptedModelServer

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def loom_env(**env: str) -> dict[str, str]:
    """The test run's environment without any Redis or metrics setting of its own, plus ``env``
    and the worktree on the path."""
    base = {key: val for key, val in os.environ.items()
            if key not in ("PROMETHEUS_MULTIPROC_DIR", "REDIS_URL", "LOOM_QUEUE_URL")}
    return {**base, "PYTHONPATH": str(ROOT), **env}


def start(module: str, env: dict[str, str], output: Path, *args: str) -> subprocess.Popen[bytes]:
    with output.open("ab") as log_file:
        return subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, env=env,
                                stdout=log_file, stderr=subprocess.STDOUT,
                                preexec_fn=die_with_parent)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_for(predicate: Callable[[], T], timeout: float, what: str, every: float = 0.1) -> T:
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


class StructuredStack:
    """A web process (gunicorn) and, once ``start_jobs`` is called, a scheduler and a worker,
    all on ``redis_url`` (flushed before and after) and a scripted model server answering with
    ``model_default``; ``settings`` are the ``LOOM_*`` settings of the run. Used as a context
    manager, it stops everything it started, in reverse order."""

    def __init__(self, redis_url: str, folder: Path, model_default: Any, secret: str, *,
                 workers: int, **settings: str) -> None:
        self.redis_url = redis_url
        self.folder = folder
        self.model = ScriptedModelServer(default=model_default)
        self.env = loom_env(
            REDIS_URL=redis_url, LOOM_SECRET_KEY=secret, LOOM_DATA_DIR=str(folder),
            LOOM_LLM_MODEL="scripted-model", **settings)
        self.workers = workers
        self.web: LiveServer | None = None
        self.jobs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> StructuredStack:
        redis.Redis.from_url(self.redis_url).flushdb()
        self.model.start()
        self.env["LOOM_LLM_BASE_URL"] = self.model.base_url
        try:
            self.web = LiveServer(self.env, workers=self.workers,
                                  output=self.folder / "web.log").start()
        except BaseException:
            self.model.close()
            raise
        return self

    @property
    def url(self) -> str:
        assert self.web is not None, "the stack is not started"
        return self.web.url

    def start_jobs(self) -> None:
        """The scheduler and one worker, logging into the stack's folder."""
        self.jobs = [start("jobs.scheduler", self.env, self.folder / "scheduler.log"),
                     start("jobs.worker", self.env, self.folder / "worker.log")]

    def __exit__(self, *exc: object) -> None:
        for process in self.jobs:
            stop(process)
        if self.web is not None:
            self.web.stop()
        self.model.close()
        redis.Redis.from_url(self.redis_url).flushdb()
