"""gunicorn's configuration, read from the working directory by ``gunicorn wsgi:app``.

Metrics: every worker writes its prometheus_client values to ``PROMETHEUS_MULTIPROC_DIR`` so
that a scrape answered by any worker adds up all of them. The directory is set here, in the
master, before any worker imports prometheus_client (a fresh temporary one when the
environment names none), emptied before the first fork, and a dead worker's files are marked
in ``child_exit``, as prometheus_client's multiprocess mode asks.

Logs: gunicorn's own lines take Loom's format (``LOOM_LOG_FORMAT``); the probes
(``/healthz``, ``/readyz``) write no access line; the "Listening at:" line names the addresses
(with ``SO_REUSEPORT`` the master holds no socket, and gunicorn's own line named none).

Platform: with ``DYNO`` set and auth off (and no ``HOST``), the web would listen on loopback,
which the platform's router never reaches: the master says what to set, in one line, and
exits 1 before it binds (``app.settings.platform_bind_refusal``).

Control socket: off. gunicorn's default is one path per machine user
(``~/.gunicorn/gunicorn.ctl``), shared by every instance and outside the data folder, and
stopping its server holds the master up to 4 s at shutdown; Loom does not use ``gunicornc``.

Address: the rule of every Loom process (``app.settings.listen_host``): ``HOST`` when set,
else loopback unless ``LOOM_AUTH=on``; the port is ``PORT``. A ``--bind`` on the command line
wins over it (the tests' own gunicorn uses one).

Restart (Linux): each worker listens on a socket of its own with ``SO_REUSEPORT``, so a master
started after its predecessor was killed binds at once, while that predecessor's workers still
hold their sockets. A worker listens only once its app is loaded, so that no connection waits
in the queue of one still booting, and takes SIGTERM when its master dies, so that it stops
the way a stop asks (closes its listener, then finishes what it is serving) rather than by
exiting at its parent check. The master holds an abstract socket named by each address it
serves, so a second master on the same address is refused as it would be without
``SO_REUSEPORT`` (docs/decisions.md, "Restart").
"""

from __future__ import annotations

import os as _os
import shutil as _shutil
import socket as _socket
import sys as _sys
import tempfile as _tempfile

if not _os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    _os.environ["PROMETHEUS_MULTIPROC_DIR"] = _tempfile.mkdtemp(prefix="loom-metrics-")
    _made_metrics_dir = True
else:
    _made_metrics_dir = False

from gunicorn.glogging import Logger as _GunicornLogger

from app.local import die_with_parent as _die_with_parent
from app.logs import PROBE_PATHS as _PROBE_PATHS
from app.logs import make_formatter as _make_formatter
from app.settings import listen_host as _listen_host
from app.settings import platform_bind_refusal as _platform_bind_refusal

control_socket_disable = True
# gunicorn's largest request line (its default is 4094): the one GET op carries its profile
# id in the path and org and namespace in the query, each up to 256 characters, which
# percent-encoded can take 12 bytes a character.
limit_request_line = 8190

_refusal = _platform_bind_refusal()
if _refusal:
    # Before gunicorn binds anything or logs a line: the platform shows this as the boot's end.
    print(_refusal, file=_sys.stderr, flush=True)
    _sys.exit(1)

bind = [f"{_listen_host()}:{_os.environ.get('PORT', '8000').strip() or '8000'}"]
# Linux only: elsewhere SO_REUSEPORT does not spread connections, and there is no abstract
# socket to refuse a second master with.
_LINUX = _sys.platform.startswith("linux")
reuse_port = _LINUX


class _LoomGunicornLogger(_GunicornLogger):
    """gunicorn's logger with its handlers in Loom's log format."""

    def setup(self, cfg):
        super().setup(cfg)
        formatter = _make_formatter(_os.environ.get("LOOM_LOG_FORMAT", "auto").strip().lower()
                                    or "auto")
        for log in (self.error_log, self.access_log):
            for handler in log.handlers:
                handler.setFormatter(formatter)


    def access(self, resp, req, environ, request_time):
        if environ.get("PATH_INFO") in _PROBE_PATHS:
            return
        super().access(resp, req, environ, request_time)

    def info(self, msg, *args, **kwargs):
        # With SO_REUSEPORT each worker opens its own socket and the master none, so
        # gunicorn's "Listening at:" line names no address: it names the bound ones here.
        if msg.startswith("Listening at:") and args and not args[0]:
            args = (_addresses(self.cfg.address), *args[1:])
        super().info(msg, *args, **kwargs)


