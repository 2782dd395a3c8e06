"""Small shapes the stores share when they talk to Redis in bulk."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

Item = TypeVar("Item")


def pairs(flat: Sequence[str]) -> dict[str, str]:
    """A script's flat ``[field, value, field, value, ...]`` reply as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def batches(items: Iterable[Item], size: int) -> Iterator[list[Item]]:
    """``items`` in lists of at most ``size``, so one pipeline never grows without bound."""
    batch: list[Item] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch
