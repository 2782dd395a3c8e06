"""Loom's own processes (``python -m jobs.worker``, ``python -m jobs.scheduler``) started for
end-to-end tests, each writing to a log file, stopped with SIGTERM and dying with the test run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from app.local import die_with_parent

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
