"""Redis memory per stored thing: working-memory blocks, profile section versions, fact versions.

    .venv/bin/python bench/memory.py [--count 1000] [--text 200]

Starts its own redis-server on a free loopback port (it empties its database between phases, so
it never uses REDIS_URL) and writes through the Flask app in-process. Each phase starts from an
empty database and reads ``MEMORY USAGE <key> SAMPLES 0`` (every element counted) summed over
every key, so the figures include the indexes and pointers a write adds, not only the row:

- bytes per working-memory block: ``--count`` blocks of ``--text`` characters in one scope,
  and the same spread over ``--count`` users (one scope each);
- bytes per profile section (its first version) and per further version of it;
- bytes per fact (its first version) and per further version of it;
- history growth: one fact rewritten 1, 10, 100 and 1,000 times, the user's total bytes.

Text is ASCII, so characters are bytes; "overhead" is the bytes beyond the text itself. The
figures are kept in ``bench/results/memory.json`` and shown on the site's benchmarks page.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from app import create_app  # noqa: E402
from app.local import RedisServerProcess  # noqa: E402
from bench import results  # noqa: E402

NAMESPACE = "memory"
AGENT = "bench"


class Meter:
    def __init__(self, redis_url: str, workdir: Path) -> None:
        self.r = redis.Redis.from_url(redis_url, decode_responses=True)
        self.app = create_app({"redis_url": redis_url, "data_dir": str(workdir / "loom"),
                               "secret_key": secrets.token_hex(32)})
        self.client = self.app.test_client()

    def post(self, op: str, **body: Any) -> dict[str, Any]:
        response = self.client.post(f"/v1/{op}",
                                    json={"namespace": NAMESPACE, "agent": AGENT, **body})
        if response.status_code != 200:
            raise RuntimeError(f"{op}: {response.status_code} {response.get_json()}")
        return response.get_json()

    def empty(self) -> None:
        self.r.flushdb()

    def bytes_used(self) -> int:
        total = 0
        for key in self.r.scan_iter(count=1000):
            total += self.r.memory_usage(key, samples=0) or 0
        return total


def text_of(n: int, size: int) -> str:
    return (f"{n:06d} " + "The user prefers short answers and metric units. " * 50)[:size]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000, help="things per phase (1000)")
    parser.add_argument("--text", type=int, default=200, help="characters of text each (200)")
    parser.add_argument("--versions", type=int, default=10,
                        help="versions per section and fact (10)")
    args = parser.parse_args(argv)
    count, size, versions = args.count, args.text, args.versions
    rows = max(1, count // versions)
    with tempfile.TemporaryDirectory(prefix="loom-memory-") as tmp:
        workdir = Path(tmp)
        server = RedisServerProcess(workdir / "redis", appendonly=False).start()
        try:
            meter = Meter(server.url, workdir)
            redis_name = results.server_name(meter.r.info("server"))
            at_start = results.machine(redis_name)
            figures: dict[str, str] = {}
            print(f"{redis_name}; text of {size} "
                  f"characters; MEMORY USAGE SAMPLES 0 summed over every key\n")

            meter.empty()
            for n in range(count):
                meter.post("working_memory.set", block_key=f"block-{n}",
                           content=text_of(n, size))
            one_scope = meter.bytes_used() / count
            meter.empty()
            for n in range(count):
                meter.post("working_memory.set", block_key="state", user_id=f"u-{n}",
                           content=text_of(n, size))
            own_scopes = meter.bytes_used() / count
            print(f"working-memory block: {one_scope:6.0f} bytes each in one scope "
                  f"(overhead {one_scope - size:.0f}), {own_scopes:6.0f} in a scope of its own "
                  f"(overhead {own_scopes - size:.0f})")
            figures["working-memory block, in a shared scope"] = (
                f"{one_scope:,.0f} B ({one_scope - size:,.0f} beyond its text)")
            figures["working-memory block, in a scope of its own"] = (
                f"{own_scopes:,.0f} B ({own_scopes - size:,.0f} beyond its text)")

            for kind, op, field in (("profile section", "profile.set", "label"),
                                    ("fact", "memory.set", "key")):
                meter.empty()
                for n in range(rows):
                    meter.post(op, user_id="u-1", **{field: f"row-{n}", "value": text_of(n, size)})
                first = meter.bytes_used()
                for v in range(1, versions):
                    for n in range(rows):
                        meter.post(op, user_id="u-1",
                                   **{field: f"row-{n}", "value": text_of(n + v, size)})
                later = meter.bytes_used()
                per_row = first / rows
                per_version = (later - first) / (rows * (versions - 1))
                print(f"{kind}: {per_row:6.0f} bytes for its first version (overhead "
                      f"{per_row - size:.0f}), {per_version:6.0f} per further version "
                      f"(overhead {per_version - size:.0f}); {rows} rows x {versions} versions")
                figures[f"{kind}, first version"] = f"{per_row:,.0f} B"
                figures[f"{kind}, each further version"] = f"{per_version:,.0f} B"

            meter.empty()
            growth = []
            written = 0
            for target in (1, 10, 100, 1000):
                while written < target:
                    meter.post("memory.set", user_id="u-1", key="city",
                               value=text_of(written, size))
                    written += 1
                growth.append((target, meter.bytes_used()))
            print("history growth of one fact rewritten (the user's bytes): " + ", ".join(
                f"{n} writes {b:,} B" for n, b in growth)
                + f"; {(growth[-1][1] - growth[-2][1]) / 900:.0f} bytes per write at the end")
            figures["one fact rewritten 1 / 10 / 100 / 1,000 times, the user's bytes"] = (
                " / ".join(f"{b:,} B" for _, b in growth)
                + f" ({(growth[-1][1] - growth[-2][1]) / 900:,.0f} B a write at the end)")
            meter.r.close()
            results.record(
                "memory", f"Redis bytes (MEMORY USAGE, every key a write touched) per stored "
                f"thing, text of {size} characters, through the Flask app in-process; "
                f"{count} blocks, {rows} rows x {versions} versions.", figures, redis_name,
                at_start)
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
