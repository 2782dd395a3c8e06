"""What a store is handed: the settings, the Redis clients, the clock, the job dispatcher and
the other stores.

``app.services.Services`` builds every store and passes itself; this protocol is the part of
it a store may use, declared here so that no store imports the module that builds the stores.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from redis import Redis

from app.clock import Clock
from app.settings import Settings
from app.store.intents import JobQueues

StoreT = TypeVar("StoreT")


class StoreServices(Protocol):
    @property
    def settings(self) -> Settings: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def redis(self) -> Redis:
        """The data plane's client (replies decoded to text)."""
        ...

    @property
    def queue_redis(self) -> Redis:
        """RQ's own connection (replies as bytes, as RQ expects)."""
        ...

    @property
    def jobs(self) -> JobQueues:
        """The dispatcher of background work (``app.store.intents``): a store hands it intents
        and asks it about queued jobs; it never enqueues itself."""
        ...

    def store(self, store_class: type[StoreT]) -> StoreT:
        """The process's one instance of another store."""
        ...
