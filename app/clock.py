"""Time, injectable: stores and jobs ask a Clock, so tests can move time without sleeping."""

from __future__ import annotations

import time
from datetime import datetime, timedelta


class Clock:
    """The real clock. Versions are nanosecond integers; everything else reads seconds."""

    def now_ns(self) -> int:
        return time.time_ns()

    def now(self) -> float:
        return self.now_ns() / 1e9


class FrozenClock(Clock):
    """A clock that moves only when told to (tests, benchmarks of the planner)."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._ns = int(start * 1e9)

    def now_ns(self) -> int:
        return self._ns

    def advance(self, seconds: float) -> None:
        self._ns += int(seconds * 1e9)


_NAIVE_EPOCH = datetime(1970, 1, 1)


def iso_from_ns(ns: int) -> str:
    """ISO 8601 in UTC with microseconds, the form every answer uses for a time.

    Integer arithmetic only: a version read as a time is exact to the microsecond (the
    nanoseconds below it are cut, never rounded through a float into the next microsecond).
    """
    # Naive arithmetic from a naive epoch: the same digits as an aware datetime's, without
    # the time zone's offset to format and cut off again.
    return (_NAIVE_EPOCH + timedelta(microseconds=ns // 1000)).isoformat() + "Z"