def _addresses(addresses) -> str:
    """The addresses as gunicorn names its sockets (``http://0.0.0.0:5000``)."""
    named = []
    for address in addresses:
        if isinstance(address, str | bytes):
            named.append(f"unix:{address.decode() if isinstance(address, bytes) else address}")
        elif ":" in address[0]:
            named.append(f"http://[{address[0]}]:{address[1]}")
        else:
            named.append(f"http://{address[0]}:{address[1]}")
    return ",".join(named)


logger_class = _LoomGunicornLogger

# gunicorn's default access format less two atoms: %(u)s, the HTTP Basic user name (a client
# may put a token there: the queue dashboard takes the admin token as Basic credentials), and
# %(f)s, the Referer (a page's address, which may name what the page showed).
access_log_format = '%(h)s %(l)s - %(t)s "%(r)s" %(s)s %(b)s "-" "%(a)s"'


# The master's claims on its addresses (abstract sockets, Linux): released by the kernel the
# moment the master dies, kill -9 included, and closed in every worker so that only the master
# holds them.
_address_claims: list[_socket.socket] = []


def _claim_addresses(server) -> None:
    for address in server.cfg.address:
        claim = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        name = address if isinstance(address, str) else ":".join(map(str, address))
        try:
            claim.bind(f"\0loom-web {name}")
        except OSError:
            claim.close()
            server.log.error("another Loom web master serves %s: stop it first", name)
            _sys.exit(1)
        _address_claims.append(claim)


def on_starting(server):
    if _LINUX:
        _claim_addresses(server)
    directory = _os.environ["PROMETHEUS_MULTIPROC_DIR"]
    # Values left by an earlier run would be added to this one's.
    _shutil.rmtree(directory, ignore_errors=True)
    _os.makedirs(directory, exist_ok=True)


def post_fork(server, worker):
    for claim in _address_claims:
        claim.close()
    # A worker whose master died stops as a SIGTERM asks, at its next tick (within a second):
    # it closes its listener, which the kernel would otherwise go on handing new connections,
    # then finishes its requests. Had the master died before this line, gunicorn's own parent
    # check, on the same tick, stops the worker.
    _die_with_parent()
    if reuse_port:
        # gunicorn opened this worker's socket before the app is loaded: the kernel would queue
        # connections on it for as long as the worker boots (seconds on a busy machine) while
        # its siblings could answer them. It listens once it can serve (post_worker_init).
        for listener in worker.sockets:
            listener.close()
        worker.sockets = []


def post_worker_init(worker):
    if not reuse_port:
        return
    from gunicorn import sock as _gunicorn_sock
    from gunicorn import util as _gunicorn_util

    listeners = _gunicorn_sock.create_sockets(worker.cfg, worker.log)
    if worker_class == "gevent":
        from gevent import socket as _gevent_socket

        # As the gevent worker does with the sockets it is given, once gevent is in place.
        listeners = [_gevent_socket.socket(listener.FAMILY, _socket.SOCK_STREAM,
                                           fileno=listener.sock.detach())
                     for listener in listeners]
    for listener in listeners:
        _gunicorn_util.close_on_exec(listener)
    worker.sockets = listeners
    worker.wait_fds = worker.sockets + [worker.PIPE[0]]


def child_exit(server, worker):
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    if _made_metrics_dir:
        _shutil.rmtree(_os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)

# --- workers ----------------------------------------------------------------------------------
# gevent by measurement (bench/slow_clients.py, docs/guides/deploy-heroku.md): a sync worker
# or a gthread thread sits in recv() for as long as a client takes to send its headers, so a
# few dozen slow clients stop every other request; a gevent worker parks each connection on
# its event loop and keeps answering. Each value comes from the environment, checked as the
# settings are.
from app.settings import web_setting as _web_setting  # noqa: E402

worker_class = _web_setting("LOOM_WEB_WORKER_CLASS")
workers = _web_setting("WEB_CONCURRENCY")
threads = _web_setting("LOOM_WEB_THREADS")
worker_connections = _web_setting("LOOM_WEB_WORKER_CONNECTIONS")
timeout = _web_setting("LOOM_WEB_TIMEOUT_SECONDS")
graceful_timeout = _web_setting("LOOM_WEB_GRACEFUL_TIMEOUT_SECONDS")
keepalive = _web_setting("LOOM_WEB_KEEPALIVE_SECONDS")

if worker_class == "gevent":
    import warnings as _warnings

    from gevent.monkey import MonkeyPatchWarning as _MonkeyPatchWarning

    # gunicorn imports ssl before any config runs, so every gevent worker warns that ssl was
    # imported before the patch. The web process opens no TLS socket of its own before the
    # patch, and a warning line is not a JSON log line: keep it out of the log.
    _warnings.filterwarnings("ignore", category=_MonkeyPatchWarning)
