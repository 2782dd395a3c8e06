"""One request handed straight to a WSGI app, as gunicorn hands it: the environ of a
keep-alive POST from a load client, and the call that runs the app and drains its answer.
bench/instructions.py counts the instructions of these calls and bench/working_memory.py
times the stages of the same calls, so both measure one request the same way."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from typing import Any


def environ_for(path: str, body: bytes) -> dict[str, Any]:
    """What gunicorn hands an app for one keep-alive POST from a load client."""
    return {
        "REQUEST_METHOD": "POST",
        "SCRIPT_NAME": "",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "RAW_URI": path,
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "SERVER_SOFTWARE": "gunicorn/23.0.0",
        "REMOTE_ADDR": "127.0.0.1",
        "REMOTE_PORT": "50000",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_HOST": "127.0.0.1:8000",
        "HTTP_CONTENT_TYPE": "application/json",
        "HTTP_CONTENT_LENGTH": str(len(body)),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(body),
        "wsgi.input_terminated": True,
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }


def call(app: Callable[..., Any], path: str, body: bytes) -> str:
    status: list[str] = []
    chunks = app(environ_for(path, body), lambda s, h, e=None: status.append(s))
    try:
        for _chunk in chunks:
            pass
    finally:
        close = getattr(chunks, "close", None)
        if close:
            close()
    return status[0]
