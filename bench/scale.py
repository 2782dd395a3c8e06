"""Profile reads at scale: the same reads in a namespace with one user and in one with 10,000
sections of other users, through gunicorn, in the same run.

    .venv/bin/python bench/scale.py [--seconds 3] [--rounds 3] [--others 10000]

What one run does:

1. Starts its own redis-server on a free loopback port (append-only off), unless REDIS_URL is
   set (then it writes under the namespaces ``scale-small`` and ``scale-large``).
2. Writes the same answer into both namespaces: a namespace-level ``persona``, the user's
   ``preferences`` and ``notes`` and one working-memory block. Into ``scale-large`` it also
   writes ``--others`` sections of other users (four labels each, ``bio``, ``tone``, ``goals``
   and ``history``, by two agents), so that no measured read answers any of them.
3. Serves Loom (``wsgi:app``, 2 sync workers) and drives each read with the Python load client
   of bench/working_memory.py (N threads on raw HTTP/1.1 sockets, a separate process),
   alternating small and large namespace, read by read, for several rounds:
   - ``render labels own_user``: profile.render, labels persona and preferences, own_user;
   - ``render own_user``: profile.render of every section the user can see;
   - ``render labels namespace``: the two labels across the whole namespace;
   - ``pack own_user``: context.pack (working memory and profile) for the user.
4. Prints each rate, the median ratio large/small per read (target >= 0.8), and the Redis round
   trips and commands per request of each read in each namespace (CONFIG RESETSTAT, K
   requests, INFO), so a read whose cost follows the namespace shows it twice.

The figures are kept in ``bench/results/scale.json`` and shown on the site's benchmarks page.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import requests  # noqa: E402

from app import create_app  # noqa: E402
from app.store.memory import PROFILE_TYPE, Content, Location, MemoryStore  # noqa: E402
from bench import results  # noqa: E402
from bench.working_memory import (  # noqa: E402
    Bodies,
    Gunicorn,
    gunicorn_settings,
    python_load,
    redis_for_bench,
)

ORG = "default"
USER = "u-42"
AGENT = "triage-bot"
SMALL, LARGE = "scale-small", "scale-large"
FILLER_LABELS = ("bio", "tone", "goals", "history")
FILLER_AGENTS = ("chat-bot", "mail-bot")
TARGET_RATIO = 0.8
ROUND_TRIP_REQUESTS = 100
READS: dict[str, tuple[str, dict[str, Any]]] = {
    "render labels own_user": ("profile.render", {
        "labels": ["persona", "preferences"], "read_scope": "own_user", "user_id": USER}),
    "render own_user": ("profile.render", {"read_scope": "own_user", "user_id": USER}),
    "render labels namespace": ("profile.render", {
        "labels": ["persona", "preferences"], "user_id": USER}),
    "pack own_user": ("context.pack", {"read_scope": "own_user", "user_id": USER}),
}


def body(namespace: str, fields: dict[str, Any]) -> bytes:
    return json.dumps({"namespace": namespace, "agent": AGENT, **fields},
                      separators=(",", ":")).encode()


def fill(redis_url: str, workdir: Path, others: int) -> None:
    """The answer in both namespaces, and ``others`` sections of other users in the large one."""
    app = create_app({"redis_url": redis_url, "data_dir": str(workdir / "fill"),
                      "secret_key": secrets.token_hex(32)})
    client = app.test_client()
    for namespace in (SMALL, LARGE):
        who = {"namespace": namespace, "agent": AGENT}
        for op, fields in (
            ("profile.set", {"label": "persona", "value": "Terse. Cite ticket ids."}),
            ("profile.set", {"label": "preferences", "value": "Prefers EUR invoices.",
                             "user_id": USER}),
            ("profile.set", {"label": "notes", "value": "Asked about refunds twice.",
                             "user_id": USER}),
            ("working_memory.set", {"block_key": "state", "content": "ticket 4812 open",
                                    "user_id": USER}),
        ):
            response = client.post(f"/v1/{op}", json={**who, **fields})
            assert response.status_code == 200, response.get_json()
    store = app.extensions["loom"].store(MemoryStore)
    per_user = len(FILLER_LABELS) * len(FILLER_AGENTS)
    started = time.monotonic()
    for n in range(others):
        user_id = f"other-{n // per_user:05d}"
        label = FILLER_LABELS[n % len(FILLER_LABELS)]
        agent = FILLER_AGENTS[(n // len(FILLER_LABELS)) % len(FILLER_AGENTS)]
        store.set(Location(ORG, LARGE, user_id, agent, "-", label),
                  Content(memory_type=PROFILE_TYPE, value=f"{label} of {user_id} by {agent}",
                          actor=agent),
                  written_by=agent, default_char_limit=8192)
    print(f"filled {others} sections of {others // per_user} other users in "
          f"{time.monotonic() - started:.0f}s")


def round_trips(r: redis.Redis, url: str, payload: bytes) -> tuple[float, float]:
    headers = {"Content-Type": "application/json"}
    with requests.Session() as session:
        for _ in range(3):
            session.post(url, data=payload, headers=headers, timeout=10)
        r.config_resetstat()
        for _ in range(ROUND_TRIP_REQUESTS):
            response = session.post(url, data=payload, headers=headers, timeout=10)
            if response.status_code != 200:
                raise RuntimeError(f"{url}: {response.status_code} {response.text}")
        info = r.info("all")
    commands = sum(stats["calls"] for name, stats in info.items()
                   if name.startswith("cmdstat_") and isinstance(stats, dict)
                   and name not in ("cmdstat_info", "cmdstat_config|resetstat"))
    reads = int(info.get("total_reads_processed", 1)) - 1
    return reads / ROUND_TRIP_REQUESTS, commands / ROUND_TRIP_REQUESTS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3, help="length of one load run (3)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per read (3)")
    parser.add_argument("--connections", type=int, default=8, help="connections (8)")
    parser.add_argument("--others", type=int, default=10000,
                        help="other users' sections in the large namespace (10000)")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn sync workers (2)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)

    print(f"gunicorn: {' '.join(gunicorn_settings(args.workers))}; Python load client, "
          f"{args.connections} connections, {args.seconds}s per run, {args.rounds} rounds")
    rates: dict[str, dict[str, list[float]]] = {
        name: {SMALL: [], LARGE: []} for name in READS}
    trips: dict[str, dict[str, tuple[float, float]]] = {name: {} for name in READS}
    with tempfile.TemporaryDirectory(prefix="loom-scale-") as tmp:
        workdir = Path(tmp)
        with redis_for_bench(workdir) as redis_url:
            with redis.Redis.from_url(redis_url) as info_client:
                redis_name = results.server_name(info_client.info("server"))
            at_start = results.machine(redis_name)
            fill(redis_url, workdir, args.others)
            env = {"REDIS_URL": redis_url, "LOOM_SECRET_KEY": secrets.token_hex(32),
                   "LOOM_DATA_DIR": str(workdir / "loom"), "LOOM_AUTH": "off",
                   "LOOM_RATE_LIMIT": "", "LOOM_DEFAULT_ORG": ORG}
            server = Gunicorn("loom", "wsgi:app", env, workdir, gunicorn_settings(args.workers))
            pool = ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"))
            r = redis.Redis.from_url(redis_url, decode_responses=True)
            try:
                server.start()
                for name, (op, fields) in READS.items():
                    for namespace in (SMALL, LARGE):
                        trips[name][namespace] = round_trips(
                            r, f"{server.url}/v1/{op}", body(namespace, fields))
                        pool.submit(python_load, server.port, f"/v1/{op}",  # warm
                                    Bodies(body(namespace, fields).decode()),
                                    args.connections, 0.5).result()
                for round_no in range(args.rounds):
                    order = (SMALL, LARGE) if round_no % 2 == 0 else (LARGE, SMALL)
                    for name, (op, fields) in READS.items():
                        for namespace in order:
                            result = pool.submit(
                                python_load, server.port, f"/v1/{op}",
                                Bodies(body(namespace, fields).decode()), args.connections,
                                args.seconds).result()
                            if result.failed or result.errors:
                                raise RuntimeError(f"{name} {namespace}: {result.failed} "
                                                   f"non-200, {result.errors} socket errors")
                            rates[name][namespace].append(result.rate)
                            print(f"  round {round_no + 1} {name:<24} {namespace:<12} "
                                  f"{result.rate:7.0f} req/s", flush=True)
            finally:
                pool.shutdown()
                server.stop()
                r.close()

    print(f"\nScale: 1 user vs {args.others} sections of other users (median of "
          f"{args.rounds} rounds; ratio = median of the per-round large/small ratios)")
    met = True
    figures: dict[str, str] = {}
    for name in READS:
        small, large = rates[name][SMALL], rates[name][LARGE]
        ratio = statistics.median(b / a for a, b in zip(small, large, strict=True))
        met &= ratio >= TARGET_RATIO
        (rt_small, cmd_small), (rt_large, cmd_large) = trips[name][SMALL], trips[name][LARGE]
        print(f"  {name:<24} small {statistics.median(small):6.0f} req/s  large "
              f"{statistics.median(large):6.0f} req/s  ratio {ratio:4.2f} "
              f"({'ok' if ratio >= TARGET_RATIO else 'MISSED'} >= {TARGET_RATIO}); "
              f"round trips/req {rt_small:.1f} vs {rt_large:.1f}, "
              f"commands/req {cmd_small:.1f} vs {cmd_large:.1f}")
        figures[name] = (
            f"{statistics.median(small):,.0f} / {statistics.median(large):,.0f} req/s, ratio "
            f"{ratio:.2f} (target {TARGET_RATIO}); round trips {rt_small:.1f} / {rt_large:.1f}, "
            f"commands {cmd_small:.1f} / {cmd_large:.1f} a request")
    print("every target met" if met else "a target was missed")
    figures["verdict"] = "every target met" if met else "a target was missed"
    results.record(
        "scale", f"Profile reads through gunicorn ({args.workers} workers) in a namespace with "
        f"one user and in one with {args.others:,} sections of other users, alternated, "
        f"{args.rounds} rounds of {args.seconds:g} s; each figure small / large namespace.",
        figures, redis_name, at_start)
    return 1 if args.strict and not met else 0


if __name__ == "__main__":
    sys.exit(main())
