"""Working-memory get, set and append through gunicorn: Loom beside a bare Flask + redis-py app.

    .venv/bin/python bench/working_memory.py [--seconds 5] [--rounds 3] [--connections 8]

What one run does:

1. Starts its own redis-server on a free loopback port (append-only off), unless REDIS_URL is
   set. With REDIS_URL it writes only under the namespace ``bench``, but it does reset the
   server's statistics (CONFIG RESETSTAT).
2. Serves Loom (``wsgi:app``) and ``bench/baseline_app.py`` with the same gunicorn settings,
   2 gevent workers each, the Procfile's worker class (``--workers``, ``--worker-class``).
   Both serve every request through a Flask view. The baseline is what a bare Flask +
   redis-py app does on the same keys: the same HGET for get, and for set and append the
   classic WATCH/HGET/MULTI/EXEC loop where Loom runs one Lua script; nothing else.
3. Drives each op with a bounded load client on loopback: ``wrk`` when it is on PATH (one
   thread, N connections, a fixed duration), else a Python client in a separate process
   (N threads on raw HTTP/1.1 sockets). gevent workers keep the connection open; a sync
   worker closes it after each answer, and the clients then reconnect per request, for both
   apps alike.
4. Alternates the two apps, op by op, for several rounds, and prints the median req/s of each
   and the median of the per-round ratios loom/baseline (targets: get >= 0.8, set and append
   >= 2). Beside it, the CPU
   each party spent per request (gunicorn, redis-server, load client), read from /proc and
   INFO, and the ratio those predict while the cores are saturated.
5. Counts Redis round trips per request for every op of both apps: CONFIG RESETSTAT, K
   sequential requests, then one INFO; round trips are the server's read events
   (``total_reads_processed``) less the INFO's own, and the commands are ``INFO
   commandstats`` (which also counts the commands a script runs inside Redis).
6. Appends to ONE block from 8 concurrent writers, against 1 writer and against 8 writers on
   8 separate blocks, through Loom (one Lua script per append) and through the baseline's
   ``/wm/append`` (WATCH/HGET/MULTI/EXEC with retries). Each batch starts on fresh
   blocks of char_limit 16384 so none fills, and checks that the blocks hold every
   acknowledged addition exactly once. Prints rates, ratios (target >= 0.5), WATCH retries
   and round trips per append.

The load client, gunicorn and Redis all share the machine's cores; the script says how many
there are, and the load average at the start and the end. Absolute req/s therefore mean
little; the ratios measured in the same run are the result, and they move by a tenth when
other work shares the cores. ``bench/instructions.py`` counts the instructions each app spends
per request instead, a figure a busy machine does not move. ``--profile N`` adds N in-process
calls of each op straight into each WSGI app, timed (CPU and wall) and broken down by stage
with cProfile.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import pstats
import resource
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import requests  # noqa: E402

from app.local import RedisServerProcess, free_port  # noqa: E402
from app.store import keys  # noqa: E402
from bench import results  # noqa: E402
from bench.wsgi_call import call as wsgi_call  # noqa: E402

NAMESPACE = "bench"
AGENT = "bench"
ORG = "default"
SPREAD_BLOCKS = 64  # the throughput append spreads over this many blocks so none fills
CONTENDED_WRITERS = 8
CONTENDED_CHAR_LIMIT = 16384
# Per phase: additions are "<writer hex digit><n in base 36>" (2 to 4 characters) plus the
# separator, so 3200 of them fit a block of 16384 however they are split among writers.
CONTENDED_MAX_APPENDS = 3200
ROUND_TRIP_REQUESTS = 200
# Loom against the bare app: a read does the same Redis work and Loom's own (auth, schema,
# identity, the answer's shape) on top; a write is one script round trip against the bare
# app's three of WATCH/HGET/MULTI-EXEC.
TARGET_RATIOS = {"get": 0.8, "set": 2.0, "append": 2.0}
TARGET_CONTENDED = 0.5


def gunicorn_settings(workers: int, worker_class: str = "gevent") -> list[str]:
    """The same for both apps: the Procfile's worker class unless told otherwise."""
    return ["--workers", str(workers), "--worker-class", worker_class, "--log-level", "warning"]


LOOM_PATHS = {op: f"/v1/working_memory.{op}" for op in ("get", "set", "append")}
BASELINE_PATHS = {op: f"/wm/{op}" for op in ("get", "set", "append")}
OPS = ("get", "set", "append")
NOTE_TEXT = ("The user prefers short answers and metric units. " * 4)[:200]


# --- request bodies ---------------------------------------------------------------------------


