"""What a request or a job needs from the process: settings, Redis clients, the clock, stores.

One ``Services`` hangs off ``app.extensions["loom"]`` (and is built the same way by jobs).
Stores are built on first use and kept, so a plane adds a store class without touching this
module: ``services.store(WorkingMemoryStore)``.
"""

from __future__ import annotations

import hmac
import threading
from typing import Any, TypeVar

import redis

from app.clock import Clock
from app.errors import AuthInvalid, AuthRequired, RateLimited
from app.job_dispatch import JobDispatcher
from app.principal import ANY, Principal, single_user
from app.settings import Settings
from app.store.connection import connect
from app.store.ratelimit import RateLimiter
from app.store.tokens import TokenStore

StoreT = TypeVar("StoreT")


class Services:
    def __init__(
        self,
        settings: Settings,
        redis_client: redis.Redis | None = None,
        clock: Clock | None = None,
        queue_redis: redis.Redis | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock or Clock()
        self.redis = redis_client or connect(settings)
        self._queue_redis = queue_redis
        self.jobs = JobDispatcher(lambda: self.queue_redis)
        self._stores: dict[type, Any] = {}
        self._lock = threading.Lock()
        self._single_user = single_user(settings.default_org)
        self._install_admin = Principal(org=ANY, role="admin", default_org=settings.default_org)

    @property
    def queue_redis(self) -> redis.Redis:
        """RQ's own connection (bytes, as RQ expects); built on first use."""
        if self._queue_redis is None:
            self._queue_redis = connect(
                self.settings, self.settings.queue_redis_url, decode=False
            )
        return self._queue_redis

    def authenticate(self, headers: Any) -> Principal:
        """The caller's principal from ``Authorization: Bearer <token>``.

        With auth off, a call without a token is the install's single user (seed 004); a call
        that sends a token is held to it either way.
        """
        header = headers.get("Authorization", "")
        if not header:
            if self.settings.auth == "off":
                return self._single_user
            raise AuthRequired("auth is on: send Authorization: Bearer <token>")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthInvalid("the Authorization header must be Bearer <token>")
        admin = self.settings.admin_token
        if admin and hmac.compare_digest(token.encode(), admin.encode()):
            return self._install_admin
        principal = self.store(TokenStore).principal_for(token, self.settings.default_org)
        if principal is None:
            raise AuthInvalid("unknown, revoked or expired token")
        return principal

    def check_budget(self, principal: Principal) -> None:
        """Count the request against the caller's budget; 429 with Retry-After when over."""
        if self.settings.request_budget is None:
            return
        self._spend(principal, 1)

    def charge_cost(self, principal: Principal, cost: int) -> None:
        """Count what a costly op (a search) costs beyond the one request ``check_budget``
        counted; 429 with Retry-After when that puts the caller over budget. The cost is capped
        at the whole budget, so the dearest call still fits in an unspent window."""
        budget = self.settings.request_budget
        if budget is None:
            return
        beyond = min(cost, budget[0]) - 1
        if beyond > 0:
            self._spend(principal, beyond)

    def _spend(self, principal: Principal, requests: int) -> None:
        caller = principal.token_id or ("install-admin" if principal.org == ANY else "single-user")
        retry_after = self.store(RateLimiter).retry_after(caller, requests)
        if retry_after is not None:
            raise RateLimited("request budget spent for this token", retry_after=retry_after)

    def store(self, store_class: type[StoreT]) -> StoreT:
        found = self._stores.get(store_class)
        if found is None:
            with self._lock:
                found = self._stores.get(store_class)
                if found is None:
                    # Every store takes these services (app.store.services.StoreServices).
                    found = store_class(self)  # type: ignore[call-arg]
                    self._stores[store_class] = found
        return found

