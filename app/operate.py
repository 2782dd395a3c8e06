"""What an operator polls and reads: ``/healthz``, ``/readyz``, ``/metrics``, the request id,
one access line per request, and the RQ dashboard under ``/rq``.

None of these routes is an op: they are not in the registry, the OpenAPI document or MCP.
``/healthz`` and ``/readyz`` need no token. With auth on, ``/metrics`` takes the install's
admin token or ``LOOM_METRICS_TOKEN``, and ``/rq`` the install's admin token (Bearer, or the
password of HTTP Basic so that a browser can sign in): both show every org's work.

A browser resends Basic credentials to ``/rq`` on any request, whichever site makes it, so
the dashboard refuses what another site could make it do: a request the browser marks
cross-site or same-site (``Sec-Fetch-Site``) or whose ``Origin`` is not this server's is a
403; a route that changes state (one that accepts POST) answers 405 to any other method (the
dashboard's "requeue all" took a GET); and no page may frame it (``frame-ancestors 'none'``).
"""

from __future__ import annotations

import hmac
import logging
import random
import re
import time
from contextvars import ContextVar, Token
from typing import Any
from urllib.parse import urlparse

from flask import Flask, Request, Response, request

from app import logs, metrics
from app.api import error_response
from app.errors import (
    AuthInsufficient,
    AuthRequired,
    CrossSiteRefused,
    LoomError,
    MethodNotAllowed,
    NotReady,
)
from app.services import Services
from app.store.health import ReadinessProbe

access_log = logging.getLogger("loom.access")

REQUEST_ID_HEADER = "X-Request-Id"
# A client's request id is echoed and logged: keep it short and free of anything that could
# forge a second log line.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")

# Routes that are not ops get a fixed label, so a scan of random paths cannot grow /metrics.
_ROUTE_LABELS = {
    "healthz": "healthz",
    "readyz": "readyz",
    "metrics": "metrics",
    "api-docs": "openapi",
    "rq_dashboard": "rq",
    "console": "console",
    "mcp": "mcp",
}


def request_op_label(app: Flask, req: Request | None = None) -> str:
    rule = (request if req is None else req).url_rule
    endpoint = None if rule is None else rule.endpoint
    if endpoint is None:
        return "unmatched"
    op = app.extensions["loom_ops_by_endpoint"].get(endpoint)
    if op is not None:
        return op
    head = endpoint.split(".", 1)[0]
    return _ROUTE_LABELS.get(head, "other")


_VERSION_4 = 0x4000 << 64
_VARIANT_RFC_4122 = 0x8000 << 48
_VERSION_AND_VARIANT_BITS = (0xF000 << 64) | (0xC000 << 48)


def new_request_id() -> str:
    """A random UUID 4 as 32 hex digits, as ``uuid.uuid4().hex`` makes it, at a fifth of the
    cost: the id only tells lines apart, so Python's generator (reseeded in every forked
    worker) serves, and the kernel is not asked for randomness once a request."""
    bits = random.getrandbits(128) & ~_VERSION_AND_VARIANT_BITS
    return f"{bits | _VERSION_4 | _VARIANT_RFC_4122:032x}"


def request_id_of(environ: dict[str, Any]) -> str:
    """The client's ``X-Request-Id`` when it is a safe one, else a new id."""
    given = environ.get("HTTP_X_REQUEST_ID", "")
    if given and _REQUEST_ID.fullmatch(given):
        return str(given)
    return new_request_id()


# What ``finish_request`` needs of the request, kept from its start to its teardown: when it
# started, its id, its op label, its method, and the token that restores what was kept before
# (a request made inside another one, as a test client can, gives the outer one its own back).
# A context variable, not the request: every read of ``flask.request`` goes through its
# proxy, whose lookup costs a failed attribute search and two Python calls, where a context
# variable's ``get`` is one C call. Flask keeps its own request in a context variable too,
# so this one is as per-thread and per-greenlet as Flask's.
_STATE: ContextVar[tuple[float, str, str, str, Token[Any]] | None] = ContextVar(
    "loom_request_state", default=None)
# Polled every second by a load balancer: a line each would drown the rest (gunicorn's access
# log skips the same, app.logs.PROBE_PATHS).
_NO_ACCESS_LINE = frozenset(("healthz", "readyz"))


