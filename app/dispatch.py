"""The op routes straight from WSGI: ``POST`` (and ``PUT``) to an op's own path, without
Flask's request cycle around it.

A Flask request builds a request context, a ``Request`` and a ``Response``, matches the URL
map, opens a session and runs every hook: about 440,000 instructions on these machines for a
route that only answers ``{}``, more than all the work Loom does for a working-memory op. The
op routes need none of it, so ``OpDispatcher`` sits in front of ``app.wsgi_app`` (the place
Flask's documentation gives WSGI middleware) and serves them itself, on the same parts the
Flask views use: ``make_op_call`` (principal, budget, body, ``run_op``), ``error_answer`` (one
error shape, ``Retry-After``), the request id, the metrics and the access line. Everything else
goes on to Flask unchanged: GET ops (their query strings), path parameters, the documents, the
console, ``/metrics``, ``/rq``, any other method or path, and their errors.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from flask import Flask
from werkzeug.datastructures import EnvironHeaders
from werkzeug.http import HTTP_STATUS_CODES

from app import logs, metrics
from app.api import error_answer, internal_error, make_op_call, unavailable_error
from app.errors import LoomError
from app.operate import REQUEST_ID_HEADER, access_log, request_id_of
from app.registry import Op
from app.services import Services
from app.store.connection import UNAVAILABLE_ERRORS

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


@functools.cache
def _status_line(status: int) -> str:
    # werkzeug's own status line for the code, as a Flask response would send it.
    return f"{status} {HTTP_STATUS_CODES.get(status, 'UNKNOWN').upper()}"


class OpDispatcher:
    """WSGI: the op routes of ``app`` served directly, every other request by ``flask_app``
    (Flask's own ``wsgi_app``, which also serves every op route through its Flask view)."""

    def __init__(self, app: Flask, services: Services, ops: Iterable[Op],
                 flask_app: WSGIApp) -> None:
        self._app = app
        self.flask_app = flask_app
        dumps = app.json.dumps  # type: ignore[attr-defined]
        # Compact, as Flask's own JSON answers are (its kept encoder: app.LoomJSONProvider).
        self._encode = lambda answer: dumps(answer, separators=(",", ":"))
        self._validating = services.settings.validate_answers
        self._routes: dict[tuple[str, str], tuple[Op, Callable[..., dict[str, Any]]]] = {}
        for op in ops:
            # A GET op reads its query string and a path with parameters needs Flask's
            # converters: both stay with Flask.
            if op.http_method == "GET" or "<" in op.http_path:
                continue
            self._routes[(op.http_method, op.http_path)] = (op, make_op_call(op, services))

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]
                 ) -> Iterable[bytes]:
        route = self._routes.get((environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")))
        if route is None:
            return self.flask_app(environ, start_response)
        op, call = route
        started = time.perf_counter()
        request_id = request_id_of(environ)
        logs.bind_fresh(request_id=request_id, op=op.name)
        try:
            if self._validating:
                # The answer check reads the document through the app, as Flask's views do.
                with self._app.app_context():
                    status, body, extra = self._answer(op, call, environ)
            else:
                status, body, extra = self._answer(op, call, environ)
            headers = [("Content-Type", "application/json"),
                       ("Content-Length", str(len(body))), (REQUEST_ID_HEADER, request_id),
                       *extra]
            start_response(_status_line(status), headers)
            seconds = time.perf_counter() - started
            metrics.observe_request(op.name, status, seconds)
            if access_log.isEnabledFor(logging.INFO):
                logs.info_line(access_log, f"{environ['REQUEST_METHOD']} {op.name} {status}",
                               status=status, duration_ms=round(seconds * 1000, 3))
            return [body]
        finally:
            logs.clear()

    def _answer(self, op: Op, call: Callable[..., dict[str, Any]], environ: dict[str, Any]
                ) -> tuple[int, bytes, list[tuple[str, str]]]:
        try:
            result = call(EnvironHeaders(environ), environ)
            return 200, (self._encode(result) + "\n").encode("utf-8"), []
        except LoomError as error:
            return self._error(op, error)
        except UNAVAILABLE_ERRORS as error:
            return self._error(op, unavailable_error(error, environ.get("PATH_INFO", "")))
        except Exception as error:  # as Flask's handler for Exception: logged, a 500
            return self._error(op, internal_error(error, op.name))

    def _error(self, op: Op, error: LoomError) -> tuple[int, bytes, list[tuple[str, str]]]:
        status, answer, headers = error_answer(error, op.name)
        return status, (self._encode(answer) + "\n").encode("utf-8"), headers


def install(app: Flask, services: Services, ops: Iterable[Op]) -> OpDispatcher:
    dispatcher = OpDispatcher(app, services, ops, app.wsgi_app)
    app.wsgi_app = dispatcher  # type: ignore[method-assign]
    return dispatcher
