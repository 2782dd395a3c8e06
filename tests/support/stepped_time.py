"""Time for the SDK's retry loop that moves only when the loop sleeps.

``SteppedTime.install(bot)`` gives an ``Agent``'s (or ``AsyncAgent``'s) transport this clock and
sleep: each wait the retry policy chose is recorded in ``slept`` and moves the clock on at once,
so a test asserts the waits asked for and the tries made, and a loaded machine cannot change
either. Built on a server's ``FrozenClock``, the same waits move that server's time (its rate
windows) too. ``on_sleep`` runs at each wait with the number of waits so far: a test changes
the world there (opens a port, say) at a known point between two tries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from app.clock import FrozenClock
from loom import AsyncAgent


class SteppedTime:
    def __init__(self, clock: FrozenClock | None = None, *,
                 on_sleep: Callable[[int], None] | None = None) -> None:
        self.clock = clock if clock is not None else FrozenClock()
        self.on_sleep = on_sleep
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.clock.now()

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.clock.advance(seconds)
        if self.on_sleep is not None:
            self.on_sleep(len(self.slept))

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)
        await asyncio.sleep(0)  # still a point where other tasks run, as a real wait is

    def install(self, bot: Any) -> Any:
        """``bot`` with its transport on this time; answers ``bot``."""
        bot.transport.clock = self.monotonic
        bot.transport.sleep = self.async_sleep if isinstance(bot, AsyncAgent) else self.sleep
        return bot
