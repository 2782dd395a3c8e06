"""bench: how each gunicorn worker class answers while 50 clients send their headers slowly.

Starts Loom under gunicorn with the sync, gthread and gevent worker classes in turn (each
with the worker count, threads and connections ``gunicorn.conf.py`` would give it on this
machine), opens 50 connections that send one header line every 3 s, and meanwhile times
``working_memory.get`` from a well-behaved client: its worst and median latency, and how
many probes got no answer within 1 s. Loopback only; every run is bounded in time.

    .venv/bin/python bench/slow_clients.py [--seconds 12] [--slow 50]

The figures are kept in ``bench/results/slow_clients.json`` and shown on the site's benchmarks
page.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from app.local import RedisServerProcess, die_with_parent, free_port  # noqa: E402
from bench import results  # noqa: E402

BLOCK = {"namespace": "bench", "agent": "a", "run_id": "r", "block_key": "state"}


def start_gunicorn(worker_class: str, redis_url: str,
                   data_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": redis_url,
           "LOOM_DATA_DIR": str(data_dir), "LOOM_SECRET_KEY": "bench-secret",
           "LOOM_WEB_WORKER_CLASS": worker_class}
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "wsgi:app", "--config", "gunicorn.conf.py",
         "--bind", f"127.0.0.1:{port}"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            requests.post(url + "/v1/working_memory.set", json={**BLOCK, "content": "x"},
                          timeout=2)
            return process, url
        except requests.RequestException:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"gunicorn ({worker_class}) did not start")


def slow_client(port: int, stop: threading.Event, interval: float) -> None:
    """Send a request line, then one header line every ``interval`` seconds, never finishing."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        return
    try:
        sock.sendall(b"POST /v1/working_memory.get HTTP/1.1\r\nHost: x\r\n")
        n = 0
        while not stop.wait(interval):
            sock.sendall(f"X-Slow-{n}: 1\r\n".encode())
            n += 1
    except OSError:
        pass
    finally:
        sock.close()


def measure(worker_class: str, redis_url: str, data_dir: Path, slow: int, seconds: float,
            interval: float) -> dict[str, float]:
    process, url = start_gunicorn(worker_class, redis_url, data_dir)
    port = int(url.rsplit(":", 1)[1])
    stop = threading.Event()
    threads = [threading.Thread(target=slow_client, args=(port, stop, interval), daemon=True)
               for _ in range(slow)]
    latencies: list[float] = []
    late = 0
    try:
        for thread in threads:
            thread.start()
        time.sleep(1.0)  # every slow client connected and holding its request open
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                # A new connection each time, as a router would open one.
                requests.post(url + "/v1/working_memory.get", json=BLOCK, timeout=1.0,
                              headers={"Connection": "close"})
                latencies.append(time.monotonic() - started)
            except requests.RequestException:
                late += 1
                latencies.append(1.0)
            time.sleep(0.05)
    finally:
        stop.set()
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
    return {"probes": len(latencies), "no_answer_within_1s": late,
            "median_ms": statistics.median(latencies) * 1000,
            "worst_ms": max(latencies) * 1000}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--slow", type=int, default=50)
    parser.add_argument("--interval", type=float, default=3.0)
    parser.add_argument("--classes", default="sync,gthread,gevent")
    args = parser.parse_args()
    data_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"loom-bench-slow-{os.getpid()}"
    with RedisServerProcess(data_dir / "redis", appendonly=False) as server:
        redis_name = results.server_name(redis.Redis.from_url(server.url).info("server"))
        at_start = results.machine(redis_name)
        figures: dict[str, str] = {}
        print(f"{args.slow} slow clients (a header line every {args.interval:g} s), "
              f"probing working_memory.get for {args.seconds:g} s")
        print(f"{'worker class':<14}{'probes':>8}{'no answer <1s':>15}{'median ms':>11}"
              f"{'worst ms':>10}")
        for worker_class in args.classes.split(","):
            row = measure(worker_class, server.url, data_dir, args.slow, args.seconds,
                          args.interval)
            print(f"{worker_class:<14}{row['probes']:>8}{row['no_answer_within_1s']:>15}"
                  f"{row['median_ms']:>11.1f}{row['worst_ms']:>10.1f}")
            figures[f"{worker_class}: probes answered within 1 s"] = (
                f"{row['probes'] - row['no_answer_within_1s']} of {row['probes']}; median "
                f"{row['median_ms']:.1f} ms, worst {row['worst_ms']:.1f} ms")
    results.record(
        "slow_clients", f"Loom under gunicorn with each worker class ({args.classes}), the "
        f"worker counts gunicorn.conf.py gives this machine, while {args.slow} clients send a "
        f"header line every {args.interval:g} s; a well-behaved client probes "
        f"working_memory.get on new connections for {args.seconds:g} s.", figures, redis_name,
        at_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
