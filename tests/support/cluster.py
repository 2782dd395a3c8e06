"""A real Redis Cluster on loopback, from the same redis-server binary the suite uses.

``RedisClusterProcess(tmp, primaries=3, replicas_per_primary=0)`` starts cluster-enabled
nodes on free ports, splits the 16384 slots evenly over the primaries (``CLUSTER
ADDSLOTSRANGE``), introduces the nodes (``CLUSTER MEET``), attaches replicas
(``CLUSTER REPLICATE``) and waits until every node reports ``cluster_state:ok``.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import redis

from app.local import die_with_parent, embedded_server_binary, free_port

SLOTS = 16384


class ClusterNode:
    def __init__(self, data_dir: Path, port: int) -> None:
        self.data_dir = data_dir
        self.port = port
        # The bus port defaults to port + 10000, past 65535 for a high free port: pick one.
        self.bus_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> ClusterNode:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [embedded_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.data_dir), "--save", "", "--appendonly", "no",
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-port", str(self.bus_port),
             "--cluster-node-timeout", "2000", "--logfile", str(self.data_dir / "redis.log")],
            stdout=subprocess.DEVNULL, preexec_fn=die_with_parent,
        )
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True, socket_timeout=5)

    def wait_up(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.client().ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster node on {self.port} did not start") from None
                time.sleep(0.05)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def stop(self) -> None:
        # SIGTERM, not SHUTDOWN: the client would take the closed connection for a failure and
        # retry with back-off. Nothing here is kept (no save, no append-only file).
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


class RedisClusterProcess:
    def __init__(self, data_dir: Path, primaries: int = 3, replicas_per_primary: int = 0) -> None:
        self.data_dir = Path(data_dir)
        self.primaries = [ClusterNode(self.data_dir / f"p{i}", free_port())
                          for i in range(primaries)]
        self.replicas = [ClusterNode(self.data_dir / f"r{i}-{j}", free_port())
                         for i in range(primaries) for j in range(replicas_per_primary)]
        self.replicas_per_primary = replicas_per_primary

    @property
    def nodes(self) -> list[ClusterNode]:
        return self.primaries + self.replicas

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.primaries[0].port}/0"

    def start(self, timeout: float = 30.0) -> RedisClusterProcess:
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            node.wait_up()
        per = SLOTS // len(self.primaries)
        for index, node in enumerate(self.primaries):
            first = index * per
            last = SLOTS - 1 if index == len(self.primaries) - 1 else first + per - 1
            node.client().execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
        seed = self.primaries[0].client()
        for node in self.nodes[1:]:
            seed.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, node.bus_port)
        self._wait(lambda: all(len(self._known(n)) == len(self.nodes) for n in self.nodes),
                   timeout, "every node to know every other")
        for index, primary in enumerate(self.primaries):
            primary_id = primary.client().execute_command("CLUSTER", "MYID")
            for j in range(self.replicas_per_primary):
                replica = self.replicas[index * self.replicas_per_primary + j]
                replica.client().execute_command("CLUSTER", "REPLICATE", primary_id)
        self._wait(self._ok, timeout, "cluster_state:ok on every node")
        return self

    def _known(self, node: ClusterNode) -> list[str]:
        return [line for line in node.client().execute_command("CLUSTER", "NODES").splitlines()
                if line.strip()]

    def _ok(self) -> bool:
        for node in self.nodes:
            if node.process is None:
                continue
            info = node.client().execute_command("CLUSTER", "INFO")
            if "cluster_state:ok" not in info:
                return False
        if self.replicas:
            # Every replica has caught up with its primary once it reports the link up.
            for replica in self.replicas:
                if replica.process is None:
                    continue
                if replica.client().info("replication").get("master_link_status") != "up":
                    return False
        return True

    @staticmethod
    def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis cluster: timed out waiting for {what}")
            time.sleep(0.1)

    def wait_ok(self, timeout: float = 30.0) -> None:
        self._wait(self._ok, timeout, "cluster_state:ok")

    def flush(self) -> None:
        for node in self.primaries:
            if node.process is not None:
                try:
                    node.client().flushall()
                except redis.ResponseError:
                    pass  # a node demoted to replica by a failover refuses writes

    def keys_per_primary(self) -> dict[int, int]:
        return {node.port: node.client().dbsize() for node in self.primaries
                if node.process is not None}

    def stop(self) -> None:
        # Every node is told at once, then waited for.
        for node in self.nodes:
            if node.process is not None:
                node.process.terminate()
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> RedisClusterProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
