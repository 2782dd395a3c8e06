"""Instructions per request, Loom beside the bare baseline app: a count that a busy machine
does not move.

    .venv/bin/python bench/instructions.py [--requests 300] [--warmup 200] [--no-gevent]

Wall-clock ratios (``bench/working_memory.py``) swing by a tenth when other work shares the
cores; the number of instructions a request executes does not. This bench runs each app in
its own Python process under ``valgrind --tool=callgrind``, calls it straight through WSGI
(``app(environ, start_response)``, the environ gunicorn would build) in a loop, and reads
callgrind's instruction count (Ir) for exactly that loop: the process zeroes the counters
(``callgrind_control -z``) after its warm-up, runs ``--requests`` calls of one op, and dumps
them (``callgrind_control -d``); a zero-then-dump with nothing between is measured once and
subtracted. Both processes:

- talk to a redis-server over redis-py (one each, on free loopback ports, run side by side;
  with REDIS_URL set, that one, one app after the other, touching only keys under the
  namespace ``bench``), so each party's client-side Redis work is in its count and the
  server's is not;
- run as a gunicorn worker would: ``PROMETHEUS_MULTIPROC_DIR`` set (metrics in files, as
  under gunicorn), Loom's logging configured as ``wsgi.py`` does with its lines written to a
  file, and gevent's monkey patching applied as the gevent worker applies it
  (``--no-gevent`` for the sync worker's view).

Loom runs as the bench deploys it (auth off, no request budget); the baseline is
``bench/baseline_app.py`` (Flask + redis-py: one HGET for get, a WATCH/HGET/MULTI/EXEC loop
for set and append). The printed ratio is baseline instructions / Loom instructions, the
req/s ratio to expect if the app alone used the CPU. gunicorn's own share of a request (HTTP
parsing, the socket, the answer's writing) is the same for both apps and is not counted
here, so the wall ratio under gunicorn lies between this ratio and 1. ``--gunicorn-ir N``
adds that share, in instructions per request, to both sides, for a figure that can be set
beside the wall bench.

``--gunicorn`` counts the whole request instead: each app is served by a real gunicorn (one
gevent worker, the wall bench's settings) under callgrind, and a client on loopback sends
``--requests`` keep-alive requests of each op, one after another, between a zeroing and a dump
of the worker's counters. That count holds gunicorn's HTTP parsing, the socket work and the
answer's writing as they are for each app (Loom's answer carries more headers and fields), so
its ratio is the one to set beside the wall bench's; what it cannot show is the cost of a busy
machine's caches, which the wall bench's CPU columns do.

Valgrind runs code ~50x slower: the two processes run side by side, and a run takes three to
six minutes (more on a busy machine; the counts stay the same).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import results  # noqa: E402
from bench.wsgi_call import call  # noqa: E402

OPS = ("get", "set", "append")
APPS = ("loom", "baseline")
# Only get does the same Redis work in both apps (see ``report``).
TARGETS = {"get": 0.8}
ORG = "default"
NAMESPACE = "bench"


def fresh_blocks(r: Any, scope: str) -> None:
    """The bench namespace's blocks gone, then the one block every get reads, written anew."""
    from bench.working_memory import NOTE_TEXT

    doomed = list(r.scan_iter(match=f"loom:wm*:{{{ORG}/{NAMESPACE}/*", count=1000))
    if doomed:
        r.delete(*doomed)
    r.hset(scope, "note", f"{time.time_ns()}:4096:{len(NOTE_TEXT)}:{NOTE_TEXT}")


