"""The per-token request budget: a fixed-window counter per caller in Redis.

One pipelined INCR + EXPIRE per request (one round trip), shared by every web process. Off
unless LOOM_RATE_LIMIT is set.
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
        self.budget: tuple[int, int] | None = services.settings.rate_limit

    def retry_after(self, caller: str) -> int | None:
        """Count one request; the seconds to wait when the caller is over budget, else None."""
        if self.budget is None:
            return None
        limit, period = self.budget
        now = self.clock.now()
        window = int(now // period)
        pipe = self.redis.pipeline(transaction=False)
        key = keys.rate_window(caller, window)
        pipe.incr(key)
        pipe.expire(key, period + 1)
        count, _ = pipe.execute()
        if count <= limit:
            return None
        return max(1, int((window + 1) * period - now + 0.999))
