"""The per-address budget of refused tokens: two request hooks of the Flask app.

A request that carries a credential (an ``Authorization`` header, or the console's sign-in
form) and is answered 401 spends one unit of its client address's budget
(``LOOM_BAD_TOKEN_LIMIT``, counted in Redis by ``BadCredentialBudget`` and shared by every
process). Once an address is over it, this process answers its requests that carry a
credential 429 with ``Retry-After`` until the window ends, before any view or blueprint hook
checks a credential; requests without one (``/healthz``) still pass. A good request costs
nothing here: only a refusal reaches Redis, and the over-budget addresses are kept in this
process's memory.

Both live inside Flask's request cycle (``LoomFlask.add_request_guard``, an ``after_request``
hook): a deployer's hooks, error tracker and tracing see the 429 like any other answer.

The address is ``REMOTE_ADDR``: behind proxies, ``LOOM_TRUSTED_PROXIES`` has werkzeug's
``ProxyFix`` set it from ``X-Forwarded-For`` first.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from flask import Response, request

from app.api import error_response
from app.errors import RateLimited
from app.services import Services
from app.store.connection import UNAVAILABLE_ERRORS
from app.store.ratelimit import BadCredentialBudget

SIGN_IN_PATH = "/console/sign-in"
# Most addresses this process remembers as over budget; past it the oldest are forgotten.
MAX_BLOCKED = 10_000

log = logging.getLogger("loom.auth")


def carries_credential(environ: dict[str, Any]) -> bool:
    if environ.get("HTTP_AUTHORIZATION"):
        return True
    return environ.get("REQUEST_METHOD") == "POST" and environ.get("PATH_INFO") == SIGN_IN_PATH


def _address(environ: dict[str, Any]) -> str:
    return str(environ.get("REMOTE_ADDR") or "-")


class BadTokenGuard:
    """Refuses a credential from an address over its budget; counts each 401 against it."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.blocked_until: dict[str, float] = {}
        self.lock = threading.Lock()

    def refuse_blocked(self) -> Response | None:
        """The 429 for a credential from an address over its budget, else None."""
        if not self.blocked_until:  # the common case: no address is held off
            return None
        environ = request.environ
        if not carries_credential(environ) or self.services.settings.bad_token_limit is None:
            return None
        wait = self._wait(_address(environ))
        return None if wait is None else self._refusal(wait)

    def spend_on_refusal(self, response: Response) -> Response:
        if response.status_code == 401:
            environ = request.environ
            if carries_credential(environ) and self.services.settings.bad_token_limit is not None:
                self._spend(_address(environ))
        return response

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
    def _refusal(wait: int) -> Response:
        return error_response(RateLimited(
            "too many refused tokens from this address; wait before trying again",
            retry_after=wait))


def install(app: Any, services: Services) -> BadTokenGuard:
    """The guard's two hooks on ``app``, a ``LoomFlask`` (typed loosely: ``app`` imports this
    module)."""
    guard = BadTokenGuard(services)
    app.add_request_guard(guard.refuse_blocked)
    app.after_request(guard.spend_on_refusal)
    return guard
