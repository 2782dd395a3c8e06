"""The outermost WSGI layer of the web process: which ``Host`` it answers, and no caching.

A page on any web site can make a browser send requests to ``127.0.0.1`` by rebinding its own
name to that address (DNS rebinding); the browser then treats the answers as that site's. With
auth off nothing else stands between such a page and every user's data, so on a loopback bind
(or whenever ``LOOM_ALLOWED_HOSTS`` is set) a request whose ``Host`` is not a loopback name or
an allowed one is refused with 421 before any route runs. The MCP server applies the same
names to its own port (``loom.mcp_server.allowed_host_names``).

Every answer also carries ``Cache-Control: no-store`` unless its route chose a policy (the
static files of the console and the docs do): answers hold users' data, and no browser or
proxy cache should keep a copy.

It wraps ``app.wsgi_app`` last, so it sees every request whichever layer serves it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from app.settings import Settings

LOOPBACK_NAMES = frozenset(("127.0.0.1", "localhost", "[::1]", "::1"))
NO_STORE = ("Cache-Control", "no-store")

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def is_loopback(address: str) -> bool:
    address = address.strip().lower()
    return address in LOOPBACK_NAMES or address.startswith("127.")


def host_name(host_header: str) -> str:
    """The name of a ``Host`` header, lowercased, without its port (``[::1]:8000`` -> ``[::1]``)."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def allowed_names(settings: Settings) -> frozenset[str] | None:
    """The Host names the web process answers, or None for any.

    None when the operator lists ``*``, or when the process listens beyond loopback and lists
    nothing: a deployment behind a load balancer is reached by names only it knows, and a
    token guards it (``LOOM_AUTH=on`` is what moves the default bind off loopback).
    """
    extra = settings.allowed_hosts
    if "*" in extra:
        return None
    listen = settings.host or ("127.0.0.1" if settings.auth == "off" else "0.0.0.0")
    if not extra and not is_loopback(listen):
        return None
    return LOOPBACK_NAMES | frozenset(extra)


class HostGuard:
    """WSGI: refuses a ``Host`` outside ``names`` (when given) and adds ``no-store``."""

    def __init__(self, app: WSGIApp, names: frozenset[str] | None) -> None:
        self.app = app
        self.names = names

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]
                 ) -> Iterable[bytes]:
        if self.names is not None:
            host = environ.get("HTTP_HOST") or environ.get("SERVER_NAME", "")
            if host_name(host) not in self.names:
                return self._refuse(start_response)

        def start(status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
            if not any(name.lower() == "cache-control" for name, _ in headers):
                headers.append(NO_STORE)
            return start_response(status, headers, *exc_info)

        return self.app(environ, start)

    @staticmethod
    def _refuse(start_response: Callable[..., Any]) -> Iterable[bytes]:
        body = json.dumps({"error": {
            "code": "HOST_NOT_ALLOWED",
            "message": "this server does not answer that Host name; add it to "
                       "LOOM_ALLOWED_HOSTS",
            "field": "Host",
        }}, separators=(",", ":")).encode() + b"\n"
        start_response("421 MISDIRECTED REQUEST", [
            ("Content-Type", "application/json"), ("Content-Length", str(len(body))), NO_STORE,
        ])
        return [body]


def install(app: Any, settings: Settings) -> HostGuard:
    guard = HostGuard(app.wsgi_app, allowed_names(settings))
    app.wsgi_app = guard
    return guard
