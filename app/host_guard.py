"""Which ``Host`` the web process answers, and no caching: two request hooks of the Flask app.

A page on any web site can make a browser send requests to ``127.0.0.1`` by rebinding its own
name to that address (DNS rebinding); the browser then treats the answers as that site's. With
auth off nothing else stands between such a page and every user's data, so on a loopback bind
(or whenever ``LOOM_ALLOWED_HOSTS`` is set) a request whose ``Host`` is not a loopback name or
an allowed one is refused with 421 before any view or blueprint hook runs. The MCP server
applies the same names to its own port (``loom.mcp_server.allowed_host_names``).

Every answer also carries ``Cache-Control: no-store`` unless its route chose a policy (the
static files of the console and the docs do): answers hold users' data, and no browser or
proxy cache should keep a copy.

Both live inside Flask's request cycle (``LoomFlask.add_request_guard``, an ``after_request``
hook): a deployer's hooks, error tracker and tracing see a 421 like any other answer.
"""

from __future__ import annotations

from typing import Any

from flask import Response, request

from app.api import error_response
from app.errors import HostNotAllowed
from app.settings import Settings

LOOPBACK_NAMES = frozenset(("127.0.0.1", "localhost", "[::1]", "::1"))
CACHE_CONTROL = "Cache-Control"
NO_STORE = "no-store"
MAX_ANSWERED_HOSTS = 64


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


def refusal() -> Response:
    """The 421 for a Host this process does not answer."""
    response = error_response(HostNotAllowed(
        "this server does not answer that Host name; add it to LOOM_ALLOWED_HOSTS",
        field="Host"))
    response.headers[CACHE_CONTROL] = NO_STORE
    return response


def install(app: Any, settings: Settings) -> None:
    """The Host check (when ``allowed_names`` gives names) and ``no-store`` on every answer, on
    ``app``, a ``LoomFlask`` (typed loosely: ``app`` imports this module)."""
    names = allowed_names(settings)
    if names is not None:
        # The Host headers already answered, as sent: clients repeat one or two, so most
        # requests cost a set lookup; a refused one is never kept, and the set stays small.
        answered: set[str] = set()

        def refuse_unknown_host() -> Response | None:
            environ = request.environ
            host = environ.get("HTTP_HOST") or environ.get("SERVER_NAME", "")
            if host in answered:
                return None
            if host_name(host) not in names:
                return refusal()
            if len(answered) < MAX_ANSWERED_HOSTS:
                answered.add(host)
            return None

        app.add_request_guard(refuse_unknown_host)

    @app.after_request
    def no_store_unless_chosen(response: Response) -> Response:
        # A scan, not ``in``: werkzeug's headers answer a missing name by raising a
        # BadRequestKeyError, and the header is missing from nearly every answer.
        headers = response.headers
        for name, _value in headers:
            if name.lower() == "cache-control":
                return response
        headers.add(CACHE_CONTROL, NO_STORE)
        return response
