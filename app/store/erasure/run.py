"""One attempt at an erasure: whom it erases, under which lock, and who watches its steps."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from app.store import keys

Progress = Callable[[str, dict[str, Any]], None]
# Set by a caller that shows progress of a run in its own process (tests, the ``export``
# command): each finished step calls it with the step's name and the counts so far. The
# ``erase`` command follows a background run through ``erasure.status`` instead.
PROGRESS: ContextVar[Progress | None] = ContextVar("loom_erasure_progress", default=None)


@dataclass
class ErasureRun:
    org: str
    namespace: str
    user_id: str
    erasure_id: str
    # The keyed digest of each agent-state subject that is the user (never the handle).
    subjects: list[str]
    actor: str
    token: str = ""
    progress: Progress | None = None
    # Set by the lock's heartbeat when another process took the lock over.
    lost: list[bool] = field(default_factory=list)

    @property
    def user(self) -> tuple[str, str, str]:
        return (self.org, self.namespace, self.user_id)

    @property
    def marker(self) -> str:
        return keys.user_erasing(*self.user)

    @property
    def record(self) -> str:
        return keys.erasure(self.org, self.namespace, self.erasure_id)

    @property
    def lock(self) -> str:
        return keys.erasure_lock(self.org, self.namespace, self.erasure_id)


class LockLost(Exception):
    """Another process took over the erasure: stop without writing its outcome."""
