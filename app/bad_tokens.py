"""The per-address budget of refused tokens: a WSGI layer around the whole web app.

A request that carries a credential (an ``Authorization`` header, or the console's sign-in
form) and is answered 401 spends one unit of its client address's budget
(``LOOM_BAD_TOKEN_LIMIT``, counted in Redis by ``BadCredentialBudget`` and shared by every
process). Once an address is over it, this process answers its requests that carry a
credential 429 with ``Retry-After`` until the window ends, before any route runs; requests
without one (``/healthz``) still pass. A good request costs nothing here: only a refusal
reaches Redis, and the over-budget addresses are kept in this process's memory.

The address is ``REMOTE_ADDR``: behind proxies, ``LOOM_TRUSTED_PROXIES`` has werkzeug's
``ProxyFix`` set it from ``X-Forwarded-For`` first.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from app.services import Services
from app.store.connection import UNAVAILABLE_ERRORS
from app.store.ratelimit import BadCredentialBudget

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
SIGN_IN_PATH = "/console/sign-in"
# Most addresses this process remembers as over budget; past it the oldest are forgotten.
MAX_BLOCKED = 10_000

log = logging.getLogger("loom.auth")


def carries_credential(environ: dict[str, Any]) -> bool:
    if environ.get("HTTP_AUTHORIZATION"):
        return True
    return environ.get("REQUEST_METHOD") == "POST" and environ.get("PATH_INFO") == SIGN_IN_PATH


class BadTokenGuard:
    def __init__(self, app: WSGIApp, services: Services) -> None:
        self.app = app
        self.services = services
        self.blocked_until: dict[str, float] = {}
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]
                 ) -> Iterable[bytes]:
        if not carries_credential(environ) or self.services.settings.bad_token_limit is None:
            return self.app(environ, start_response)
        address = str(environ.get("REMOTE_ADDR") or "-")
        wait = self._wait(address)
        if wait is not None:
            return self._refuse(start_response, wait)

        def start(status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
            if status.startswith("401"):
                self._spend(address)
            return start_response(status, headers, *exc_info)

        return self.app(environ, start)

    def _wait(self, address: str) -> int | None:
        until = self.blocked_until.get(address)
        if until is None:
            return None
        left = until - self.services.clock.now()
        if left > 0:
            return max(1, int(left + 0.999))
        with self.lock:
            self.blocked_until.pop(address, None)
        return None

    def _spend(self, address: str) -> None:
        try:
            retry_after = self.services.store(BadCredentialBudget).spend(address)
        except UNAVAILABLE_ERRORS:
            return  # the refusal stands; the count waits for the store to come back
        if retry_after is None:
            return
        with self.lock:
            if len(self.blocked_until) >= MAX_BLOCKED:
                self.blocked_until.pop(next(iter(self.blocked_until)))
            self.blocked_until[address] = self.services.clock.now() + retry_after
        log.warning("an address sent too many refused tokens; refusing its tokens for %ss",
                    retry_after)

    @staticmethod
    def _refuse(start_response: Callable[..., Any], wait: int) -> Iterable[bytes]:
        body = json.dumps({"error": {
            "code": "RATE_LIMITED",
            "message": "too many refused tokens from this address; wait before trying again",
            "retry_after": wait,
        }}, separators=(",", ":")).encode() + b"\n"
        start_response("429 TOO MANY REQUESTS", [
            ("Content-Type", "application/json"), ("Content-Length", str(len(body))),
            ("Retry-After", str(wait)),
        ])
        return [body]


def install(app: Any, services: Services) -> BadTokenGuard:
    guard = BadTokenGuard(app.wsgi_app, services)
    app.wsgi_app = guard
    return guard
