"""Structured-profile throughput against RQ workers, as an ops team scales them: the Procfile's
``scheduler`` and N ``worker`` processes at the default interval, a model that takes 300 ms.

    .venv/bin/python bench/structured_workers.py [--users 60] [--facts 3] [--delay 0.3]
                                                 [--workers 1,3] [--caps 20,60] [--first]

What one run does, on its own redis-server (append-only off), or on ``REDIS_URL``'s, whose
database it flushes before each case (point it at a scratch server):

1. Starts the scripted model server of the tests (``tests/support/model_server.py``) on
   loopback; every call takes ``--delay`` seconds and the server counts the calls in flight.
2. For each per-pass cap (``LOOM_STRUCTURED_PROFILE_MAX_USERS_PER_PASS``) and worker count N:
   writes ``--users`` users with ``--facts`` facts each and sets the namespace's schema (the
   store code an API write runs), starts N ``python -m jobs.worker`` and waits until they have
   registered, then starts ``python -m jobs.scheduler`` (the interval left at its default,
   60 s, like every other setting) and times from that start to the last profile written.
   The scheduler's first tick runs a pass at once; the next come one interval apart.
3. Prints each case's wall time, the most model calls in flight, and per cap the speed-up of
   the most workers against one, measured in the same run. The verdict: at the cap raised to
   match the users, the most workers are at least ``--target`` (2.5) times faster.
4. ``--first``: the first profile at the default settings. One worker and the scheduler run
   with no schema set; once the scheduler's start-up pass has gone idle (it found no
   namespace, so the next pass waits the idle interval, 600 s), a schema and one user's facts
   are written, and the time to that user's profile is printed with its bound: one interval
   plus the build.

Start-up of the workers is not in the figures. Each case is timed from the scheduler's start
(its start-up, two or three seconds on a loaded machine, is in it, the same in every case) and
from its first tick (RQ's ``enqueued_at`` of the pass). The verdict reads the second: the
process's start-up is paid once in a deployment's life, not per backlog.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from rq import Worker  # noqa: E402
from rq.exceptions import NoSuchJobError  # noqa: E402
from rq.job import Job  # noqa: E402

from app.local import die_with_parent  # noqa: E402
from app.services import Services  # noqa: E402
from app.settings import load_settings  # noqa: E402
from app.store import keys  # noqa: E402
from app.store.memory import Content, Location, MemoryStore  # noqa: E402
from app.store.profile_schema import ProfileSchemaStore  # noqa: E402
from bench import results  # noqa: E402
from bench.fanout import SCHEMA, SlowModel, job_env, redis_for_bench  # noqa: E402
from jobs.periodic import Periodic  # noqa: E402
from jobs.queues import PASSES  # noqa: E402
from jobs.structured_profile import PASS_FUNC  # noqa: E402
from tests.support.model_server import ScriptedModelServer  # noqa: E402

ORG = "default"
AGENT = "chat"
DEFAULT_INTERVAL = 60


class Case:
    """One redis-server, the model, and the processes of one case."""

    def __init__(self, redis_url: str, workdir: Path, model: ScriptedModelServer) -> None:
        self.redis_url = redis_url
        self.workdir = workdir
        self.secret = secrets.token_hex(32)
        self.probe = redis.Redis.from_url(redis_url, decode_responses=True)
        self.base_env = job_env(redis_url, self.secret, workdir, model.base_url)
        self.processes: list[subprocess.Popen[bytes]] = []

    def services(self, env: dict[str, str]) -> Services:
        settings = load_settings(environ={k: v for k, v in env.items()
                                          if k.startswith("LOOM_")},
                                 overrides={"redis_url": self.redis_url,
                                            "secret_key": self.secret,
                                            "data_dir": str(self.workdir / "loom")})
        return Services(settings)

    def start(self, module: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (self.workdir / f"{module}.log").open("ab") as log:
            process = subprocess.Popen([sys.executable, "-m", module], cwd=ROOT, env=env,
                                       stdout=log, stderr=subprocess.STDOUT,
                                       preexec_fn=die_with_parent)
        self.processes.append(process)
        return process

    def start_workers(self, n: int, env: dict[str, str], svc: Services) -> None:
        for _ in range(n):
            self.start("jobs.worker", env)
        deadline = time.monotonic() + 120
        while len(Worker.all(connection=svc.queue_redis)) < n:
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not register: see the workers' log")
            time.sleep(0.1)

    def stop(self) -> None:
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes = []

    def seed(self, svc: Services, namespace: str, users: int, facts: int) -> None:
        memory = svc.store(MemoryStore)
        for i in range(users):
            for j in range(facts):
                memory.set(Location(ORG, namespace, f"u{i:04d}", AGENT, "-", f"fact-{j}"),
                           Content(memory_type="semantic", value=f"User {i} fact {j}",
                                   actor=AGENT),
                           written_by=AGENT)

    def built(self, namespace: str) -> int:
        return int(self.probe.scard(keys.structured_users(ORG, namespace)))


def wait_until(check: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def run_case(case: Case, model: SlowModel, *, users: int, facts: int, workers: int,
             cap: int) -> dict[str, Any]:
    case.probe.flushdb()
    env = {**case.base_env, "LOOM_STRUCTURED_PROFILE_MAX_USERS_PER_PASS": str(cap)}
    svc = case.services(env)
    namespace = f"bench-sw-{cap}-{workers}"
    case.seed(svc, namespace, users, facts)
    svc.store(ProfileSchemaStore).set(ORG, namespace, SCHEMA, "bench")
    try:
        case.start_workers(workers, env, svc)
        model.reset()
        began = time.time()
        case.start("jobs.scheduler", env)
        ticked = first_tick(svc)
        wait_until(lambda: case.built(namespace) >= users, 20 * DEFAULT_INTERVAL,
                   f"{users} profiles")
        ended = time.time()
    finally:
        case.stop()
    return {"cap": cap, "workers": workers, "wall": ended - began, "from_tick": ended - ticked,
            "max_in_flight": model.max_in_flight, "calls": model.calls}


def first_tick(svc: Services) -> float:
    """When the scheduler enqueued its first pass (RQ's enqueued_at, wall clock)."""
    job_id = Periodic(PASS_FUNC, PASSES, DEFAULT_INTERVAL).job_id
    found: list[float] = []

    def enqueued() -> bool:
        with contextlib.suppress(NoSuchJobError):
            at = Job.fetch(job_id, connection=svc.queue_redis).enqueued_at
            if at is not None:
                found.append(at.replace(tzinfo=UTC).timestamp())
        return bool(found)

    wait_until(enqueued, 120, "the scheduler's first tick")
    return found[0]


def first_profile(case: Case, model: SlowModel, facts: int) -> dict[str, float]:
    """Default settings, one worker; the schema and a user's facts come after an idle pass."""
    case.probe.flushdb()
    env = dict(case.base_env)
    svc = case.services(env)
    namespace = "bench-sw-first"
    try:
        case.start_workers(1, env, svc)
        case.start("jobs.scheduler", env)
        job_key = f"rq:job:{Periodic(PASS_FUNC, PASSES, DEFAULT_INTERVAL).job_id}"
        # The start-up pass ran and found no namespace: the next pass waits the idle interval.
        wait_until(lambda: case.probe.exists(keys.worker_next_pass("structured_profile")),
                   120, "the start-up pass")
        assert case.probe.exists(job_key)
        time.sleep(DEFAULT_INTERVAL / 3)  # a third of the way to the next tick
        model.reset()
        began = time.perf_counter()
        svc.store(ProfileSchemaStore).set(ORG, namespace, SCHEMA, "bench")
        case.seed(svc, namespace, 1, facts)
        wait_until(lambda: case.built(namespace) >= 1, 15 * DEFAULT_INTERVAL, "the profile")
        wall = time.perf_counter() - began
    finally:
        case.stop()
    return {"wall": wall, "calls": model.calls}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=60, help="users to build (60)")
    parser.add_argument("--facts", type=int, default=3, help="facts per user (3)")
    parser.add_argument("--delay", type=float, default=0.3,
                        help="seconds each model call takes (0.3)")
    parser.add_argument("--workers", default="1,3", help="worker counts (1,3)")
    parser.add_argument("--caps", default="20,60",
                        help="per-pass caps: the default and one raised to match (20,60)")
    parser.add_argument("--target", type=float, default=2.5,
                        help="speed-up the most workers must reach at the largest cap (2.5)")
    parser.add_argument("--first", action="store_true",
                        help="also time a first profile at the default settings")
    parser.add_argument("--strict", action="store_true", help="exit 1 when the verdict fails")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.workers.split(",") if n.strip()]
    caps = [int(n) for n in args.caps.split(",") if n.strip()]

    slow = SlowModel(args.delay)
    rows = []
    with tempfile.TemporaryDirectory(prefix="loom-bench-") as tmp, \
            redis_for_bench(Path(tmp)) as redis_url, \
            ScriptedModelServer(default=slow) as model:
        case = Case(redis_url, Path(tmp), model)
        at_start = results.machine(results.server_at(redis_url))
        print(f"{args.users} users x {args.facts} facts, a model call takes {args.delay:.2f} s, "
              f"the default interval ({DEFAULT_INTERVAL} s), N workers on every queue")
        for cap in caps:
            for n in counts:
                row = run_case(case, slow, users=args.users, facts=args.facts, workers=n,
                               cap=cap)
                rows.append(row)
                print(f"  cap {cap:>3}, N={n}: all ready {row['wall']:.1f} s after the "
                      f"scheduler's start, {row['from_tick']:.1f} s after its first tick, "
                      f"max {row['max_in_flight']} builds at once, {row['calls']} model calls")
        first = first_profile(case, slow, args.facts) if args.first else None
    print("\nSpeed-up to all ready, most workers against N=1, same run")
    verdict_ratio = None
    for cap in caps:
        by_n = {r["workers"]: r for r in rows if r["cap"] == cap}
        if 1 in by_n and len(by_n) > 1:
            most = max(by_n)
            ratio = by_n[1]["wall"] / by_n[most]["wall"]
            from_tick = by_n[1]["from_tick"] / by_n[most]["from_tick"]
            print(f"  cap {cap}: N={most} {ratio:.2f}x from the scheduler's start, "
                  f"{from_tick:.2f}x from its first tick")
            if cap == max(caps):
                verdict_ratio = from_tick
    if first is not None:
        print(f"\nFirst profile at the default settings, schema and facts written after an "
              f"idle pass: {first['wall']:.1f} s (bound: one interval, {DEFAULT_INTERVAL} s, "
              f"plus the build)")
    ok = verdict_ratio is not None and verdict_ratio >= args.target
    verdict = (("OK: " if ok else "NOT OK: ")
               + f"from the first tick at cap {max(caps)}, {max(counts)} workers "
               + (f"{verdict_ratio:.2f}x" if verdict_ratio is not None else "not measured")
               + f" against 1 (target {args.target}x)")
    print(verdict)
    figures = {
        f"cap {r['cap']}, N={r['workers']}": (
            f"all ready {r['from_tick']:.1f} s after the first tick ({r['wall']:.1f} s after "
            f"the scheduler's start), {r['max_in_flight']} builds at once")
        for r in rows}
    if first is not None:
        figures["first profile at the defaults"] = (
            f"{first['wall']:.1f} s (bound: one interval, {DEFAULT_INTERVAL} s, plus the build)")
    figures["verdict"] = verdict
    results.record(
        "structured_workers",
        f"{args.users} users of {args.facts} facts built by the Procfile's scheduler and N "
        f"worker processes at the default interval, against a scripted model whose every call "
        f"takes {args.delay:.2f} s; time to every profile ready.",
        figures, at_start["redis"], at_start)
    return 1 if args.strict and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
