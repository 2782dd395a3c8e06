"""The rules of an op's body that JSON Schema cannot state, as the OpenAPI document states them.

A request schema's ``x-loom-rules`` (an OpenAPI extension) lists them in a small vocabulary,
each naming the fields it reads; a field left out (or null) keeps every rule that reads it:

- ``after``: the moment in ``field`` is later than the one in ``than`` (two fields compared);
- ``future``: the moment in ``field`` is later than the moment the request arrives (the clock);
- ``length_within``: ``field``'s length is at most the value in ``limit``, or ``default`` when
  that is left out; ``measure`` is ``characters`` (a string's) or ``json`` (its canonical JSON's,
  ``app.store.memory_row.canonical_json``).

The op stays the authority (its own validators and error codes); ``rule_holds`` reads a rule
the way a client would, and CI's schemathesis run uses it to draw only bodies that keep them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

RULES = ("after", "future", "length_within")


def after(field: str, than: str) -> dict[str, Any]:
    return {"rule": "after", "field": field, "than": than}


def future(field: str) -> dict[str, Any]:
    return {"rule": "future", "field": field}


def length_within(field: str, limit: str, default: int, measure: str) -> dict[str, Any]:
    return {"rule": "length_within", "field": field, "limit": limit, "default": default,
            "measure": measure}


def _moment(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _length(value: Any, measure: str) -> int | None:
    if measure == "json":
        return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True))
    return len(value) if isinstance(value, str) else None


def rule_holds(rule: dict[str, Any], body: dict[str, Any], *,
               now: datetime | None = None) -> bool:
    """Whether ``body`` keeps ``rule``; a value of the wrong kind is the schema's to refuse,
    not the rule's, so it keeps it."""
    kind = rule["rule"]
    value = body.get(rule["field"])
    if value is None:
        return True
    if kind == "after":
        later, earlier = _moment(value), _moment(body.get(rule["than"]))
        return later is None or earlier is None or later > earlier
    if kind == "future":
        moment = _moment(value)
        return moment is None or moment > (now or datetime.now(UTC))
    if kind == "length_within":
        limit = body.get(rule["limit"])
        limit = rule["default"] if limit is None else limit
        length = _length(value, rule["measure"])
        return length is None or not isinstance(limit, int) or length <= limit
    raise ValueError(f"x-loom-rules: no rule {kind!r} (known: {', '.join(RULES)})")
