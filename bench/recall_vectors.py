"""The vector leg's own cost: exact cosine over a user's vectors, and over a namespace's.

    .venv/bin/python bench/recall_vectors.py [--user-facts 10000] [--namespace-facts 100000]
                                            [--users 100] [--dimensions 384] [--queries 50]

Starts its own redis-server on a free loopback port, stores random unit vectors in the form the
embeddings job stores them (``encode_vector``: int8, base64, in each user's
``keys.recall_vectors``) and times ``RecallVectorStore.nearest`` (the first search reads every
vector in scope in one pipeline and decodes it; later ones read each user's generation and
score the kept copy with numpy), for one user holding ``--user-facts`` vectors and for a
namespace of ``--namespace-facts`` spread over ``--users`` users. The query's embedding (one
call to the endpoint) and the lexical leg are not in these figures; bench/recall.py measures
the lexical leg, bench/locomo.py --embeddings the whole search with a real model.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app import create_app  # noqa: E402
from app.local import RedisServerProcess  # noqa: E402
from app.store import keys  # noqa: E402
from app.store.recall_vectors import RecallVectorStore, encode_vector  # noqa: E402

NAMESPACE = "vectors"


def seed(redis_client, org: str, user: str, count: int, dimensions: int,
         rng: np.random.Generator) -> None:
    key = keys.recall_vectors(org, NAMESPACE, user)
    for start in range(0, count, 1000):
        pipe = redis_client.pipeline(transaction=False)
        block = rng.standard_normal((min(1000, count - start), dimensions)).astype(np.float32)
        pipe.hset(key, mapping={f"mem_{user}_{start + i}": encode_vector(v, "0" * 16)
                                for i, v in enumerate(block)})
        pipe.execute()


def timed(store: RecallVectorStore, org: str, users: list[str], dimensions: int,
          queries: int, rng: np.random.Generator) -> tuple[float, float, float]:
    # The first search reads and decodes every vector in scope; later ones reuse the decoded
    # copy while no vector changed (app/store/recall_vectors.py).
    started = time.perf_counter()
    store.nearest(org, NAMESPACE, users, rng.standard_normal(dimensions).tolist(), 70)
    print(f"  first search (reads and decodes every vector): "
          f"{1000 * (time.perf_counter() - started):.0f} ms")
    took = []
    cpu = time.process_time()
    for _ in range(queries):
        query = rng.standard_normal(dimensions).tolist()
        started = time.perf_counter()
        hits = store.nearest(org, NAMESPACE, users, query, 70)
        took.append(time.perf_counter() - started)
        assert hits
    cpu = (time.process_time() - cpu) / queries
    took.sort()
    return (1000 * statistics.median(took), 1000 * took[min(len(took) - 1, int(0.99 * len(took)))],
            1000 * cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--user-facts", type=int, default=10_000)
    parser.add_argument("--namespace-facts", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--dimensions", type=int, default=384)
    parser.add_argument("--queries", type=int, default=50)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory(prefix="loom-vectors-") as tmp:
        workdir = Path(tmp)
        server = RedisServerProcess(workdir / "redis", appendonly=False).start()
        try:
            app = create_app({"redis_url": server.url, "data_dir": str(workdir / "loom"),
                              "secret_key": secrets.token_hex(32)})
            services = app.extensions["loom"]
            org = services.settings.default_org
            store = services.store(RecallVectorStore)
            seed(services.redis, org, "one", args.user_facts, args.dimensions, rng)
            p50, p99, cpu = timed(store, org, ["-", "one"], args.dimensions, args.queries, rng)
            print(f"vector leg, one user, {args.user_facts} vectors of {args.dimensions}: "
                  f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, {cpu:.1f} ms CPU of the app a search")
            users = [f"u{i}" for i in range(args.users)]
            each = args.namespace_facts // args.users
            for user in users:
                seed(services.redis, org, user, each, args.dimensions, rng)
            p50, p99, cpu = timed(store, org, users, args.dimensions,
                                  max(5, args.queries // 5), rng)
            print(f"vector leg, namespace, {each * args.users} vectors over {args.users} users: "
                  f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, {cpu:.1f} ms CPU of the app a search")
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
