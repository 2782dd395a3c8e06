"""A redis-server that one test owns and may kill, stop (SIGSTOP), restart or slow down.

Outage tests need their own server: the suite's shared one must stay up for every other test.
The server keeps its port and data folder across restarts, so clients that point at it see
the same Redis come back.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import redis

from app.local import RedisServerProcess


class OwnedRedis(RedisServerProcess):
    def __init__(self, data_dir: Path, appendonly: bool = True) -> None:
        super().__init__(data_dir, appendonly=appendonly)
        self.paused = False

    @property
    def pid(self) -> int:
        assert self.process is not None, "the server is not running"
        return self.process.pid

    def kill(self) -> None:
        """kill -9: no shutdown, no last fsync."""
        if self.process is None:
            return
        if self.paused:
            self.resume()
        self.process.kill()
        self.process.wait()
        self.process = None

    def pause(self) -> None:
        """SIGSTOP: the port still accepts connections, nothing answers."""
        os.kill(self.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)
        self.paused = False

    def restart(self, *extra_args: str, wait: bool = True) -> OwnedRedis:
        self.kill()
        self.extra_args = tuple(extra_args)
        self.start(wait=wait)
        return self

    def fill_and_rewrite(self, keys: int) -> None:
        """Write ``keys`` filler keys and compact the append-only file, so that a restart has
        that many keys to load from its base file."""
        client = redis.Redis(port=self.port)
        pipe = client.pipeline(transaction=False)
        for i in range(keys):
            pipe.set(f"filler:{i}", "x")
        pipe.execute()
        rewrites = client.info("persistence")["aof_rewrites"]
        client.bgrewriteaof()
        deadline = time.monotonic() + 20
        while True:
            info = client.info("persistence")
            # "In progress" also reads 0 while the rewrite is only scheduled: wait for the
            # count to move and for nothing to be running or scheduled.
            if info["aof_rewrites"] != rewrites and not (
                info["aof_rewrite_in_progress"] or info["aof_rewrite_scheduled"]
            ):
                break
            assert time.monotonic() < deadline, "the append-only rewrite did not finish"
            time.sleep(0.05)
        client.close()

    def restart_loading(self, keys_load_delay_us: int) -> None:
        """Restart so that loading the data takes a while (``key-load-delay`` per key), with
        the server answering LOADING meanwhile; returns before it has loaded."""
        self.restart(
            "--key-load-delay", str(keys_load_delay_us),
            "--loading-process-events-interval-bytes", "1024",
            wait=False,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2, socket_timeout=1)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                raise AssertionError("the server loaded before it could be asked")
            except redis.exceptions.BusyLoadingError:
                break
            except (redis.ConnectionError, redis.TimeoutError):
                assert time.monotonic() < deadline, "the server did not start loading"
                time.sleep(0.02)
        client.close()

    def wait_ready(self, timeout: float = 30.0) -> None:
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.ping()
                client.close()
                return
            except (redis.ConnectionError, redis.TimeoutError):
                assert time.monotonic() < deadline, "the server did not come back"
                time.sleep(0.05)

    def stop(self) -> None:
        if self.paused:
            self.resume()
        super().stop()
