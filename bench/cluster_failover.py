"""Kill a primary of a Redis Cluster under write load and see what Loom's clients saw.

Starts three primaries with one replica each (loopback, the suite's redis-server binary),
writes working-memory blocks through the real op path (the Flask app on the cluster client)
from one loop, SIGKILLs the primary owning the first user's slot two seconds in, and keeps
writing until the cluster has promoted the replica and writes succeed again. Then every
block whose write was acknowledged is read back. Prints errors, the outage, and how many
acknowledged writes were lost (replication is asynchronous: a write acknowledged by the old
primary but not yet copied to its replica is lost when the replica takes over).

    .venv/bin/python bench/cluster_failover.py      # about 20 s

The figures are kept in ``bench/results/cluster_failover.json`` and shown on the site's
benchmarks page.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app import create_app  # noqa: E402
from app.local import RedisServerProcess  # noqa: E402
from app.store import keys  # noqa: E402
from bench import results  # noqa: E402
from tests.support.cluster import RedisClusterProcess  # noqa: E402

NS = {"namespace": "bench", "agent": "writer"}
USERS = [f"u-{i}" for i in range(30)]
RUN_SECONDS = 14.0
KILL_AFTER = 2.0


def main() -> int:
    # Each refused write logs its traceback; the figures below are what this run is for.
    logging.getLogger("loom").setLevel(logging.CRITICAL)
    work = Path(tempfile.mkdtemp(prefix="loom-failover-"))
    cluster = RedisClusterProcess(work / "cluster", primaries=3, replicas_per_primary=1).start()
    queue = RedisServerProcess(work / "queue", appendonly=False).start()
    try:
        app = create_app({"redis_url": cluster.url, "redis_cluster": "on",
                          "queue_url": queue.url, "secret_key": "failover-bench",
                          "data_dir": str(work)})
        client = app.test_client()
        data = app.extensions["loom"].redis
        victim_slot = data.keyslot(keys.user_tag("default", "bench", USERS[0]))
        victim = next(node for node in cluster.primaries
                      if _owns(node.client(), victim_slot))
        redis_name = results.server_name(victim.client().info("server")) + \
            ", a cluster of 3 primaries with a replica each"
        at_start = results.machine(redis_name)
        acknowledged: dict[tuple[str, str], str] = {}
        errors: list[tuple[float, int]] = []
        started = time.monotonic()
        killed_at = first_error = last_error = None
        sequence = 0
        slowest = (0.0, 0.0)  # (seconds a write took, when it started)
        while time.monotonic() - started < RUN_SECONDS:
            now = time.monotonic() - started
            if killed_at is None and now >= KILL_AFTER:
                victim.kill()
                killed_at = now
            user = USERS[sequence % len(USERS)]
            block = f"b{sequence}"
            content = f"write {sequence}"
            sequence += 1
            answer = client.post("/v1/working_memory.set",
                                 json={**NS, "user_id": user, "block_key": block,
                                       "content": content})
            took = time.monotonic() - started - now
            slowest = max(slowest, (took, now))
            if answer.status_code == 200:
                acknowledged[(user, block)] = content
            else:
                errors.append((now, answer.status_code))
                first_error = first_error if first_error is not None else now
                last_error = now
        lost = 0
        for (user, block), content in acknowledged.items():
            got = client.post("/v1/working_memory.get",
                              json={**NS, "user_id": user, "block_key": block}).get_json()
            if got.get("content") != content:
                lost += 1
        statuses = sorted({status for _, status in errors})
        print(f"writes attempted      {sequence}")
        print(f"acknowledged          {len(acknowledged)}")
        print(f"errors                {len(errors)} (statuses {statuses})")
        if first_error is not None and killed_at is not None:
            print(f"primary killed at     {killed_at:.2f} s")
            print(f"errors from / to      {first_error:.2f} s / {last_error:.2f} s "
                  f"(outage {last_error - killed_at:.2f} s after the kill)")
        print(f"primary killed        {'yes' if killed_at is not None else 'no'}")
        print(f"slowest write         {slowest[0]:.2f} s, started at {slowest[1]:.2f} s")
        print(f"acknowledged but lost {lost}")
        figures = {"writes attempted / acknowledged": f"{sequence:,} / {len(acknowledged):,}",
                   "errors": f"{len(errors)} (statuses {', '.join(map(str, statuses))})",
                   "acknowledged but lost": str(lost),
                   "slowest write": f"{slowest[0]:.2f} s, started {slowest[1]:.2f} s into the run "
                                    f"(the primary was killed at {KILL_AFTER:g} s)"}
        if first_error is not None and killed_at is not None:
            figures["writes to the dead primary's slots refused for"] = (
                f"{last_error - killed_at:.2f} s after the kill, until its replica was promoted")
        results.record(
            "cluster_failover", f"One writer of working-memory blocks through the Flask app on "
            f"the cluster client; the primary owning the first user's slot is killed "
            f"(SIGKILL) {KILL_AFTER:g} s in, writes go on for {RUN_SECONDS:g} s, then every "
            f"acknowledged block is read back.", figures, redis_name, at_start)
        return 0
    finally:
        cluster.stop()
        queue.stop()


def _owns(client, slot: int) -> bool:
    for first, last, *_ in client.execute_command("CLUSTER", "SLOTS"):
        if first <= slot <= last and _is_self(client, _):
            return True
    return False


def _is_self(client, nodes) -> bool:
    port = client.connection_pool.connection_kwargs["port"]
    return bool(nodes) and int(nodes[0][1]) == port


if __name__ == "__main__":
    sys.exit(main())
