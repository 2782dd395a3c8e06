"""redis-py's answers narrowed to ``str``: the one place the stores turn ``bytes | str`` into text.

The data plane's clients are built with ``decode_responses=True`` (app/store/connection.py), so
every string Redis answers arrives as ``str``; redis-py types its answers ``bytes | str`` whatever
the client. These helpers narrow an answer for the type checker and are right at run time too:
a ``bytes`` answer (a client built with ``decode=False``) is decoded as UTF-8, as redis-py's own
decoding does, instead of travelling on as a wrong type. Checking each item costs nanoseconds
next to the round trip that fetched it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# What redis-py says a string answer is.
Reply = bytes | str


def text(value: Reply) -> str:
    return value if isinstance(value, str) else value.decode()


def optional_text(value: Reply | None) -> str | None:
    return None if value is None else text(value)


def texts(values: Iterable[Reply]) -> list[str]:
    """A list answer (ZRANGE, SMEMBERS, HKEYS ...) as text, in its order."""
    return [text(value) for value in values]


def optional_texts(values: Iterable[Reply | None]) -> list[str | None]:
    """An HMGET or MGET answer: text, or None where the field or key is missing."""
    return [optional_text(value) for value in values]


def text_set(values: Iterable[Reply]) -> set[str]:
    return {text(value) for value in values}


def text_map(mapping: Mapping[Reply, Reply]) -> dict[str, str]:
    """An HGETALL answer as text."""
    return {text(name): text(value) for name, value in mapping.items()}


def scored(pairs: Iterable[tuple[Reply, float]]) -> list[tuple[str, float]]:
    """A WITHSCORES answer: (member, score) pairs, member as text."""
    return [(text(member), score) for member, score in pairs]