def token(writer: int, n: int) -> str:
    """A short addition unique to (writer, n): one hex digit, then n in base 36."""
    digits = ""
    while True:
        n, digit = divmod(n, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[digit] + digits
        if not n:
            return f"{writer:x}{digits}"


@dataclass(frozen=True)
class Bodies:
    """How the n-th request of connection ``writer`` is written: a JSON body with one slot.

    ``mode`` static: ``head`` alone. spread: ``head + "%02d" % (n % spread) + tail``. unique:
    ``head + token(writer, n) + tail``. ``scope_per_writer`` puts ``"run_id": "r<writer>"`` in
    the body, so each writer has a block of its own.
    """

    head: str
    tail: str = ""
    mode: str = "static"
    spread: int = 0
    scope_per_writer: bool = False

    def body(self, writer: int, n: int) -> bytes:
        if self.mode == "static":
            text = self.head
        elif self.mode == "spread":
            text = f"{self.head}{n % self.spread:02d}{self.tail}"
        else:
            text = f"{self.head}{token(writer, n)}{self.tail}"
        if self.scope_per_writer:
            text = text[:-1] + f',"run_id":"r{writer}"}}'
        return text.encode()


def _identity_json(**extra: Any) -> str:
    return json.dumps({"namespace": NAMESPACE, "agent": AGENT, **extra}, separators=(",", ":"))


def op_bodies(op: str) -> Bodies:
    if op == "get":
        return Bodies(_identity_json(block_key="note"))
    if op == "set":
        return Bodies(_identity_json(block_key="note", content=NOTE_TEXT))
    head = _identity_json(block_key="@@", addition="x")
    before, after = head.split("@@")
    return Bodies(before + "log", after, mode="spread", spread=SPREAD_BLOCKS)


def contended_bodies(block_key: str, own_scope: bool) -> Bodies:
    head = _identity_json(block_key=block_key, addition="@@")
    before, after = head.split("@@")
    return Bodies(before, after, mode="unique", scope_per_writer=own_scope)


# --- the Python load client (runs in its own process) -----------------------------------------


@dataclass
class LoadResult:
    ok: int = 0
    failed: int = 0
    errors: int = 0
    elapsed: float = 0.0
    acked: list[list[int]] = field(default_factory=list)  # per writer, when asked to keep them
    client: str = "python"
    client_cpu: float = 0.0  # seconds of CPU the load client used

    @property
    def rate(self) -> float:
        return self.ok / self.elapsed if self.elapsed else 0.0


def _read_response(sock: socket.socket) -> tuple[int, bool]:
    """One HTTP/1.1 answer: its status and whether the connection stays open."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the headers")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length, keep = 0, lines[0].startswith(b"HTTP/1.1")
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"connection":
            keep = value.strip().lower() != b"close"
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed inside the body")
        rest += chunk
    return status, keep


def python_load(
    port: int,
    path: str,
    bodies: Bodies,
    connections: int,
    seconds: float,
    per_connection: int | None = None,
    keep_acked: bool = False,
) -> LoadResult:
    """``connections`` threads, each one request at a time, until the deadline or the count."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Content-Type: application/json\r\nContent-Length: "
    ).encode()
    limit = per_connection if per_connection is not None else 1 << 62
    results = [LoadResult() for _ in range(connections)]
    acked: list[list[int]] = [[] for _ in range(connections)]
    start_gate = threading.Barrier(connections + 1)
    deadline = [0.0]

    def run(writer: int) -> None:
        result = results[writer]
        sock: socket.socket | None = None
        start_gate.wait()
        n = 0
        while n < limit and time.monotonic() < deadline[0]:
            body = bodies.body(writer, n)
            request = head + str(len(body)).encode() + b"\r\n\r\n" + body
            try:
                if sock is None:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.sendall(request)
                status, keep = _read_response(sock)
            except OSError:
                result.errors += 1
                if sock is not None:
                    sock.close()
                sock = None
                n += 1
                continue
            if status == 200:
                result.ok += 1
                if keep_acked:
                    acked[writer].append(n)
            else:
                result.failed += 1
            n += 1
            if not keep:
                sock.close()
                sock = None
        if sock is not None:
            sock.close()

    threads = [threading.Thread(target=run, args=(w,)) for w in range(connections)]
    for thread in threads:
        thread.start()
    began, began_cpu = time.monotonic(), time.process_time()
    deadline[0] = began + seconds
    start_gate.wait()
    for thread in threads:
        thread.join()
    total = LoadResult(
        elapsed=time.monotonic() - began,
        acked=acked if keep_acked else [],
        client_cpu=time.process_time() - began_cpu,
    )
    for result in results:
        total.ok += result.ok
        total.failed += result.failed
        total.errors += result.errors
    return total


# --- wrk ------------------------------------------------------------------------------------