# --- the process under valgrind -------------------------------------------------------------


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def child(args: argparse.Namespace) -> int:
    if args.gevent:
        from gevent import monkey

        monkey.patch_all()
    metrics_dir = Path(args.out) / f"{args.child}-metrics"
    metrics_dir.mkdir(exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    os.environ["REDIS_URL"] = args.redis_url
    # Loom's lines go where gunicorn's stderr goes: a file.
    log = open(Path(args.out) / f"{args.child}.stderr", "w")
    os.dup2(log.fileno(), 2)

    import redis

    from bench.working_memory import BASELINE_PATHS, LOOM_PATHS, op_bodies

    if args.child == "loom":
        from app import create_app
        from app.logs import configure_logging

        configure_logging("json")
        app = create_app({
            "redis_url": args.redis_url, "data_dir": str(Path(args.out) / "loom"),
            "secret_key": secrets.token_hex(32), "auth": "off", "rate_limit": None,
            "default_org": ORG,
        })
        paths = LOOM_PATHS
    else:
        from bench import baseline_app

        app = baseline_app.app
        paths = BASELINE_PATHS

    from app.store import keys

    r = redis.Redis.from_url(args.redis_url, decode_responses=True)
    scope = keys.working_memory_scope(ORG, NAMESPACE, "-", "bench", "-", "-")

    def fresh() -> None:
        fresh_blocks(r, scope)

    _control("-z")
    _control("-d", "empty")
    # The first counted segment of a process runs ~10% over the later ones, whatever it runs
    # (seen with the same op counted twice): one is counted and thrown away.
    first = op_bodies(args.ops[0])
    fresh()
    for n in range(args.warmup):
        call(app, paths[args.ops[0]], first.body(0, n))
    _control("-z")
    for n in range(args.requests):
        call(app, paths[args.ops[0]], first.body(0, n))
    _control("-d", "thrown-away")
    for op in args.ops:
        bodies = op_bodies(op)
        path = paths[op]
        fresh()
        for n in range(args.warmup):
            status = call(app, path, bodies.body(0, n))
            if not status.startswith("200"):
                raise SystemExit(f"{args.child} {path}: {status}")
        fresh()
        _control("-z")
        for n in range(args.requests):
            call(app, path, bodies.body(0, n))
        _control("-d", op)
    return 0


# --- a real gunicorn worker under valgrind ---------------------------------------------------


def _post(connection: Any, path: str, body: bytes) -> None:
    connection.request("POST", path, body, {"Content-Type": "application/json"})
    answer = connection.getresponse()
    answer.read()
    if answer.status != 200:
        raise SystemExit(f"{path}: {answer.status}")


def _worker_pid(master: int, deadline: float) -> int:
    """The one worker gunicorn forked (valgrind runs it as the master's child)."""
    while time.monotonic() < deadline:
        children = Path(f"/proc/{master}/task/{master}/children")
        pids = children.read_text().split() if children.exists() else []
        if pids:
            return int(pids[0])
        time.sleep(0.2)
    raise SystemExit("gunicorn forked no worker under valgrind")


def under_gunicorn(name: str, args: argparse.Namespace, redis_url: str, out: Path
                   ) -> dict[str, float]:
    """Instructions per request of ``name``'s one gunicorn worker, op by op."""
    import http.client

    import redis

    from app.local import free_port
    from app.store import keys
    from bench.working_memory import (
        BASELINE_PATHS,
        LOOM_PATHS,
        gunicorn_settings,
        op_bodies,
    )

    target, paths = (("wsgi:app", LOOM_PATHS) if name == "loom"
                     else ("bench.baseline_app:app", BASELINE_PATHS))
    port = free_port()
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT), "REDIS_URL": redis_url,
           "LOOM_SECRET_KEY": secrets.token_hex(32), "LOOM_DATA_DIR": str(out / f"{name}-data"),
           "LOOM_AUTH": "off", "LOOM_RATE_LIMIT": "", "LOOM_DEFAULT_ORG": ORG,
           "PROMETHEUS_MULTIPROC_DIR": str(out / f"{name}-metrics")}
    (out / f"{name}-metrics").mkdir(exist_ok=True)
    command = ["valgrind", "--tool=callgrind", "--trace-children=yes",
               f"--log-file={out / name}.valgrind.%p.log",
               f"--callgrind-out-file={out / name}.callgrind.%p", "--dump-instr=no",
               sys.executable, "-m", "gunicorn", target, "--bind", f"127.0.0.1:{port}",
               *gunicorn_settings(1)]
    with open(out / f"{name}.stderr", "wb") as log:
        master = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=log)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    scope = keys.working_memory_scope(ORG, NAMESPACE, "-", "bench", "-", "-")

    def fresh() -> None:
        fresh_blocks(r, scope)

    try:
        deadline = time.monotonic() + 600
        worker = _worker_pid(master.pid, deadline)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        fresh()
        while True:
            try:
                _post(connection, paths["get"], op_bodies("get").body(0, 0))
                break
            except (OSError, http.client.HTTPException):
                if time.monotonic() > deadline:
                    raise
                connection.close()
                time.sleep(0.5)

        def control(*options: str) -> None:
            subprocess.run(["callgrind_control", *options, str(worker)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        control("-z")
        control("-d", "empty")
        for op in args.ops:
            bodies = op_bodies(op)
            fresh()
            for n in range(args.warmup):
                _post(connection, paths[op], bodies.body(0, n))
            fresh()
            control("-z")
            for n in range(args.requests):
                _post(connection, paths[op], bodies.body(0, n))
            control("-d", op)
        connection.close()
    finally:
        master.terminate()
        master.wait(timeout=120)
        r.close()
    counts = read_dumps(out, name)
    empty = counts.get("empty", 0)
    return {op: (counts[op] - empty) / args.requests for op in args.ops}


# --- the driver ---------------------------------------------------------------------------

_DUMP = re.compile(r"^desc: Trigger: .*?dump (\S+)\s*$", re.M)
_SUMMARY = re.compile(r"^summary: (\d+)", re.M)


def read_dumps(out: Path, name: str) -> dict[str, int]:
    """Instructions per dump hint ("empty", "get", ...) from callgrind's files for ``name``."""
    counts: dict[str, int] = {}
    for path in out.glob(f"{name}.callgrind.*"):
        text = path.read_text(errors="replace")
        hint, summary = _DUMP.search(text), _SUMMARY.search(text)
        if hint and summary:
            counts[hint.group(1)] = int(summary.group(1))
    return counts


def start_under_valgrind(name: str, args: argparse.Namespace, redis_url: str, out: Path
                         ) -> subprocess.Popen[bytes]:
    command = [
        "valgrind", "--tool=callgrind", f"--log-file={out / name}.valgrind.log",
        f"--callgrind-out-file={out / name}.callgrind.%p", "--dump-instr=no",
        sys.executable, str(Path(__file__).resolve()), "--child", name,
        "--redis-url", redis_url, "--out", str(out), "--requests", str(args.requests),
        "--warmup", str(args.warmup), "--ops", ",".join(args.ops),
        *([] if args.gevent else ["--no-gevent"]),
    ]
    # Hash seeds fixed: a dict's layout then does not move a count between runs.
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(command, env=env, cwd=ROOT)


def finish_under_valgrind(name: str, process: subprocess.Popen[bytes], began: float,
                          args: argparse.Namespace, out: Path) -> dict[str, float]:
    returncode = process.wait()
    if returncode:
        tail = (out / f"{name}.stderr").read_text()[-3000:] if (
            out / f"{name}.stderr").exists() else ""
        raise SystemExit(f"{name} under valgrind failed ({returncode}):\n{tail}")
    counts = read_dumps(out, name)
    empty = counts.get("empty", 0)
    print(f"  {name}: {time.monotonic() - began:.0f}s under valgrind; "
          f"{empty} instructions in an empty segment", flush=True)
    return {op: (counts[op] - empty) / args.requests for op in args.ops}


def report(per_request: dict[str, dict[str, float]], gunicorn_ir: float,
           whole: bool = False) -> bool:
    met = True
    where = "whole HTTP requests in a gunicorn worker" if whole else "in-process WSGI calls"
    print(f"\nInstructions per request (callgrind Ir; {where}; ratio = "
          "baseline / loom, higher is better for Loom)")
    head = f"  {'op':<8}{'loom':>10}{'baseline':>10}{'loom extra':>12}{'ratio':>8}  target"
    if gunicorn_ir:
        head += f"   ratio with gunicorn's {gunicorn_ir / 1000:.0f}k on both"
    print(head)
    for op in per_request["loom"]:
        loom, base = per_request["loom"][op], per_request["baseline"][op]
        ratio = base / loom if loom else 0.0
        if op in TARGETS:
            verdict = f">= {TARGETS[op]} " + ("ok" if ratio >= TARGETS[op] else "BELOW")
            met &= ratio >= TARGETS[op]
        else:
            verdict = "(req/s target; see below)"
        line = (f"  {op:<8}{loom:>10.0f}{base:>10.0f}{loom - base:>12.0f}{ratio:>8.3f}  "
                f"{verdict}")
        if gunicorn_ir:
            line += f"   {(base + gunicorn_ir) / (loom + gunicorn_ir):.3f}"
        print(line)
    print("  get: both apps send one HGET, so the ratio is Loom's own work; target >= "
          f"{TARGETS['get']}.")
    print("  set and append: the baseline's WATCH/HGET/MULTI/EXEC is three round trips where")
    print("  Loom sends one script; the waits and Redis's own work are not in these counts, so")
    print("  their >= 2 target is for req/s (bench/working_memory.py), not for this ratio.")
    return met


@contextlib.contextmanager
def _redis(workdir: Path) -> Any:
    from app.local import RedisServerProcess

    server = RedisServerProcess(workdir / "redis", appendonly=False).start()
    try:
        yield server.url
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="counted calls per op (300)")
    parser.add_argument("--warmup", type=int, default=200, help="calls before counting (200)")
    parser.add_argument("--ops", default=",".join(OPS), help="get,set,append")
    parser.add_argument("--no-gevent", dest="gevent", action="store_false",
                        help="leave gevent's monkey patching out (the sync worker's view)")
    parser.add_argument("--gunicorn-ir", type=float, default=0.0, metavar="IR",
                        help="gunicorn's own instructions per request, added to both sides "
                             "for a second ratio")
    parser.add_argument("--gunicorn", action="store_true",
                        help="count whole requests in a real gunicorn worker (HTTP included)")
    parser.add_argument("--json", action="store_true", help="also print the counts as JSON")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--child", choices=APPS, help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.ops = [op for op in args.ops.split(",") if op]
    if args.child:
        return child(args)
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not on PATH: apt-get install -y valgrind")
    where = ("HTTP requests to one gevent gunicorn worker" if args.gunicorn
             else "in-process WSGI calls")
    print(f"{where} under callgrind: {args.requests} counted per op after "
          f"{args.warmup} warm-up calls; gevent monkey patching "
          f"{'on' if args.gevent or args.gunicorn else 'off'}; load average "
          f"{os.getloadavg()[0]:.2f} (does not move the counts)")
    given = os.environ.get("REDIS_URL")
    redis_name = results.server_at(given) if given else results.embedded_server()
    at_start = results.machine(redis_name)
    with tempfile.TemporaryDirectory(prefix="loom-ir-") as tmp:
        out = Path(tmp)
        if args.gunicorn:
            with contextlib.ExitStack() as servers:
                per_request = {}
                for name in APPS:
                    url = given or servers.enter_context(_redis(out / name))
                    began = time.monotonic()
                    per_request[name] = under_gunicorn(name, args, url, out)
                    print(f"  {name}: {time.monotonic() - began:.0f}s under valgrind",
                          flush=True)
        elif given:  # one server: one app after the other, each on the same keys
            per_request = {}
            for name in APPS:
                began = time.monotonic()
                process = start_under_valgrind(name, args, given, out)
                per_request[name] = finish_under_valgrind(name, process, began, args, out)
        else:
            # Both at once, each on a redis-server of its own: the counts do not depend on
            # what else runs, and neither app's writes reach the other's keys.
            with contextlib.ExitStack() as servers:
                urls = {name: servers.enter_context(_redis(out / name)) for name in APPS}
                began = time.monotonic()
                running = {name: start_under_valgrind(name, args, urls[name], out)
                           for name in APPS}
                per_request = {name: finish_under_valgrind(name, process, began, args, out)
                               for name, process in running.items()}
    met = report(per_request, args.gunicorn_ir, args.gunicorn)
    if args.json:
        print(json.dumps(per_request))
    print("every target met" if met else "a target was missed (see above)")
    figures = {}
    for op in per_request["loom"]:
        loom, base = per_request["loom"][op], per_request["baseline"][op]
        target = f", target >= {TARGETS[op]}" if op in TARGETS else ""
        figures[op] = (f"loom {loom:,.0f} Ir, baseline {base:,.0f} Ir, ratio "
                       f"{base / loom if loom else 0.0:.3f}{target}")
    figures["verdict"] = "every target met" if met else "a target was missed"
    results.record(
        "instructions" + ("-gunicorn" if args.gunicorn else ""),
        f"Instructions (callgrind Ir) per request of each op, Loom beside the bare baseline app "
        f"({where}, gevent monkey patching {'on' if args.gevent or args.gunicorn else 'off'}), "
        f"{args.requests} counted per op after {args.warmup} warm-up calls; ratio = baseline / "
        f"loom. A busy machine does not move these counts.", figures, redis_name, at_start)
    return 1 if args.strict and not met else 0


if __name__ == "__main__":
    sys.exit(main())
