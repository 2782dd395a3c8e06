"""redis-py's answers narrowed to ``str``: the one place the stores turn a reply into text.

The data plane's clients are built with ``decode_responses=True`` (app/store/connection.py), so
every string Redis answers arrives as ``str``, but redis-py types its answers ``bytes | str``
(and a sorted-set range as one of three shapes) whatever the client. These helpers narrow an
answer for the type checker and hold at run time too: a ``bytes`` answer (a client built with
``decode=False``) is decoded as UTF-8, as redis-py's own decoding does, and anything else is a
``TypeError`` here rather than a wrong type further on. Checking each item costs nanoseconds
next to the round trip that fetched it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode()
    raise TypeError(f"expected a string reply, got {type(value).__name__}")


def optional_text(value: object) -> str | None:
    """A GET or HGET answer: text, or None for a missing key or field."""
    return None if value is None else text(value)


def texts(values: Iterable[object]) -> list[str]:
    """A list answer (ZRANGE without scores, SMEMBERS, HKEYS ...) as text, in its order."""
    return [text(value) for value in values]


def optional_texts(values: Iterable[object]) -> list[str | None]:
    """An HMGET or MGET answer: text, or None where the field or key is missing."""
    return [optional_text(value) for value in values]


def text_set(values: Iterable[object]) -> set[str]:
    return {text(value) for value in values}


def text_map(mapping: Mapping[Any, Any]) -> dict[str, str]:
    """An HGETALL answer as text."""
    return {text(name): text(value) for name, value in mapping.items()}


def scored(pairs: Iterable[Any]) -> list[tuple[str, float]]:
    """A WITHSCORES answer (tuples over RESP2, two-item lists over RESP3) as (member, score)."""
    return [(text(member), float(score)) for member, score in pairs]
