"""A redis-py client that records every command it sends and every round trip it makes.

Built on redis-py's own extension point (a ``Connection`` subclass handed to the pool), so the
app under test talks to the real server exactly as it would otherwise; the log only watches.
A round trip is one ``send_packed_command``: a single command, or a whole pipeline.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis


class CommandLog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._on = False
        self.commands: list[tuple[str, ...]] = []
        self.round_trips = 0

    @contextmanager
    def recording(self) -> Iterator[CommandLog]:
        """Record from a clean slate for the length of the block."""
        with self._lock:
            self.commands, self.round_trips, self._on = [], 0, True
        try:
            yield self
        finally:
            with self._lock:
                self._on = False

    def _command(self, args: tuple[Any, ...]) -> None:
        if self._on:
            text = tuple(a.decode(errors="replace") if isinstance(a, bytes) else str(a)
                         for a in args)
            with self._lock:
                self.commands.append(text)

    def _round_trip(self) -> None:
        if self._on:
            with self._lock:
                self.round_trips += 1

    def snapshot(self) -> CommandLog:
        """A copy of what was recorded, that later recordings leave alone."""
        copy = CommandLog()
        copy.commands, copy.round_trips = list(self.commands), self.round_trips
        return copy

    def named(self, *names: str) -> list[tuple[str, ...]]:
        """The recorded commands with one of these names (upper case), in order."""
        return [c for c in self.commands if c[0].upper() in names]

    def touching(self, text: str) -> list[tuple[str, ...]]:
        """The recorded commands with ``text`` in an argument (a key, a member...)."""
        return [c for c in self.commands if any(text in a for a in c[1:])]


def recording_client(url: str, log: CommandLog, *, decode: bool = True) -> redis.Redis:
    """A client for ``url`` (decoded answers, as the app's; ``decode`` False: bytes, as RQ's
    connection) whose commands land in ``log``."""

    class RecordingConnection(redis.Connection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            packer = self._command_packer
            pack = packer.pack

            def recorded(*command: Any) -> Any:
                log._command(command)
                return pack(*command)

            packer.pack = recorded  # type: ignore[method-assign]

        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            log._round_trip()
            super().send_packed_command(command, check_health)

    pool = redis.ConnectionPool.from_url(
        url, connection_class=RecordingConnection, decode_responses=decode,
        health_check_interval=0,
    )
    return redis.Redis(connection_pool=pool)