def register_operations(app: Flask, services: Services) -> None:
    app.extensions.setdefault("loom_ops_by_endpoint", {})

    @app.before_request
    def start_request() -> None:
        started = time.perf_counter()
        environ = request.environ
        # The request itself, read once from where werkzeug's Request puts it in its environ:
        # each further read through ``flask.request`` would cost a proxy lookup.
        current = environ.get("werkzeug.request") or request
        request_id = request_id_of(environ)
        op = request_op_label(app, current)
        token = _STATE.set(None)
        _STATE.set((started, request_id, op, environ["REQUEST_METHOD"], token))
        logs.bind_fresh(request_id=request_id, op=op)

    @app.after_request
    def finish_request(response: Response) -> Response:
        state = _STATE.get()
        if state is None:  # refused before start_request ran
            response.headers[REQUEST_ID_HEADER] = request_id_of(request.environ)
            return response
        started, request_id, op, method, _token = state
        # set, not item assignment: the same replacement without the index and slice tests.
        response.headers.set(REQUEST_ID_HEADER, request_id)
        seconds = time.perf_counter() - started
        status = response.status_code
        metrics.observe_request(op, status, seconds)
        if op not in _NO_ACCESS_LINE and access_log.isEnabledFor(logging.INFO):
            logs.info_line(access_log, f"{method} {op} {status}", status=status,
                           duration_ms=round(seconds * 1000, 3))
        return response

    @app.teardown_request
    def forget_request(_error: BaseException | None) -> None:
        state = _STATE.get()
        if state is not None:
            try:
                _STATE.reset(state[4])
            except (ValueError, RuntimeError):  # set in another context: nothing to restore
                _STATE.set(None)
        logs.clear()

    @app.get("/healthz")
    def healthz() -> Any:
        return {"status": "ok"}

    @app.get("/readyz")
    def readyz() -> Any:
        checks = services.store(ReadinessProbe).check()
        answer: dict[str, Any] = {part.part: part.detail for part in checks}
        failing = [part.part for part in checks if not part.ok]
        if not failing:
            return {"status": "ready", "checks": answer}
        names = ", ".join(failing)
        return _refusal(NotReady(f"not ready: {names} did not answer", failing=failing,
                                 checks=answer, retry_after=1))

    def metrics_view() -> Any:
        refusal = _refuse_unless(services, allow_metrics_token=True)
        if refusal is not None:
            return refusal
        return Response(metrics.render(services), mimetype=None,
                        headers={"Content-Type": metrics.CONTENT_TYPE})

    app.add_url_rule("/metrics", endpoint="metrics", view_func=metrics_view, methods=["GET"])

    mount_dashboard(app, services)


def _bearer(header: str) -> str:
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _matches(given: str, expected: str) -> bool:
    return bool(given and expected) and hmac.compare_digest(given.encode(), expected.encode())


def _refuse_unless(
    services: Services, allow_metrics_token: bool = False, basic: bool = False
) -> Response | None:
    """None when the caller may see every org's operations; else the refusal to send."""
    settings = services.settings
    if settings.auth == "off":
        return None
    given = _bearer(request.headers.get("Authorization", ""))
    if not given and basic and request.authorization is not None:
        given = request.authorization.password or ""
    allowed = [settings.admin_token]
    if allow_metrics_token:
        allowed.append(settings.metrics_token)
    if any(_matches(given, expected) for expected in allowed):
        return None
    refused: LoomError = (
        AuthInsufficient("this token may not read every org's operations") if given
        else AuthRequired("auth is on: send the install's admin token"))
    response = _refusal(refused)
    if basic and not given:
        response.headers["WWW-Authenticate"] = 'Basic realm="Loom queues"'
    return response


DASHBOARD_PREFIX = "/rq"
# Sec-Fetch-Site values of a request this server's own pages (or the address bar) made.
_OWN_FETCH_SITES = frozenset(("same-origin", "none"))


def _refusal(error: LoomError) -> Response:
    """The error in Loom's one shape (``app.api.error_response``), outside the ops."""
    return error_response(error)


def _refuse_cross_site() -> Response | None:
    """403 for a request another site made; 405 for a state change by anything but POST."""
    fetch_site = request.headers.get("Sec-Fetch-Site", "").strip().lower()
    if fetch_site and fetch_site not in _OWN_FETCH_SITES:
        return _refusal(CrossSiteRefused("the queue dashboard answers only its own pages",
                                         field="Sec-Fetch-Site"))
    origin = request.headers.get("Origin", "").strip()
    if origin and urlparse(origin).netloc != request.host:
        return _refusal(CrossSiteRefused("the queue dashboard answers only its own pages",
                                         field="Origin"))
    rule = request.url_rule
    if rule is not None and "POST" in (rule.methods or ()) and request.method != "POST":
        return _refusal(MethodNotAllowed(f"{request.method} changes no state here: send POST",
                                         method=request.method))
    return None


def mount_dashboard(app: Flask, services: Services) -> None:
    """rq-dashboard's blueprint under ``/rq``, on the queue's Redis, behind the admin token."""
    import rq_dashboard
    from rq_dashboard.web import setup_rq_connection

    app.config.setdefault("RQ_DASHBOARD_REDIS_URL", services.settings.queue_redis_url)
    app.config.setdefault("RQ_DASHBOARD_POLL_INTERVAL", 2500)
    # rq-dashboard keeps its connection on the app object.
    if services.settings.queue_redis_url:
        setup_rq_connection(app)
        # Loom's own client for the queue's Redis, with its TLS options (rq-dashboard's
        # would check an add-on's certificate whatever LOOM_REDIS_TLS_VERIFY says).
        app.redis_conn = services.queue_redis  # type: ignore[attr-defined]
    app.register_blueprint(rq_dashboard.blueprint, url_prefix=DASHBOARD_PREFIX)

    def guard_dashboard() -> Response | None:
        return _refuse_cross_site() or _refuse_unless(services, basic=True)

    def frame_nowhere(response: Response) -> Response:
        response.headers["Content-Security-Policy"] = "frame-ancestors 'none'"
        response.headers["X-Frame-Options"] = "DENY"
        return response

    app.after_request_funcs.setdefault(rq_dashboard.blueprint.name, []).append(frame_nowhere)

    # Run for the dashboard's requests only (Flask keys these hooks by blueprint name), ahead
    # of the dashboard's own hooks: every other request skips the call.
    app.before_request_funcs.setdefault(rq_dashboard.blueprint.name, []).insert(
        0, guard_dashboard)
