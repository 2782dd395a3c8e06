"""The per-token request budget: a fixed-window counter per caller in Redis; and the
per-address budget of refused tokens (``BadCredentialBudget``).

One pipelined INCRBY + EXPIRE per request (one round trip), shared by every web process; a
search adds its cost beyond the first request (``app.search_cost``) once its body is read.
On with LOOM_AUTH=on unless LOOM_RATE_LIMIT turns it off (``Settings.request_budget``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.store import keys

if TYPE_CHECKING:
    from app.store.services import StoreServices


class RateLimiter:
    def __init__(self, services: StoreServices) -> None:
        self.redis = services.redis
        self.clock = services.clock
        self.budget: tuple[int, int] | None = services.settings.request_budget

    def retry_after(self, caller: str, requests: int = 1) -> int | None:
        """Count ``requests`` against the caller's window; the seconds to wait when the caller
        is over budget, else None."""
        if self.budget is None:
            return None
        limit, period = self.budget
        now = self.clock.now()
        window = int(now // period)
        pipe = self.redis.pipeline(transaction=False)
        key = keys.rate_window(caller, window)
        pipe.incrby(key, requests)
        pipe.expire(key, period + 1)
        count, _ = pipe.execute()
        if count <= limit:
            return None
        return max(1, int((window + 1) * period - now + 0.999))


class BadCredentialBudget:
    """How many refused tokens one client address may send (``LOOM_BAD_TOKEN_LIMIT``).

    Counted only when a token is refused, so a good request costs no round trip. The window
    starts with the address's first refusal (EXPIRE NX), not at a wall-clock boundary, so a
    guesser cannot spend two budgets back to back across one.
    """

    def __init__(self, services: StoreServices) -> None:
        self.redis = services.redis
        self.budget: tuple[int, int] | None = services.settings.bad_token_limit

    def spend(self, address: str) -> int | None:
        """Count one refusal; the seconds until the window ends when over budget, else None."""
        if self.budget is None:
            return None
        limit, period = self.budget
        key = keys.bad_credentials(address)
        pipe = self.redis.pipeline(transaction=False)
        pipe.incr(key)
        pipe.expire(key, period, nx=True)
        pipe.ttl(key)
        count, _, ttl = pipe.execute()
        if int(count) <= limit:
            return None
        return max(1, int(ttl))