WRK_SCRIPT = r"""
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local path = [==[%(path)s]==]
local head = [==[%(head)s]==]
local tail = [==[%(tail)s]==]
local spread = %(spread)d
local n = 0
function request()
  local body = head
  if spread > 0 then
    body = head .. string.format("%%02d", n %% spread) .. tail
  end
  n = n + 1
  return wrk.format(nil, path, nil, body)
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%%d,"duration_us":%%d,"connect":%%d,"read":%%d,"write":%%d,' ..
    '"status":%%d,"timeout":%%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout))
end
"""


def wrk_load(
    wrk: str, port: int, path: str, bodies: Bodies, connections: int, seconds: int, workdir: Path
) -> LoadResult:
    if bodies.mode not in ("static", "spread") or bodies.scope_per_writer:
        raise ValueError("wrk drives static and spread bodies only")
    script = workdir / f"wrk_{abs(hash((path, bodies)))}.lua"
    script.write_text(
        WRK_SCRIPT
        % {
            "path": path,
            "head": bodies.head,
            "tail": bodies.tail,
            "spread": bodies.spread if bodies.mode == "spread" else 0,
        }
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [wrk, "-t1", f"-c{connections}", f"-d{seconds}s", "-s", str(script),
         f"http://127.0.0.1:{port}{path}"],
        capture_output=True, text=True, check=True,
    ).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = next(x for x in out.splitlines() if x.startswith("WRKJSON "))
    summary = json.loads(line[len("WRKJSON "):])
    return LoadResult(
        ok=summary["requests"] - summary["status"],
        failed=summary["status"],
        errors=summary["connect"] + summary["read"] + summary["write"] + summary["timeout"],
        elapsed=summary["duration_us"] / 1e6,
        client="wrk",
        client_cpu=(after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
    )


# --- CPU accounting ---------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (state is [0], ppid [1])."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_tree_cpu(root: int) -> float:
    """CPU seconds (user + system) of ``root`` and its direct children, from /proc."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _proc_stat(int(entry.name))
        except (OSError, IndexError):
            continue
        if int(entry.name) == root or fields[1] == str(root):
            total += int(fields[11]) + int(fields[12])
    return total / _TICK


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all cores since boot, from /proc/stat."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


@dataclass
class Run:
    """One load run and the CPU each party spent on it, per answered request."""

    rate: float
    worker_us: float
    redis_us: float
    client_us: float
    busy: float  # share of all cores busy during the run


# --- the servers ------------------------------------------------------------------------------


class Gunicorn:
    def __init__(
        self, name: str, target: str, env: dict[str, str], logdir: Path, settings: list[str]
    ) -> None:
        self.name = name
        self.target = target
        self.settings = settings
        self.port = free_port()
        self.env = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
        self.log = logdir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> Gunicorn:
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", self.target,
                 "--bind", f"127.0.0.1:{self.port}", *self.settings],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} gunicorn exited:\n{self.log.read_text()[-2000:]}")
            try:
                requests.get(self.url + "/", timeout=2)
                return self
            except requests.RequestException:  # refused, or accepted before a worker is up
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} gunicorn did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


@dataclass
class App:
    name: str
    server: Gunicorn
    paths: dict[str, str]


# --- the bench ------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, redis_url: str, workdir: Path) -> None:
        self.args = args
        self.r = redis.Redis.from_url(redis_url, decode_responses=True)
        self.workdir = workdir
        self.wrk = None if args.python_loader else shutil.which("wrk")
        self.pool = ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"))
        self.scope = keys.working_memory_scope(ORG, NAMESPACE, "-", AGENT, "-", "-")
        self.index = keys.working_memory_scopes(ORG, NAMESPACE, "-")

    def close(self) -> None:
        self.pool.shutdown()
        self.r.close()

    # state

    def reset(self) -> None:
        """Every bench key gone, then the block that get reads and set overwrites."""
        doomed = list(self.r.scan_iter(match=f"loom:wm*:{{{ORG}/{NAMESPACE}/*", count=1000))
        if doomed:
            self.r.delete(*doomed)
        version = time.time_ns()
        self.r.hset(self.scope, "note", f"{version}:4096:{len(NOTE_TEXT)}:{NOTE_TEXT}")
        self.r.sadd(self.index, self.scope)

    # load

    def load(
        self, app: App, path: str, bodies: Bodies, connections: int, seconds: float,
        per_connection: int | None = None, keep_acked: bool = False, force_python: bool = False,
    ) -> LoadResult:
        if self.wrk and not force_python and per_connection is None and not keep_acked:
            return wrk_load(
                self.wrk, app.server.port, path, bodies, connections, max(1, round(seconds)),
                self.workdir,
            )
        return self.pool.submit(
            python_load, app.server.port, path, bodies, connections, seconds,
            per_connection, keep_acked,
        ).result()

    def redis_cpu(self) -> float:
        info = self.r.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    def measured_run(self, app: App, op: str) -> tuple[Run, LoadResult]:
        assert app.server.process is not None
        worker0, redis0, busy0 = (
            process_tree_cpu(app.server.process.pid), self.redis_cpu(), machine_busy()
        )
        result = self.load(app, app.paths[op], op_bodies(op), self.args.connections,
                           self.args.seconds)
        worker1, redis1, busy1 = (
            process_tree_cpu(app.server.process.pid), self.redis_cpu(), machine_busy()
        )
        per = 1e6 / result.ok if result.ok else 0.0
        run = Run(
            rate=result.rate,
            worker_us=(worker1 - worker0) * per,
            redis_us=(redis1 - redis0) * per,
            client_us=result.client_cpu * per,
            busy=(busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]),
        )
        return run, result

    def throughput(self, apps: list[App]) -> dict[str, dict[str, list[Run]]]:
        args = self.args
        runs: dict[str, dict[str, list[Run]]] = {op: {a.name: [] for a in apps} for op in OPS}
        for op in OPS:
            for app in apps:  # warm both workers of each app, and EVALSHA's script cache
                self.reset()
                self.load(app, app.paths[op], op_bodies(op), args.connections, 1)
        for round_no in range(args.rounds):
            order = apps if round_no % 2 == 0 else apps[::-1]
            for op in OPS:
                for app in order:
                    self.reset()
                    run, result = self.measured_run(app, op)
                    runs[op][app.name].append(run)
                    bad = f"  ({result.failed} non-200, {result.errors} socket errors)" if (
                        result.failed or result.errors) else ""
                    print(f"  round {round_no + 1} {op:<6} {app.name:<8} "
                          f"{run.rate:7.0f} req/s  CPU us/req: gunicorn {run.worker_us:4.0f}, "
                          f"redis {run.redis_us:3.0f}, client {run.client_us:3.0f}; cores "
                          f"{run.busy:4.0%} busy [{result.client}]{bad}", flush=True)
        return runs

    # round trips

    def _stats(self) -> tuple[int, dict[str, int]]:
        info = self.r.info("all")
        calls = {
            name[len("cmdstat_"):]: stats["calls"]
            for name, stats in info.items()
            if name.startswith("cmdstat_") and isinstance(stats, dict)
        }
        for ours in ("info", "config|resetstat"):
            calls.pop(ours, None)
        # Read events counted since Redis 6.0; less the INFO's own read.
        return int(info.get("total_reads_processed", 1)) - 1, calls

    def round_trips(self, app: App, path: str, bodies: Bodies) -> tuple[float, dict[str, float]]:
        self.reset()
        url = app.server.url + path
        headers = {"Content-Type": "application/json"}
        for n in range(5):
            requests.post(url, data=bodies.body(0, n), headers=headers, timeout=10)
        self.r.config_resetstat()
        for n in range(ROUND_TRIP_REQUESTS):
            response = requests.post(url, data=bodies.body(0, n), headers=headers, timeout=10)
            if response.status_code != 200:
                raise RuntimeError(f"{app.name} {path}: {response.status_code} {response.text}")
        reads, calls = self._stats()
        k = ROUND_TRIP_REQUESTS
        return reads / k, {name: count / k for name, count in sorted(calls.items())}

    # contended append

    def reset_contended(self, app_loom: App, block_key: str, scopes: list[str]) -> None:
        """A fresh, empty block of char_limit 16384 in each scope, written through Loom."""
        doomed = list(self.r.scan_iter(match=f"loom:wm*:{{{ORG}/{NAMESPACE}/*", count=1000))
        if doomed:
            self.r.delete(*doomed)
        for run_id in scopes:
            body = {"namespace": NAMESPACE, "agent": AGENT, "block_key": block_key,
                    "content": "", "char_limit": CONTENDED_CHAR_LIMIT}
            if run_id != "-":
                body["run_id"] = run_id
            response = requests.post(app_loom.server.url + LOOM_PATHS["set"], json=body, timeout=10)
            response.raise_for_status()

    def contended_batch(
        self, loom: App, target: App, path: str, writers: int, own_scope: bool, seconds: float
    ) -> dict[str, Any]:
        """Fresh blocks, then at most CONTENDED_MAX_APPENDS appends; every addition checked."""
        block_key = "shared"
        scopes = [f"r{w}" for w in range(writers)] if own_scope else ["-"]
        self.reset_contended(loom, block_key, scopes)
        self.r.config_resetstat()
        result = self.load(
            target, path, contended_bodies(block_key, own_scope), writers, seconds,
            per_connection=CONTENDED_MAX_APPENDS // writers, keep_acked=True, force_python=True,
        )
        reads, calls = self._stats()
        present: list[str] = []
        for run_id in scopes:
            scope = keys.working_memory_scope(ORG, NAMESPACE, "-", AGENT, "-", run_id)
            raw = self.r.hget(scope, block_key) or "0:0:0:"
            present += [part for part in raw.split(":", 3)[3].split("\n") if part]
        acked = {token(w, n) for w, ns in enumerate(result.acked) for n in ns}
        seen = set(present)
        return {
            "elapsed": result.elapsed,
            "ok": result.ok,
            "failed": result.failed + result.errors,
            "lost": len(acked - seen),
            "duplicated": len(present) - len(seen),
            "unacked_applied": len(seen - acked),
            "applied": len(present),
            "reads": reads,
            "retries": calls.get("watch", 0) - len(present) if "watch" in calls else 0,
        }

    def contended_phase(
        self, loom: App, target: App, path: str, writers: int, own_scope: bool, seconds: float
    ) -> dict[str, Any]:
        """Batches (each on fresh blocks, so none fills) until ``seconds`` of load have run."""
        total: dict[str, Any] = {}
        while not total or total["elapsed"] < seconds:
            left = seconds - total.get("elapsed", 0.0)
            batch = self.contended_batch(loom, target, path, writers, own_scope, max(left, 0.2))
            for name, value in batch.items():
                total[name] = total.get(name, 0) + value
        total["rate"] = total["ok"] / total["elapsed"] if total["elapsed"] else 0.0
        total["round_trips"] = total["reads"] / total["applied"] if total["applied"] else 0.0
        return total

    def contended(self, loom: App, baseline: App) -> dict[str, dict[str, list[dict[str, Any]]]]:
        seconds = self.args.contended_seconds
        kinds = {
            "loom lua": (loom, LOOM_PATHS["append"]),
            "watch/multi": (baseline, BASELINE_PATHS["append"]),
        }
        shapes = {
            "8 writers, 1 block": (CONTENDED_WRITERS, False),
            "1 writer, 1 block": (1, False),
            "8 writers, 8 blocks": (CONTENDED_WRITERS, True),
        }
        out: dict[str, dict[str, list[dict[str, Any]]]] = {
            kind: {shape: [] for shape in shapes} for kind in kinds
        }
        for target, path in kinds.values():  # warm-up, not counted
            self.contended_phase(loom, target, path, CONTENDED_WRITERS, False, 0.5)
        for round_no in range(self.args.rounds):
            for kind, (target, path) in kinds.items():
                for shape, (writers, own_scope) in shapes.items():
                    phase = self.contended_phase(loom, target, path, writers, own_scope, seconds)
                    out[kind][shape].append(phase)
                    print(
                        f"  round {round_no + 1} {kind:<11} {shape:<19} {phase['rate']:7.0f} "
                        f"appends/s  lost {phase['lost']}  dup {phase['duplicated']}  "
                        f"retries {phase['retries']}  rt/append {phase['round_trips']:.2f}"
                        + (f"  failed {phase['failed']}, applied unacknowledged "
                           f"{phase['unacked_applied']}" if phase["failed"] else ""),
                        flush=True,
                    )
        return out


# --- profile --------------------------------------------------------------------------------


# Where Loom's time goes: cumulative time of these functions, matched by file ending and name.
LOOM_STAGES = (
    ("flask/app.py", "wsgi_app", "whole request in Flask (wsgi_app)"),
    ("flask/app.py", "full_dispatch_request", "  dispatch: view + response"),
    ("flask/app.py", "finalize_request", "    answer -> Response (jsonify)"),
    ("app/api.py", "view", "    the op's view"),
    ("app/api.py", "read_json_body", "      read_json_body"),
    ("app/services.py", "authenticate", "      authenticate"),
    ("app/services.py", "check_budget", "      check_budget"),
    ("app/api.py", "run_op", "      run_op"),
    ("app/api.py", "load_args", "        load_args (marshmallow load)"),
    ("app/auth.py", "resolve_identity", "        resolve_identity"),
    ("app/ops/working_memory.py", "working_memory_get", "        handler get"),
    ("app/ops/working_memory.py", "working_memory_set", "        handler set"),
    ("app/ops/working_memory.py", "working_memory_append", "        handler append"),
    ("redis/client.py", "execute_command", "          redis-py command"),
    ("redis/commands/core.py", "__call__", "          redis-py Script (EVALSHA)"),
    ("app/store/working_memory.py", "as_answer", "          as_answer"),
    ("app/clock.py", "iso_from_ns", "            iso_from_ns"),
    ("app/api.py", "_client_name", "      _client_name"),
)
BASELINE_STAGES = (
    ("flask/app.py", "wsgi_app", "whole request in Flask (wsgi_app)"),
    ("flask/app.py", "full_dispatch_request", "  dispatch: view + response"),
    ("flask/app.py", "finalize_request", "    answer -> Response"),
    ("bench/baseline_app.py", "wm_get", "    view get"),
    ("bench/baseline_app.py", "wm_set", "    view set"),
    ("bench/baseline_app.py", "wm_append", "    view append"),
    ("flask/json/__init__.py", "jsonify", "      jsonify"),
    ("werkzeug/wrappers/request.py", "get_json", "      request.get_json"),
    ("redis/client.py", "execute_command", "      redis-py command"),
    ("redis/commands/core.py", "__call__", "      redis-py Script (EVALSHA)"),
)


def _stage_times(stats: pstats.Stats, stages: tuple[tuple[str, str, str], ...], calls: int
                 ) -> list[tuple[str, float]]:
    found = []
    for suffix, func, label in stages:
        total = sum(
            ct for (filename, _line, name), (_cc, _nc, _tt, ct, _callers) in stats.stats.items()
            if name == func and filename.replace("\\", "/").endswith(suffix)
        )
        if total:
            found.append((label, total / calls * 1e6))
    return found


def profile(redis_url: str, calls: int, workdir: Path) -> None:
    """Each op ``calls`` times per app, straight into the WSGI app (no HTTP, no gunicorn)."""
    os.environ["REDIS_URL"] = redis_url
    from app import create_app
    from bench import baseline_app

    loom = create_app(
        {"redis_url": redis_url, "data_dir": str(workdir / "profile"),
         "secret_key": secrets.token_hex(16)}
    )
    apps = {
        "loom": (loom.wsgi_app, LOOM_PATHS, LOOM_STAGES),
        "baseline": (baseline_app.app.wsgi_app, BASELINE_PATHS, BASELINE_STAGES),
    }
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    scope = keys.working_memory_scope(ORG, NAMESPACE, "-", AGENT, "-", "-")

    def fresh() -> None:
        doomed = list(r.scan_iter(match=f"loom:wm*:{{{ORG}/{NAMESPACE}/*", count=1000))
        if doomed:
            r.delete(*doomed)
        r.hset(scope, "note", f"{time.time_ns()}:4096:{len(NOTE_TEXT)}:{NOTE_TEXT}")

    print(f"\nProfile: {calls} calls per op straight into each WSGI app in one process "
          "(no HTTP, no gunicorn); us = microseconds per call; CPU time leaves out the wait "
          "on Redis")
    for op in OPS:
        bodies = op_bodies(op)
        timings: dict[str, float] = {}
        for name, (wsgi, paths, stages) in apps.items():
            path = paths[op]
            fresh()
            for n in range(200):
                status = wsgi_call(wsgi, path, bodies.body(0, n))
                if not status.startswith("200"):
                    raise RuntimeError(f"{name} {path}: {status}")
            best, best_cpu = float("inf"), float("inf")
            for _repeat in range(3):
                fresh()
                began, began_cpu = time.perf_counter(), time.process_time()
                for n in range(calls):
                    wsgi_call(wsgi, path, bodies.body(0, n))
                best = min(best, (time.perf_counter() - began) / calls)
                best_cpu = min(best_cpu, (time.process_time() - began_cpu) / calls)
            timings[name] = best_cpu
            fresh()
            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
            for n in range(calls):
                wsgi_call(wsgi, path, bodies.body(0, n))
            profiler.disable()
            stats = pstats.Stats(profiler)
            print(f"  {op} / {name}: {best_cpu * 1e6:.0f} us CPU, {best * 1e6:.0f} us wall per "
                  "call unprofiled (best of 3); CPU us per call under cProfile (inflated ~2x):")
            for label, us in _stage_times(stats, stages, calls):
                print(f"      {label:<44}{us:7.0f}")
            if name == "loom" and os.environ.get("BENCH_PROFILE_FUNCTIONS"):
                stats.sort_stats("tottime").print_stats(30)
        extra = (timings["loom"] - timings["baseline"]) * 1e6
        print(f"  {op}: loom spends {extra:.0f} us more CPU per call than the baseline "
              f"({timings['loom'] / timings['baseline']:.2f}x), before HTTP and gunicorn")
    r.close()


# --- report ---------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def report(
    runs: dict[str, dict[str, list[Run]]],
    trips: dict[str, dict[str, tuple[float, dict[str, float]]]],
    contended: dict[str, dict[str, list[dict[str, Any]]]],
    figures: dict[str, str],
) -> bool:
    """Print the run's figures, put each in ``figures`` for the result file; True when every
    target is met."""
    ok = True
    print("\nThroughput (median of rounds; ratio = median of the per-round loom/baseline req/s)")
    print("CPU = microseconds of CPU per answered request, loom/baseline: gunicorn (master and")
    print("workers), redis-server, load client; 'CPU ratio' = baseline total / loom total, the")
    print("req/s ratio to expect while the cores are saturated, and steadier than req/s")
    print(f"  {'op':<7}{'loom req/s':>11}{'base req/s':>11}{'ratio':>7}{'':<7}"
          f"{'gunicorn':>12}{'redis':>9}{'client':>9}{'CPU ratio':>11}")
    for op in OPS:
        loom, base = runs[op]["loom"], runs[op]["baseline"]
        ratio = median([a.rate / b.rate for a, b in zip(loom, base, strict=True) if b.rate])
        ok &= ratio >= TARGET_RATIOS[op]
        verdict = "ok" if ratio >= TARGET_RATIOS[op] else "BELOW"

        def med(items: list[Run], attr: str) -> float:
            return median([getattr(item, attr) for item in items])

        def cpu(items: list[Run]) -> float:
            return median([item.worker_us + item.redis_us + item.client_us for item in items])

        cpu_ratio = cpu(base) / cpu(loom) if cpu(loom) else 0.0
        print(f"  {op:<7}{med(loom, 'rate'):>11.0f}{med(base, 'rate'):>11.0f}{ratio:>7.3f} "
              f"{verdict:<6}{med(loom, 'worker_us'):>6.0f}/{med(base, 'worker_us'):<5.0f}"
              f"{med(loom, 'redis_us'):>4.0f}/{med(base, 'redis_us'):<4.0f}"
              f"{med(loom, 'client_us'):>4.0f}/{med(base, 'client_us'):<4.0f}{cpu_ratio:>11.3f}")
        if med(loom, "rate"):
            figures[f"{op}: loom / baseline req/s"] = (
                f"{med(loom, 'rate'):,.0f} / {med(base, 'rate'):,.0f}, ratio {ratio:.3f} "
                f"(target {TARGET_RATIOS[op]}); CPU ratio {cpu_ratio:.3f}")
    print("  targets: " + ", ".join(f"{op} ratio >= {t}" for op, t in TARGET_RATIOS.items()))

    print("\nRedis round trips per request (server read events; commands from INFO commandstats,")
    print("which include the commands a script runs inside Redis)")
    for name in ("loom", "baseline"):
        for op, (rt, calls) in trips[name].items():
            detail = ", ".join(f"{cmd} {n:.2f}" for cmd, n in calls.items())
            print(f"  {name:<9}{op:<13}{rt:5.2f}   {detail}")
            figures[f"{op}: Redis round trips a request, {name}"] = f"{rt:.2f}"

    print(f"\nContended append (median of rounds; {CONTENDED_WRITERS} writers on one block vs "
          f"1 writer, and vs {CONTENDED_WRITERS} writers on {CONTENDED_WRITERS} blocks)")
    print(f"  {'append':<12}{'8w/1 block':>11}{'1 writer':>10}{'8w/8 blocks':>12}"
          f"{'8w:1w':>7}{'8w:8b':>7}{'retries':>9}{'rt/app':>8}{'lost':>6}{'dup':>5}")
    for kind, shapes in contended.items():
        med = {shape: median([p["rate"] for p in phases]) for shape, phases in shapes.items()}
        hot, one, spread = (med[s] for s in shapes)
        hot_phases = list(shapes.values())[0]
        retries = sum(p["retries"] for p in hot_phases)
        appends = sum(p["ok"] for p in hot_phases)
        rt = median([p["round_trips"] for p in hot_phases])
        lost = sum(p["lost"] for phases in shapes.values() for p in phases)
        dup = sum(p["duplicated"] for phases in shapes.values() for p in phases)
        ratio_one = hot / one if one else 0.0
        ratio_spread = hot / spread if spread else 0.0
        if kind == "loom lua":
            ok &= ratio_one >= TARGET_CONTENDED and lost == 0 and dup == 0
        print(f"  {kind:<12}{hot:>11.0f}{one:>10.0f}{spread:>12.0f}{ratio_one:>7.2f}"
              f"{ratio_spread:>7.2f}{retries:>9}{rt:>8.2f}{lost:>6}{dup:>5}")
        figures[f"contended append, {kind}: {CONTENDED_WRITERS} writers on one block"] = (
            f"{hot:,.0f} appends/s against {one:,.0f} for one writer ({ratio_one:.2f}), "
            f"{retries} retries, {lost} lost, {dup} duplicated")
        if kind == "watch/multi":
            print(f"  {'':<12}watch/multi: {retries} retries over {appends} contended appends "
                  f"({retries / appends if appends else 0:.2f} per append)")
    print(f"  targets: 8w:1w >= {TARGET_CONTENDED} for loom lua; lost and dup 0 everywhere")
    return ok


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


def _load_average() -> str:
    one, five, _fifteen = os.getloadavg()
    return f"{one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count() or 1} cores"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=5, help="length of one load run (5)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per op and app (3)")
    parser.add_argument("--connections", type=int, default=8, help="concurrent connections (8)")
    parser.add_argument("--contended-seconds", type=float, default=2.5,
                        help="load time of one contended phase (2.5), run in batches of at "
                             f"most {CONTENDED_MAX_APPENDS} appends on fresh blocks")
    parser.add_argument("--workers", type=int, default=2,
                        help="gunicorn workers per app (2); more workers put more writers on the "
                             "contended block at once")
    parser.add_argument("--worker-class", default="gevent", choices=("gevent", "gthread", "sync"),
                        help="gunicorn worker class of both apps (gevent, as deployed)")
    parser.add_argument("--python-loader", action="store_true",
                        help="use the Python load client even when wrk is installed")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also profile N in-process calls per op on both apps (e.g. 5000)")
    parser.add_argument("--skip-throughput", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--skip-contended", action="store_true",
                        help="leave out the contended appends")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)

    cores = os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    wrk = None if args.python_loader else shutil.which("wrk")
    print(f"cores: {cores} (usable by this process: {usable}); redis-server, "
          f"{args.workers}+{args.workers} gunicorn workers and the load client all share them, "
          "so the load client's own CPU is part of every figure, for both apps alike")
    print(f"load client: {'wrk (1 thread)' if wrk else 'Python (threads, separate process)'}, "
          f"{args.connections} connections, {args.seconds}s per run, {args.rounds} rounds; "
          "contended appends always use the Python client (each addition is checked)")
    settings = gunicorn_settings(args.workers, args.worker_class)
    print(f"gunicorn (both apps): {' '.join(settings)}")
    print(f"load average at start: {_load_average()}")

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="loom-bench-") as tmp:
        workdir = Path(tmp)
        with redis_for_bench(workdir) as redis_url:
            given = bool(os.environ.get("REDIS_URL"))
            with redis.Redis.from_url(redis_url) as info_client:
                redis_name = results.server_name(info_client.info("server"))
            at_start = results.machine(redis_name)
            print("redis: " + ("REDIS_URL (keys under namespace bench; statistics reset)"
                               if given else "own redis-server on a free port, appendonly off"))
            env = {
                "REDIS_URL": redis_url,
                "LOOM_SECRET_KEY": secrets.token_hex(32),
                "LOOM_DATA_DIR": str(workdir / "loom"),
                "LOOM_AUTH": "off",
                "LOOM_RATE_LIMIT": "",
                "LOOM_DEFAULT_ORG": ORG,
            }
            servers = [
                Gunicorn("loom", "wsgi:app", env, workdir, settings),
                Gunicorn("baseline", "bench.baseline_app:app", env, workdir, settings),
            ]
            bench = Bench(args, redis_url, workdir)
            try:
                for server in servers:
                    server.start()
                loom = App("loom", servers[0], LOOM_PATHS)
                baseline = App("baseline", servers[1], BASELINE_PATHS)
                zero = Run(0.0, 0.0, 0.0, 0.0, 0.0)
                runs: dict[str, dict[str, list[Run]]] = {
                    op: {"loom": [zero], "baseline": [zero]} for op in OPS
                }
                if not args.skip_throughput:
                    print("\nThroughput runs")
                    runs = bench.throughput([loom, baseline])
                trips: dict[str, dict[str, tuple[float, dict[str, float]]]] = {}
                for app in (loom, baseline):
                    trips[app.name] = {
                        op: bench.round_trips(app, app.paths[op], op_bodies(op)) for op in OPS
                    }
                trips["baseline"]["append_lua"] = bench.round_trips(
                    baseline, "/wm/append_lua", op_bodies("append")
                )
                contended: dict[str, dict[str, list[dict[str, Any]]]] = {}
                if not args.skip_contended:
                    print("\nContended appends")
                    contended = bench.contended(loom, baseline)
            finally:
                bench.close()
                for server in servers:
                    server.stop()
            figures: dict[str, str] = {}
            met = report(runs, trips, contended, figures)
            figures["verdict"] = "every target met" if met else "a target was missed"
            results.record(
                "working_memory", f"Working-memory get, set and append through gunicorn "
                f"({args.workers} {args.worker_class} workers an app), Loom beside a bare Flask "
                f"+ redis-py app on the same keys (its writes by WATCH/MULTI), "
                f"{'wrk' if wrk else 'the Python client'} with {args.connections} connections, "
                f"{args.rounds} rounds of {args.seconds} s, alternated.", figures, redis_name,
                at_start)
            if args.profile:
                profile(redis_url, args.profile, workdir)
    print(f"load average at end: {_load_average()}")
    print(f"\ntotal {time.monotonic() - started:.0f}s; "
          + ("every target met" if met else "a target was missed (see above)"))
    return 1 if args.strict and not met else 0


if __name__ == "__main__":
    sys.exit(main())
