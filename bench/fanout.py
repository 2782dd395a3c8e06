"""Structured-profile builds fan out: N RQ workers make N builds at once.

    .venv/bin/python bench/fanout.py [--users 8] [--delay 0.5] [--workers 1,2,4] [--builders]

What one run does:

1. Starts its own redis-server on a free loopback port (append-only off), unless REDIS_URL is
   set (then it flushes nothing and writes under the namespace ``bench-fanout-<run>``; point it
   at a scratch server with no worker running).
2. Starts the scripted model server of the tests (``tests/support/model_server.py``) on
   loopback. Every call takes ``--delay`` seconds, like a model that is slow to answer, and
   the server counts the calls in flight at once.
3. For each worker count N: seeds ``--users`` users with a fact each (the same store code an
   API write runs), starts N ``python -m jobs.worker`` processes (the Procfile's ``worker``,
   scaled to N; with ``--builders``, one worker for the passes queue and N builds-only
   workers, ``python -m jobs.worker --queues loom-builds``), enqueues one pass as the
   scheduler does, and waits for every profile to be built. It prints the most calls the
   model saw at once, the wall time from the enqueue to the last build and the builds per
   second, then stops the workers.
4. Prints the throughput of each N as a ratio to N = 1, measured in the same run, and a
   one-line verdict: the most calls in flight must equal N.

A worker starts (imports, registers with RQ) before the pass is enqueued, so start-up is not
in the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from rq import Queue, Worker  # noqa: E402

from app.local import RedisServerProcess, die_with_parent  # noqa: E402
from app.services import Services  # noqa: E402
from app.settings import load_settings  # noqa: E402
from app.store import keys  # noqa: E402
from app.store.memory import Content, Location, MemoryStore  # noqa: E402
from app.store.profile_schema import ProfileSchemaStore  # noqa: E402
from bench import results  # noqa: E402
from jobs.queues import BUILDS, PASSES  # noqa: E402
from jobs.structured_profile import LEASE, PASS_FUNC  # noqa: E402
from tests.support.model_server import ScriptedModelServer  # noqa: E402

ORG = "default"
AGENT = "chat"
SCHEMA = {
    "type": "object",
    "properties": {
        "preferred_name": {"type": "string", "description": "What the user asks to be called"},
    },
}


class SlowModel:
    """Answers after a fixed delay; counts the calls in flight."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls = 0

    def reset(self) -> None:
        with self.lock:
            self.in_flight = self.max_in_flight = self.calls = 0

    def __call__(self, body: Any) -> dict[str, Any]:
        with self.lock:
            self.calls += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        time.sleep(self.delay)
        with self.lock:
            self.in_flight -= 1
        return {"preferred_name": "Built"}


@contextlib.contextmanager
def redis_for_bench(workdir: Path) -> Iterator[str]:
    given = os.environ.get("REDIS_URL")
    if given:
        yield given
        return
    server = RedisServerProcess(workdir / "redis", appendonly=False).start()
    try:
        yield server.url
    finally:
        server.stop()


