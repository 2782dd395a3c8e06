"""Where a bench run keeps its figures: ``bench/results/<bench>.json``, with the machine and the
date it ran on, and the site's benchmarks page (``docs/benchmarks.md``) rewritten from every
result file, so no figure on the site is typed by hand.

A bench script calls ``record(...)`` once at the end of a run with the figures it printed, as
label -> text. ``python -m app.docs_reference --check`` fails while the page is behind the
result files.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app import docs_reference  # noqa: E402


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def server_name(info: dict[str, object]) -> str:
    """The server a run measured, from its ``INFO server``: Valkey reports a redis_version of
    7.2.4 whatever its own version, so its own name and version come first."""
    if "valkey_version" in info:
        return f"Valkey {info['valkey_version']} (redis_version {info.get('redis_version')})"
    return f"Redis {info.get('redis_version')}"


def server_at(url: str) -> str:
    """``server_name`` of the server answering at ``url`` (a plain server or a cluster node)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        return server_name(client.info("server"))
    finally:
        client.close()


def embedded_server() -> str:
    """The embedded server's name and version from its ``--version``: for a run whose server
    is stopped, or restarted, before its figures are printed."""
    from app.local import embedded_server_binary

    out = subprocess.run([embedded_server_binary(), "--version"], capture_output=True,
                         text=True, check=True).stdout
    found = re.search(r"^(\w+) server v=(\S+)", out)
    return f"{found[1]} {found[2]} (embedded)" if found else out.strip()


def machine(redis: str) -> dict[str, object]:
    """The machine a run is on, as the page prints it; ``redis`` names the server measured."""
    return {
        "cpu": _cpu(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "python": platform.python_version(),
        "redis": redis,
        "load_average": round(os.getloadavg()[0], 1),
    }


def record(bench: str, what: str, figures: dict[str, str], redis: str,
           at_start: dict[str, object] | None = None) -> Path:
    """Write ``bench/results/<bench>.json`` for this run and rewrite the benchmarks page.

    ``at_start`` is ``machine(...)`` taken before the run (its load average is the one the
    figures were measured under); without it the machine is read now, and the page says its load
    average is the one at the end.
    """
    folder = docs_reference.BENCH_RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    result = {
        "bench": bench,
        "what": what,
        "command": " ".join(["python", shlex.quote(f"bench/{bench}.py"),
                             *map(shlex.quote, sys.argv[1:])]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        # Read at the end, the load average is the run's own as much as its neighbours'.
        "machine": at_start or {**machine(redis), "load_average_read": "at the end"},
        "figures": figures,
    }
    path = folder / f"{bench}.json"
    path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    docs_reference.BENCHMARKS_PAGE.write_text(docs_reference.benchmarks_page())
    print(f"\nresult: {path.name} in bench/results; page: docs/benchmarks.md")
    return path
