"""A mixed workload at 32 connections: Loom beside the bare baseline app doing the same Redis work.

    .venv/bin/python bench/mixed.py [--seconds 10] [--rounds 3] [--connections 32]
    .venv/bin/python bench/mixed.py --client python [--requests 6000]   (no wrk on PATH)
    .venv/bin/python bench/mixed.py --rate 300 [--rate-seconds 10]   (also an offered-rate run)

What one run does:

1. Starts its own redis-server on a free loopback port (append-only off), unless REDIS_URL is
   set (then it writes, and deletes, only under the namespace ``mixed``).
2. Serves Loom (``wsgi:app``) and ``bench/baseline_app.py`` with the same gunicorn settings
   (2 gevent workers each, as the Procfile runs them). For the working-memory ops the
   baseline is a bare Flask + redis-py app (one HGET; WATCH/HGET/MULTI/EXEC for the writes);
   for the profile ops it calls Loom's memory and activity stores straight from a Flask view,
   so the Redis work is the same and only Loom's request handling is missing.
3. Before each run, writes the same data afresh: 1,000 working-memory blocks (100 users, ten
   blocks each) and each user's ``persona`` and ``notes`` sections.
4. Loads each app from 32 connections, the n-th request taking its op from a fixed cycle:
   of every ten, working_memory get x3, set x1, append x2, profile set x1, append x1,
   render x2 (own_user), each on a user and block that follow from n. The load client is
   ``wrk`` when it is on PATH (``apt-get install -y wrk``; one thread, a Lua script that
   cycles through the first ``WRK_DISTINCT`` requests of that sequence, for ``--seconds``),
   else a Python client in a separate process (threads on raw HTTP/1.1 sockets, a fixed
   ``--requests`` count). Alternates the two apps for several rounds.
5. Prints per run the throughput, p50 and p99 latency, and at the end the medians and the
   median of the per-round throughput ratios loom/baseline (target >= 0.8, and Loom's p99
   under 50 ms), with the load average at the start and the end.

Two figures, and which target each one is held to:

- **Saturation** (the default): every connection sends its next request as soon as the last
  one is answered, so both apps run flat out and the throughput ratio (target >= 0.8) is
  their relative capacity. At saturation a p99 measures the queue in front of the workers (32
  connections on 2 workers: most of a request's latency is its wait behind the others), not
  the service, and it is printed but not held to a target.
- **Offered rate** (``--rate R``, after the saturation rounds): the Python client sends R
  requests a second in all, request n due at ``start + n / R`` whatever the answers do (an
  open loop, as wrk2 runs), each latency counted from when its request was due, so a server
  that falls behind pays for the whole backlog. R below both apps' capacity measures what a
  client waits for an answer when the service is not overrun: **the p99 < 50 ms target is
  held to this figure**. Without ``--rate`` the p99 target is judged on the saturation run.

Latency is measured by the load client, on the same cores as the servers: the Python client
spends more CPU per request than either app, and its threads wait for the GIL, so its p99 is
mostly its own (the baseline's p99 is then as high as Loom's). wrk's event loop in C costs a
few microseconds a request; its p99 is the servers' queueing. Prefer wrk for the p99 target.
"""

from __future__ import annotations

import argparse
import json
import os
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
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from bench import results as result_files  # noqa: E402
from bench.working_memory import (  # noqa: E402
    Gunicorn,
    _read_response,
    gunicorn_settings,
    redis_for_bench,
)

ORG = "default"
NAMESPACE = "mixed"
AGENT = "bench"
USERS = 100
BLOCKS_PER_USER = 10  # 1,000 blocks
TARGET_RATIO = 0.8
TARGET_P99_MS = 50.0
CYCLE = ("wm_get", "wm_set", "wm_append", "wm_get", "profile_set", "wm_get", "profile_render",
         "wm_append", "profile_append", "profile_render")
