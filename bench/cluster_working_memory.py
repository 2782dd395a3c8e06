"""Working-memory get, set and append through gunicorn: Loom on one Redis beside Loom on a
three-primary Redis Cluster, in the same run.

    .venv/bin/python bench/cluster_working_memory.py [--seconds 3] [--rounds 2] [--connections 8]

What one run does:

1. Starts its own redis-server (the single-server data plane), a three-primary cluster from the
   same binary (``LOOM_REDIS_CLUSTER=on``) and a plain queue server for the cluster's RQ, all on
   free loopback ports with append-only off.
2. Serves Loom (``wsgi:app``) twice with the same gunicorn settings as
   ``bench/working_memory.py``: once on the single server, once on the cluster.
3. Drives each op with the same bounded load client (``wrk`` when on PATH, else the Python
   client), alternating the two deployments op by op for several rounds, and prints the median
   req/s of each and the median per-round ratio cluster/single.

Each connection writes as its own user (``user_id`` u-<connection>), so on the cluster the
load reaches every primary; the single server serves the same users. The figure is the cost of
the cluster client (slot routing, one connection pool per primary) and of three server
processes sharing the cores with gunicorn and the load client: absolute req/s mean little on a
shared machine, the ratio measured in one run is the result.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from app.local import RedisServerProcess  # noqa: E402
from app.store import keys  # noqa: E402
from bench import results  # noqa: E402
from bench.working_memory import (  # noqa: E402
    AGENT,
    LOOM_PATHS,
    NAMESPACE,
    NOTE_TEXT,
    OPS,
    ORG,
    SPREAD_BLOCKS,
    Bodies,
    Gunicorn,
    LoadResult,
    gunicorn_settings,
    python_load,
)
from tests.support.cluster import RedisClusterProcess  # noqa: E402


@dataclass(frozen=True)
class UserBodies(Bodies):
    """The n-th request of connection ``writer``: the op's body as user ``u-<writer>``
    (appends spread over SPREAD_BLOCKS blocks so none fills)."""

    op: str = "get"

    def body(self, writer: int, n: int) -> bytes:
        fields: dict[str, object] = {"namespace": NAMESPACE, "agent": AGENT,
                                     "user_id": f"u-{writer}"}
        if self.op == "get":
            fields["block_key"] = "note"
        elif self.op == "set":
            fields.update(block_key="note", content=NOTE_TEXT)
        else:
            fields.update(block_key=f"log{n % SPREAD_BLOCKS:02d}", addition="x")
        return json.dumps(fields, separators=(",", ":")).encode()


@dataclass
class Deployment:
    name: str
    data: redis.Redis
    server: Gunicorn

    def reset(self, users: int) -> None:
        """Every bench key gone, then each user's block that get reads and set overwrites.

        On the cluster the client's SCAN visits every primary and DEL goes key by key's slot."""
        doomed = list(self.data.scan_iter(match=f"loom:wm*:{{{ORG}/{NAMESPACE}/*", count=1000))
        for key in doomed:
            self.data.delete(key)
        for writer in range(users):
            user = f"u-{writer}"
            scope = keys.working_memory_scope(ORG, NAMESPACE, user, AGENT, "-", "-")
            self.data.hset(scope, "note", f"{time.time_ns()}:4096:{len(NOTE_TEXT)}:{NOTE_TEXT}")
            self.data.sadd(keys.working_memory_scopes(ORG, NAMESPACE, user), scope)


def run_load(pool: ProcessPoolExecutor, port: int, op: str, connections: int,
             seconds: float) -> LoadResult:
    """The Python load client in its own process (wrk cannot give each connection a user)."""
    return pool.submit(python_load, port, LOOM_PATHS[op], UserBodies(head="", op=op), connections,
                       seconds).result()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3, help="length of one load run (3)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per op and deployment (2)")
    parser.add_argument("--connections", type=int, default=8, help="concurrent connections (8)")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers per app (2)")
    parser.add_argument("--worker-class", default="gevent", choices=("gevent", "gthread", "sync"))
    args = parser.parse_args(argv)

    settings = gunicorn_settings(args.workers, args.worker_class)
    print(f"cores: {os.cpu_count()}; both deployments, their Redis processes and the load "
          "client share them")
    print(f"load: Python client, {args.connections} connections (one user each), "
          f"{args.seconds:g}s per run, {args.rounds} rounds; gunicorn: {' '.join(settings)}")
    started = time.monotonic()
    pool = ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"))
    with tempfile.TemporaryDirectory(prefix="loom-bench-cluster-") as tmp:
        work = Path(tmp)
        single = RedisServerProcess(work / "single", appendonly=False).start()
        queue = RedisServerProcess(work / "queue", appendonly=False).start()
        cluster = RedisClusterProcess(work / "cluster", primaries=3).start()
        deployments: list[Deployment] = []
        redis_name = results.server_at(single.url)
        at_start = results.machine(redis_name)
        try:
            base_env = {"LOOM_SECRET_KEY": secrets.token_hex(32), "LOOM_AUTH": "off",
                        "LOOM_RATE_LIMIT": "", "LOOM_DEFAULT_ORG": ORG}
            plans = [
                ("single", {"REDIS_URL": single.url},
                 redis.Redis.from_url(single.url, decode_responses=True)),
                ("cluster", {"REDIS_URL": cluster.url, "LOOM_REDIS_CLUSTER": "on",
                             "LOOM_QUEUE_URL": queue.url},
                 redis.RedisCluster.from_url(cluster.url, decode_responses=True)),
            ]
            for name, env, data in plans:
                server = Gunicorn(name, "wsgi:app",
                                  {**base_env, **env, "LOOM_DATA_DIR": str(work / name)},
                                  work, settings).start()
                deployments.append(Deployment(name, data, server))  # type: ignore[arg-type]
            for op in OPS:  # warm every worker and the scripts' caches
                for deployment in deployments:
                    deployment.reset(args.connections)
                    run_load(pool, deployment.server.port, op, args.connections, 1)
            rates: dict[str, dict[str, list[float]]] = {
                op: {d.name: [] for d in deployments} for op in OPS}
            print("\nThroughput runs")
            for round_no in range(args.rounds):
                order = deployments if round_no % 2 == 0 else deployments[::-1]
                for op in OPS:
                    for deployment in order:
                        deployment.reset(args.connections)
                        result = run_load(pool, deployment.server.port, op,
                                          args.connections, args.seconds)
                        rates[op][deployment.name].append(result.rate)
                        bad = (f"  ({result.failed} non-200, {result.errors} socket errors)"
                               if result.failed or result.errors else "")
                        print(f"  round {round_no + 1} {op:<6} {deployment.name:<8}"
                              f"{result.rate:7.0f} req/s{bad}", flush=True)
            spread = cluster.keys_per_primary()
        finally:
            for deployment in deployments:
                deployment.server.stop()
                deployment.data.close()
            pool.shutdown()
            cluster.stop()
            queue.stop()
            single.stop()

    print("\nWorking memory, one server vs three-primary cluster (median of rounds; ratio = "
          "median of the per-round cluster/single req/s)")
    print(f"  {'op':<8}{'single req/s':>13}{'cluster req/s':>14}{'ratio':>8}")
    figures = {}
    for op in OPS:
        one, many = rates[op]["single"], rates[op]["cluster"]
        ratio = statistics.median([c / s for s, c in zip(one, many, strict=True) if s])
        print(f"  {op:<8}{statistics.median(one):>13.0f}{statistics.median(many):>14.0f}"
              f"{ratio:>8.3f}")
        figures[op] = (f"single {statistics.median(one):,.0f} req/s, cluster "
                       f"{statistics.median(many):,.0f} req/s, ratio {ratio:.3f}")
    print(f"  keys per cluster primary at the end: {sorted(spread.values())}")
    figures["keys per cluster primary at the end"] = ", ".join(map(str, sorted(spread.values())))
    results.record(
        "cluster_working_memory", f"Working-memory get, set and append through gunicorn "
        f"({args.workers} {args.worker_class} workers), Loom on one server beside Loom on a "
        f"three-primary cluster of the same binary, the Python client with {args.connections} "
        f"connections (a user each), {args.rounds} rounds of {args.seconds:g} s, alternated; "
        f"ratio = median of the per-round cluster/single req/s.", figures, redis_name, at_start)
    print(f"\ntotal {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