def job_env(redis_url: str, secret: str, workdir: Path, model_url: str) -> dict[str, str]:
    """The environment of a bench's worker and scheduler processes: this checkout, the bench's
    Redis (data and queues alike) and the scripted model."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "REDIS_URL": redis_url,
        "LOOM_SECRET_KEY": secret,
        "LOOM_DATA_DIR": str(workdir / "loom"),
        "LOOM_LLM_BASE_URL": model_url,
        "LOOM_LLM_MODEL": "scripted-model",
        "LOOM_LOG_FORMAT": "text",
    }
    env.pop("LOOM_QUEUE_URL", None)
    return env


class Run:
    def __init__(self, args: argparse.Namespace, redis_url: str, workdir: Path,
                 model: ScriptedModelServer) -> None:
        self.args = args
        self.redis_url = redis_url
        self.workdir = workdir
        self.secret = secrets.token_hex(32)
        self.run = secrets.token_hex(3)
        settings = load_settings(environ={}, overrides={
            "redis_url": redis_url, "secret_key": self.secret,
            "data_dir": str(workdir / "loom")})
        self.services = Services(settings)
        self.probe = redis.Redis.from_url(redis_url, decode_responses=True)
        self.env = job_env(redis_url, self.secret, workdir, model.base_url)
        self.env["LOOM_STRUCTURED_PROFILE_MAX_USERS_PER_PASS"] = str(max(20, args.users))

    def seed(self, namespace: str) -> None:
        self.services.store(ProfileSchemaStore).set(ORG, namespace, SCHEMA, "bench")
        memory = self.services.store(MemoryStore)
        for i in range(self.args.users):
            memory.set(Location(ORG, namespace, f"u{i:04d}", AGENT, "-", "name"),
                       Content(memory_type="semantic", value=f"Call me User {i}", actor=AGENT),
                       written_by=AGENT)

    def built(self, namespace: str) -> int:
        return int(self.probe.scard(keys.structured_users(ORG, namespace)))

    def workers(self, n: int) -> list[subprocess.Popen[bytes]]:
        lines = [[]] * n
        if self.args.builders:
            lines = [["--queues", PASSES]] + [["--queues", BUILDS]] * n
        log = (self.workdir / "workers.log").open("ab")
        started = [subprocess.Popen([sys.executable, "-m", "jobs.worker", *line], cwd=ROOT,
                                    env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    preexec_fn=die_with_parent) for line in lines]
        log.close()
        deadline = time.monotonic() + 60
        while len(Worker.all(connection=self.services.queue_redis)) < len(lines):
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not register: see "
                                   + str(self.workdir / "workers.log"))
            time.sleep(0.1)
        return started

    def measure(self, n: int, model: SlowModel) -> dict[str, float]:
        namespace = f"bench-fanout-{self.run}-{n}"
        previous = [m for m in self.services.store(ProfileSchemaStore).namespaces()]
        for org, other in previous:
            self.services.store(ProfileSchemaStore).clear(org, other)
        self.seed(namespace)
        started = self.workers(n)
        try:
            model.reset()
            began = time.perf_counter()
            Queue(PASSES, connection=self.services.queue_redis).enqueue(
                PASS_FUNC, kwargs={"force": True})
            deadline = time.monotonic() + 120
            while self.built(namespace) < self.args.users:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"N={n}: only {self.built(namespace)} built")
                time.sleep(0.02)
            wall = time.perf_counter() - began
            while self.probe.exists(keys.worker_lease(LEASE)):  # the closing job
                time.sleep(0.02)
        finally:
            for process in started:
                process.send_signal(signal.SIGTERM)
            for process in started:
                process.wait(timeout=30)
        return {"workers": n, "max_in_flight": model.max_in_flight, "calls": model.calls,
                "wall": wall, "rate": self.args.users / wall}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=8, help="users to build per run (8)")
    parser.add_argument("--delay", type=float, default=0.5,
                        help="seconds each model call takes (0.5)")
    parser.add_argument("--workers", default="1,2,4", help="worker counts to run (1,2,4)")
    parser.add_argument("--builders", action="store_true",
                        help="one passes worker and N builds-only workers, instead of N workers "
                             "on every queue")
    parser.add_argument("--strict", action="store_true", help="exit 1 when the verdict fails")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.workers.split(",") if n.strip()]

    slow = SlowModel(args.delay)
    rows = []
    with tempfile.TemporaryDirectory(prefix="loom-bench-") as tmp, \
            redis_for_bench(Path(tmp)) as redis_url, \
            ScriptedModelServer(default=slow) as model:
        run = Run(args, redis_url, Path(tmp), model)
        redis_name = results.server_name(redis.Redis.from_url(redis_url).info("server"))
        at_start = results.machine(redis_name)
        shape = ("1 passes worker + N builds-only workers" if args.builders
                 else "N workers on every queue")
        print(f"{args.users} users, a model call takes {args.delay:.2f} s, {shape}")
        for n in counts:
            rows.append(run.measure(n, slow))
            row = rows[-1]
            print(f"  N={n}: max {row['max_in_flight']} builds at once, {row['calls']} model "
                  f"calls, {row['wall']:.2f} s, {row['rate']:.2f} builds/s "
                  f"(ideal {args.users * args.delay / n:.2f} s)")
    base = next((r for r in rows if r["workers"] == 1), rows[0])
    print("\nThroughput against N=" + str(base["workers"]) + " in this run")
    for row in rows:
        print(f"  N={row['workers']}: {row['rate'] / base['rate']:.2f}x")
    ok = all(r["max_in_flight"] == min(r["workers"], args.users) for r in rows)
    verdict = ("N workers make N builds at once" if ok else
               "the builds in flight did not follow the workers: "
               + ", ".join(f"N={r['workers']}: {r['max_in_flight']}" for r in rows))
    print(("OK: " if ok else "NOT OK: ") + verdict)
    shape = "builds-only workers" if args.builders else "workers on every queue"
    figures = {
        f"N={row['workers']} {shape}": (
            f"{row['max_in_flight']} builds at once, {row['wall']:.2f} s, "
            f"{row['rate']:.2f} builds/s ({row['rate'] / base['rate']:.2f}x N={base['workers']})")
        for row in rows}
    figures["verdict"] = verdict
    results.record(
        "fanout" + ("-builders" if args.builders else ""),
        f"{args.users} users built against a scripted model on loopback whose every call takes "
        f"{args.delay:.2f} s, with N RQ worker processes ({shape}); builds a second as a ratio "
        f"to one worker in the same run.", figures, redis_name, at_start)
    return 1 if args.strict and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
