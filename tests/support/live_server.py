"""A real gunicorn serving ``wsgi:app`` on a free loopback port, for end-to-end tests.

It runs with the Procfile's configuration (``gunicorn.conf.py``: gevent workers unless
``worker_class`` says otherwise), so end-to-end tests see the web process as deployed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from app.local import die_with_parent, free_port
from tests.support.log_leaks import leaking_lines

ROOT = Path(__file__).resolve().parents[2]


class LiveServer:
    def __init__(self, env: dict[str, str], workers: int = 2,
                 extra_args: tuple[str, ...] = (), output: Path | None = None,
                 worker_class: str | None = None) -> None:
        self.port = free_port()
        # Every line gunicorn and the app write goes to a file: a pipe nobody reads would fill
        # and block the workers once they log a line per request.
        self.output = output or Path(tempfile.mkstemp(prefix="loom-gunicorn-", suffix=".log")[1])
        self.extra_args = extra_args
        # The SDK of this checkout, ahead of any copy pip installed: the web serves its MCP tools.
        self.env = {**os.environ, **env,
                    "PYTHONPATH": os.pathsep.join([str(ROOT / "sdk"), str(ROOT)])}
        self.workers = workers
        if worker_class is not None:
            self.env["LOOM_WEB_WORKER_CLASS"] = worker_class
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> LiveServer:
        log_file = self.output.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "gunicorn", "wsgi:app",
                "--config", str(ROOT / "gunicorn.conf.py"),
                "--bind", f"127.0.0.1:{self.port}",
                "--workers", str(self.workers),
                *self.extra_args,
            ],
            cwd=ROOT,
            env=self.env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
        log_file.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gunicorn exited: {self.output.read_text()[-4000:]}")
            try:
                requests.get(self.url + "/openapi.json", timeout=2)
                return self
            except (requests.ConnectionError, requests.Timeout):
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("gunicorn did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
            self.process = None
            # The suite runs every server with LOOM_VALIDATE_ANSWERS on: an answer that did not
            # match the OpenAPI document fails the test that caused it.
            mismatches = [line for line in self.output.read_text(errors="replace").splitlines()
                          if "answer contract violation" in line]
            assert mismatches == [], mismatches[:5]
            # And no line it wrote, to its output or a log file it was given, leaks an id or a
            # token.
            leaked = [line for path in self.log_files() for line in leaking_lines(path)]
            assert leaked == [], leaked[:5]

    def log_files(self) -> list[Path]:
        files = [self.output]
        for flag, value in zip(self.extra_args, self.extra_args[1:], strict=False):
            if flag in ("--access-logfile", "--error-logfile") and value != "-":
                files.append(Path(value))
        return files

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