LOOM_PATHS = {
    "wm_get": "/v1/working_memory.get", "wm_set": "/v1/working_memory.set",
    "wm_append": "/v1/working_memory.append", "profile_set": "/v1/profile.set",
    "profile_append": "/v1/profile.append", "profile_render": "/v1/profile.render",
}
BASELINE_PATHS = {
    "wm_get": "/wm/get", "wm_set": "/wm/set", "wm_append": "/wm/append",
    "profile_set": "/profile/set", "profile_append": "/profile/append",
    "profile_render": "/profile/render",
}
BLOCK_TEXT = "cursor: ticket 4812; lease: holds the refunds queue; step 3 of 7 done."


def request_body(n: int) -> tuple[str, bytes]:
    """The n-th request: its op and JSON body (the same for both apps)."""
    op = CYCLE[n % len(CYCLE)]
    user = f"u-{(n * 7919) % USERS:03d}"
    fields: dict[str, object] = {"namespace": NAMESPACE, "agent": AGENT, "user_id": user}
    block = f"block-{(n // len(CYCLE)) % BLOCKS_PER_USER}"
    if op == "wm_get":
        fields["block_key"] = block
    elif op == "wm_set":
        fields.update(block_key=block, content=f"{BLOCK_TEXT} #{n}")
    elif op == "wm_append":
        fields.update(block_key=block, addition=f"event {n}")
    elif op == "profile_set":
        fields.update(label="persona", value=f"Terse. Cite ticket ids. Revision {n}.")
    elif op == "profile_append":
        fields.update(label="notes", addition=f"Asked about invoice {n}.")
    else:
        fields["read_scope"] = "own_user"
    return op, json.dumps(fields, separators=(",", ":")).encode()


@dataclass
class MixedResult:
    ok: int
    failed: int
    elapsed: float
    latencies_ms: list[float] = field(default_factory=list)
    # The load client's own percentiles (wrk's), when it keeps no list of latencies.
    percentiles_ms: dict[float, float] = field(default_factory=dict)
    client: str = "python"
    client_cpu: float = 0.0  # seconds of CPU the load client spent

    @property
    def rate(self) -> float:
        return self.ok / self.elapsed if self.elapsed else 0.0

    def percentile(self, p: float) -> float:
        if p in self.percentiles_ms:
            return self.percentiles_ms[p]
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else 0.0


# wrk cycles through this many requests of the sequence (each a distinct body); the appends
# they repeat stay far below the blocks' and sections' limits within a run.
WRK_DISTINCT = 2000

WRK_SCRIPT = r"""
local items = {
%(items)s
}
local requests = {}
local count = 0
function init(args)
  for i, item in ipairs(items) do
    requests[i] = wrk.format("POST", item[1], {["Content-Type"] = "application/json"}, item[2])
  end
end
function request()
  count = count + 1
  return requests[(count - 1) %% #requests + 1]
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%%d,"duration_us":%%d,"connect":%%d,"read":%%d,"write":%%d,' ..
    '"status":%%d,"timeout":%%d,"p50_us":%%d,"p99_us":%%d,"max_us":%%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""


def wrk_script(paths: dict[str, str]) -> str:
    """The Lua script that has wrk send the mixed sequence's first WRK_DISTINCT requests."""
    items = []
    for n in range(WRK_DISTINCT):
        op, body = request_body(n)
        items.append(f"  {{[==[{paths[op]}]==], [==[{body.decode()}]==]}},")
    return WRK_SCRIPT % {"items": "\n".join(items)}


