"""What the fast argument loader (``app.schemas.fastload``) saves, next to a Redis round trip,
and what checking every answer against the OpenAPI document costs.

    .venv/bin/python bench/fastload.py [--calls 3000] [--rounds 3]

Starts its own embedded server on a free loopback port (append-only off), unless REDIS_URL is
set (then it writes only under the namespace ``bench``). Prints, for the working-memory ops'
argument schemas:

1. the µs per call of loading a typical body with the fast loader and with marshmallow's
   ``Schema.load`` (what every op would use without it), beside the µs of one Redis PING
   round trip on loopback;
2. the working-memory throughput and Loom's CPU per request, in-process through the whole
   Flask app (test client, real Redis), with and without the fast loader, rounds alternated,
   medians printed.

3. the same throughput and CPU with ``LOOM_VALIDATE_ANSWERS`` on and off (every answer checked
   against the OpenAPI document), the cost that decides where the check runs.

In-process on purpose: gunicorn, the HTTP client and the sockets add the same cost to both, and
on a shared machine they would drown a difference of a few µs in noise. The figures are kept in
``bench/results/fastload.json`` and shown on the site's benchmarks page.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import os  # noqa: E402

import redis  # noqa: E402
from marshmallow import EXCLUDE, Schema  # noqa: E402

from app import api, create_app  # noqa: E402
from app.local import RedisServerProcess  # noqa: E402
from app.ops import working_memory as wm  # noqa: E402
from app.schemas.fastload import compile_loader  # noqa: E402
from bench import results  # noqa: E402

WHO = {"namespace": "bench", "agent": "bench", "run_id": "run-1"}
BODIES: dict[str, tuple[type[Schema], dict[str, Any]]] = {
    "working_memory.get": (wm.WorkingMemoryKeyArgs, {**WHO, "block_key": "state"}),
    "working_memory.set": (wm.WorkingMemorySetArgs,
                           {**WHO, "block_key": "state", "content": "cursor: ticket 4812"}),
    "working_memory.append": (wm.WorkingMemoryAppendArgs,
                              {**WHO, "block_key": "log", "addition": "step done"}),
    "working_memory.render": (wm.WorkingMemoryRenderArgs, {**WHO, "format": "xml"}),
}


def _per_call_us(call: Callable[[], Any], calls: int, clock: Callable[[], float] = time.perf_counter
                 ) -> float:
    started = clock()
    for _ in range(calls):
        call()
    return (clock() - started) / calls * 1e6


def _slow_compile(schema: Schema) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda body: schema.load(body, unknown=EXCLUDE)


def _use_loader(compile_: Callable[[Schema], Any]) -> None:
    api._loader.cache_clear()
    api.compile_loader = compile_  # type: ignore[assignment]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="loom-bench-fastload-") as tmp:
        server = None
        url = os.environ.get("REDIS_URL")
        if not url:
            server = RedisServerProcess(Path(tmp) / "redis", appendonly=False).start()
            url = server.url
        try:
            client = redis.Redis.from_url(url)
            redis_name = results.server_name(client.info("server"))
            at_start = results.machine(redis_name)
            figures: dict[str, str] = {}
            ping = min(_per_call_us(client.ping, options.calls) for _ in range(options.rounds))
            print(f"redis PING round trip: {ping:.1f} µs")
            figures["Redis PING round trip on loopback"] = f"{ping:.1f} µs"
            for name, (schema_class, body) in BODIES.items():
                schema = schema_class()
                fast, slow = compile_loader(schema), _slow_compile(schema)
                assert fast(body) == slow(body), name
                fast_us = min(_per_call_us(functools.partial(fast, body), options.calls)
                              for _ in range(options.rounds))
                slow_us = min(_per_call_us(functools.partial(slow, body), options.calls)
                              for _ in range(options.rounds))
                print(f"{name:24} load: fast {fast_us:5.1f} µs  marshmallow {slow_us:5.1f} µs  "
                      f"saves {slow_us - fast_us:5.1f} µs ({(slow_us - fast_us) / ping:.2f} "
                      f"PINGs)")
                figures[f"{name}: loading its body, fast / marshmallow"] = (
                    f"{fast_us:.1f} / {slow_us:.1f} µs (saves {(slow_us - fast_us) / ping:.2f} "
                    f"PINGs)")

            app = create_app({"redis_url": url, "data_dir": tmp, "secret_key": "bench"})
            web = app.test_client()
            calls = max(options.calls // 3, 200)
            for name, (_schema, body) in BODIES.items():
                path = f"/v1/{name}"
                assert web.post(path, json=body).status_code == 200, name
                # An append block starts empty each round and holds 4096 characters.
                count = min(calls, 350) if name == "working_memory.append" else calls
                rates: dict[str, list[float]] = {"fast": [], "marshmallow": []}
                cpu: dict[str, list[float]] = {"fast": [], "marshmallow": []}
                for _ in range(options.rounds):
                    for label, compile_ in (("fast", compile_loader),
                                            ("marshmallow", _slow_compile)):
                        _use_loader(compile_)
                        if name == "working_memory.append":
                            web.post("/v1/working_memory.delete",
                                     json={**WHO, "block_key": "log"})
                        started = time.process_time()
                        us = _per_call_us(functools.partial(web.post, path, json=body), count)
                        rates[label].append(1e6 / us)
                        cpu[label].append((time.process_time() - started) / count * 1e6)
                fast_rate = statistics.median(rates["fast"])
                slow_rate = statistics.median(rates["marshmallow"])
                print(f"{name:24} in-process: fast {fast_rate:6.0f} req/s "
                      f"({statistics.median(cpu['fast']):4.0f} µs CPU)  marshmallow "
                      f"{slow_rate:6.0f} req/s ({statistics.median(cpu['marshmallow']):4.0f} µs "
                      f"CPU)  ratio {fast_rate / slow_rate:.3f}")
                figures[f"{name}: in-process req/s, fast / marshmallow"] = (
                    f"{fast_rate:,.0f} / {slow_rate:,.0f} (ratio {fast_rate / slow_rate:.3f}); "
                    f"CPU {statistics.median(cpu['fast']):.0f} / "
                    f"{statistics.median(cpu['marshmallow']):.0f} µs a request")
            _use_loader(compile_loader)

            checked = create_app({"redis_url": url, "data_dir": tmp, "secret_key": "bench",
                                  "validate_answers": True}).test_client()
            for name, (_schema, body) in BODIES.items():
                if name == "working_memory.append":
                    continue  # a write that grows its block: set and get stand for the writes
                path = f"/v1/{name}"
                assert checked.post(path, json=body).status_code == 200, name
                rates = {"off": [], "on": []}
                cpu = {"off": [], "on": []}
                for _ in range(options.rounds):
                    for label, web_app in (("off", web), ("on", checked)):
                        started = time.process_time()
                        us = _per_call_us(functools.partial(web_app.post, path, json=body), calls)
                        rates[label].append(1e6 / us)
                        cpu[label].append((time.process_time() - started) / calls * 1e6)
                off_cpu, on_cpu = statistics.median(cpu["off"]), statistics.median(cpu["on"])
                print(f"{name:24} answer check: off {statistics.median(rates['off']):6.0f} req/s "
                      f"({off_cpu:4.0f} µs CPU)  on {statistics.median(rates['on']):6.0f} req/s "
                      f"({on_cpu:4.0f} µs CPU)  costs {on_cpu - off_cpu:4.0f} µs CPU a request")
                figures[f"{name}: LOOM_VALIDATE_ANSWERS off / on, CPU a request"] = (
                    f"{off_cpu:.0f} / {on_cpu:.0f} µs (costs {on_cpu - off_cpu:.0f} µs)")
            results.record(
                "fastload", f"The fast argument loader beside marshmallow's Schema.load and one "
                f"Redis round trip, and the answer check's cost, in-process through the Flask "
                f"app (test client, real Redis); {options.calls} calls, best or median of "
                f"{options.rounds} rounds.", figures, redis_name, at_start)
        finally:
            if server is not None:
                server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