def wrk_mixed_load(wrk: str, port: int, paths: dict[str, str], connections: int,
                   seconds: int, workdir: Path) -> MixedResult:
    script = workdir / f"mixed_{port}.lua"
    script.write_text(wrk_script(paths))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [wrk, "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s", "-s", str(script),
         f"http://127.0.0.1:{port}/"],
        capture_output=True, text=True, check=True,
    ).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = next(x for x in out.splitlines() if x.startswith("WRKJSON "))
    summary = json.loads(line[len("WRKJSON "):])
    errors = sum(summary[k] for k in ("connect", "read", "write", "timeout"))
    return MixedResult(
        ok=summary["requests"] - summary["status"], failed=summary["status"] + errors,
        elapsed=summary["duration_us"] / 1e6,
        percentiles_ms={0.5: summary["p50_us"] / 1000, 0.99: summary["p99_us"] / 1000},
        client="wrk",
        client_cpu=(after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
    )


def mixed_load(port: int, paths: dict[str, str], connections: int, total: int) -> MixedResult:
    """``connections`` threads take request numbers from one counter until ``total`` are sent
    (a closed loop: each latency counts from its send)."""
    return _drive(port, paths, connections, total, rate=None)


def offered_load(port: int, paths: dict[str, str], connections: int, rate: float,
                 seconds: float) -> MixedResult:
    """``rate`` requests a second over ``connections`` connections for ``seconds``: request n
    is due at ``start + n / rate``; a thread takes the next number, waits until it is due,
    sends it and counts its latency from that instant (an open loop: a late answer delays
    no later request's clock, and its lateness is in every request that waited behind it)."""
    return _drive(port, paths, connections, max(1, int(rate * seconds)), rate=rate)


def _drive(port: int, paths: dict[str, str], connections: int, total: int,
           rate: float | None) -> MixedResult:
    """Both loads: with ``rate``, request n waits until it is due and its latency counts from
    then; without, it is sent at once and counts from its send."""
    counter = iter(range(total))
    lock = threading.Lock()
    gate = threading.Barrier(connections + 1)
    latencies: list[list[float]] = [[] for _ in range(connections)]
    failed = [0] * connections
    start = [0.0]

    def run(writer: int) -> None:
        gate.wait()
        sock: socket.socket | None = None
        while True:
            with lock:
                n = next(counter, None)
            if n is None:
                break
            if rate is None:
                began = time.perf_counter()
            else:
                began = start[0] + n / rate
                wait = began - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
            op, body = request_body(n)
            request = (f"POST {paths[op]} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                       f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                       ).encode() + body
            try:
                if sock is None:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.sendall(request)
                status, keep = _read_response(sock)
            except OSError:
                failed[writer] += 1
                if sock is not None:
                    sock.close()
                sock = None
                continue
            latencies[writer].append((time.perf_counter() - began) * 1000)
            if status != 200:
                failed[writer] += 1
            if not keep:
                sock.close()
                sock = None
        if sock is not None:
            sock.close()

    threads = [threading.Thread(target=run, args=(w,)) for w in range(connections)]
    for thread in threads:
        thread.start()
    start[0] = time.perf_counter() + 0.05
    began = time.monotonic()
    gate.wait()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - began
    flat = [x for per in latencies for x in per]
    bad = sum(failed)
    client = "python" if rate is None else f"python, offered {rate:g}/s"
    return MixedResult(ok=len(flat) - bad, failed=bad, elapsed=elapsed, latencies_ms=flat,
                       client=client)


def seed(redis_url: str, workdir: Path) -> None:
    """The data every run starts from: the namespace's keys dropped, then written again."""
    from app import create_app

    r = redis.Redis.from_url(redis_url, decode_responses=True)
    for pattern in (f"*{{{ORG}/{NAMESPACE}/*", f"*{{{ORG}/{NAMESPACE}}}*"):
        doomed = list(r.scan_iter(match=pattern, count=1000))
        for start in range(0, len(doomed), 500):
            r.delete(*doomed[start:start + 500])
    r.close()
    app = create_app({"redis_url": redis_url, "data_dir": str(workdir / "seed"),
                      "secret_key": secrets.token_hex(32)})
    client = app.test_client()
    for u in range(USERS):
        who = {"namespace": NAMESPACE, "agent": AGENT, "user_id": f"u-{u:03d}"}
        for b in range(BLOCKS_PER_USER):
            client.post("/v1/working_memory.set",
                        json={**who, "block_key": f"block-{b}", "content": BLOCK_TEXT})
        client.post("/v1/profile.set", json={**who, "label": "persona", "value": "Terse."})
        client.post("/v1/profile.append", json={**who, "label": "notes", "addition": "New."})


def _load_average() -> str:
    one, five, _fifteen = os.getloadavg()
    return f"{one:.2f} (1 min), {five:.2f} (5 min)"


def _medians(runs: list[MixedResult]) -> str:
    return (f"{statistics.median(r.rate for r in runs):6.0f} req/s  p50 "
            f"{statistics.median(r.percentile(0.5) for r in runs):5.1f} ms  p99 "
            f"{statistics.median(r.percentile(0.99) for r in runs):5.1f} ms")


def _print_medians(by_app: dict[str, list[MixedResult]]) -> None:
    for name, runs in by_app.items():
        print(f"  {name:<8} {_medians(runs)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--client", choices=("auto", "wrk", "python"), default="auto",
                        help="load client: wrk when on PATH (auto), or the Python one")
    parser.add_argument("--seconds", type=int, default=10, help="length of a wrk run (10)")
    parser.add_argument("--requests", type=int, default=6000,
                        help="requests per run of the Python client (6000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per app (3)")
    parser.add_argument("--connections", type=int, default=32, help="connections (32)")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers per app (2)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="also run each app at this offered rate, requests/s in all "
                             "(open loop; the p99 target is then held to this run)")
    parser.add_argument("--rate-seconds", type=float, default=10.0,
                        help="length of an offered-rate run (10)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    wrk = shutil.which("wrk") if args.client != "python" else None
    if args.client == "wrk" and wrk is None:
        raise SystemExit("wrk is not on PATH: apt-get install -y wrk, or --client python")
    settings = gunicorn_settings(args.workers)
    cores = os.cpu_count() or 1
    run_size = f"{args.seconds}s per run" if wrk else f"{args.requests} requests per run"
    print(f"gunicorn (both apps): {' '.join(settings)}; {args.connections} connections, "
          f"{run_size}, {args.rounds} rounds; {cores} cores shared by redis-server, both apps' "
          "workers and the load client")
    print("load client: " + ("wrk (1 thread, C event loop; latency is the servers')" if wrk
                             else "Python (threads in a separate process; its own CPU and GIL "
                                  "waits are in every latency)"))
    print(f"load average at start: {_load_average()}")
    results: dict[str, list[MixedResult]] = {"loom": [], "baseline": []}
    offered: dict[str, list[MixedResult]] = {"loom": [], "baseline": []}
    with tempfile.TemporaryDirectory(prefix="loom-mixed-") as tmp:
        workdir = Path(tmp)
        with redis_for_bench(workdir) as redis_url:
            redis_name = result_files.server_at(redis_url)
            at_start = result_files.machine(redis_name)
            env = {"REDIS_URL": redis_url, "LOOM_SECRET_KEY": secrets.token_hex(32),
                   "LOOM_DATA_DIR": str(workdir / "loom"), "LOOM_AUTH": "off",
                   "LOOM_RATE_LIMIT": "", "LOOM_DEFAULT_ORG": ORG}
            servers = {
                "loom": (Gunicorn("loom", "wsgi:app", env, workdir, settings), LOOM_PATHS),
                "baseline": (Gunicorn("baseline", "bench.baseline_app:app", env, workdir,
                                      settings), BASELINE_PATHS),
            }
            pool = ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"))

            def run(port: int, paths: dict[str, str], warm: bool = False) -> MixedResult:
                if wrk:
                    return wrk_mixed_load(wrk, port, paths, args.connections,
                                          1 if warm else args.seconds, workdir)
                return pool.submit(mixed_load, port, paths, args.connections,
                                   500 if warm else args.requests).result()

            try:
                for server, _ in servers.values():
                    server.start()
                for server, paths in servers.values():  # warm workers and scripts
                    seed(redis_url, workdir)
                    run(server.port, paths, warm=True)
                for round_no in range(args.rounds):
                    order = ["loom", "baseline"] if round_no % 2 == 0 else ["baseline", "loom"]
                    for name in order:
                        server, paths = servers[name]
                        seed(redis_url, workdir)
                        result = run(server.port, paths)
                        results[name].append(result)
                        print(f"  round {round_no + 1} {name:<8} {result.rate:6.0f} req/s  "
                              f"p50 {result.percentile(0.5):5.1f} ms  p99 "
                              f"{result.percentile(0.99):5.1f} ms  ({result.failed} failed) "
                              f"[{result.client}]", flush=True)
                for round_no in range(args.rounds if args.rate else 0):
                    order = ["loom", "baseline"] if round_no % 2 == 0 else ["baseline", "loom"]
                    for name in order:
                        server, paths = servers[name]
                        seed(redis_url, workdir)
                        result = pool.submit(offered_load, server.port, paths,
                                             args.connections, args.rate,
                                             args.rate_seconds).result()
                        offered[name].append(result)
                        print(f"  offered {args.rate:g}/s round {round_no + 1} {name:<8} "
                              f"{result.rate:6.0f} req/s  p50 {result.percentile(0.5):5.1f} ms  "
                              f"p99 {result.percentile(0.99):5.1f} ms  ({result.failed} failed)",
                              flush=True)
            finally:
                pool.shutdown()
                for server, _ in servers.values():
                    server.stop()

    ratio = statistics.median(
        a.rate / b.rate for a, b in zip(results["loom"], results["baseline"], strict=True))
    print(f"\nMixed workload, {args.connections} connections, "
          f"{'wrk' if wrk else 'Python client'} (medians of {args.rounds} rounds)")
    _print_medians(results)
    p99 = statistics.median(r.percentile(0.99) for r in results["loom"])
    p99_run = "at saturation"
    if args.rate:
        print(f"Offered rate {args.rate:g} requests/s in all, open loop, latency from each "
              f"request's due time (medians of {args.rounds} rounds)")
        _print_medians(offered)
        p99 = statistics.median(r.percentile(0.99) for r in offered["loom"])
        p99_run = f"at {args.rate:g}/s offered"
    # A failed request is no answer to compare: a ratio over runs with failures says nothing.
    failures = sum(r.failed for runs in (*results.values(), *offered.values()) for r in runs)
    if failures:
        print(f"  {failures} requests failed: the ratios above compare unequal work")
    met = ratio >= TARGET_RATIO and p99 < TARGET_P99_MS and not failures
    print(f"  ratio loom/baseline {ratio:4.2f} at saturation (target >= {TARGET_RATIO}); loom "
          f"p99 {p99:.1f} ms {p99_run} (target < {TARGET_P99_MS:.0f} ms): "
          + ("every target met" if met else "a target was missed"))
    print(f"load average at end: {_load_average()}")
    figures = {}
    for label, by_app in (("at saturation", results), (f"at {args.rate:g}/s offered", offered)):
        if not all(by_app.values()):  # no offered-rate run without --rate
            continue
        for name, runs in by_app.items():
            figures[f"{name} {label}"] = " ".join(_medians(runs).split())
    figures["ratio loom/baseline at saturation"] = f"{ratio:.2f} (target >= {TARGET_RATIO})"
    figures[f"loom p99 {p99_run}"] = f"{p99:.1f} ms (target < {TARGET_P99_MS:.0f} ms)"
    if failures:
        figures["failed requests"] = str(failures)
    figures["verdict"] = "every target met" if met else "a target was missed"
    result_files.record(
        "mixed", f"A mixed workload (of every ten requests: working-memory get x3, set x1, "
        f"append x2, profile set x1, append x1, render x2) through gunicorn ({args.workers} "
        f"gevent workers an app), Loom beside a baseline app doing the same Redis work, "
        f"{'wrk' if wrk else 'the Python client'} with {args.connections} connections, "
        f"{args.rounds} rounds of {run_size}, alternated; medians of the rounds.",
        figures, redis_name, at_start)
    return 1 if args.strict and not met else 0


if __name__ == "__main__":
    sys.exit(main())
