"""The rules of an op's body that JSON Schema cannot state, as the OpenAPI document states them.

A request schema's ``x-loom-rules`` (an OpenAPI extension) lists them in a small vocabulary,
each naming the fields it reads; a field left out (or null) keeps every rule that reads it:

- ``after``: the moment in ``field`` is later than the one in ``than`` (two fields compared);
- ``future``: the moment in ``field`` is later than the moment the request arrives (the clock);
- ``length_within``: ``field``'s length is at most the value in ``limit``, or ``default`` when
  that is left out; ``measure`` is ``characters`` (a string's) or ``json`` (its canonical JSON's,
  ``app.store.memory_row.canonical_json``);
- ``unique_by``: in the list at ``path`` within ``field`` (object keys, ``*`` for every item of
  a list), no two objects hold the same value of ``member``;
- ``re2_pattern``: every string at ``path`` within ``field`` compiles as a Python and an RE2
  regular expression and does not match the empty string (``app.pii``'s pattern rules);
- ``retention_fits``: every object type at ``path`` within ``field`` has a ``retention`` that
  names its declared ``fields`` only (and ``state``), none kept longer than the state
  (``app.object_types``).

The op stays the authority (its own validators and error codes); ``rule_holds`` reads a rule
the way a client would, and CI's schemathesis run uses it to draw only bodies that keep them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

RULES = ("after", "future", "length_within", "unique_by", "re2_pattern",
         "retention_fits")


def after(field: str, than: str) -> dict[str, Any]:
    return {"rule": "after", "field": field, "than": than}


def future(field: str) -> dict[str, Any]:
    return {"rule": "future", "field": field}


def length_within(field: str, limit: str, default: int, measure: str) -> dict[str, Any]:
    return {"rule": "length_within", "field": field, "limit": limit, "default": default,
            "measure": measure}


def unique_by(field: str, path: list[str], member: str) -> dict[str, Any]:
    return {"rule": "unique_by", "field": field, "path": path, "member": member}


def re2_pattern(field: str, path: list[str]) -> dict[str, Any]:
    return {"rule": "re2_pattern", "field": field, "path": path}


def _at(value: Any, path: list[str]) -> list[Any]:
    """The values at ``path`` within ``value``; a step that does not fit leads nowhere."""
    found = [value]
    for step in path:
        if step == "*":
            found = [item for node in found if isinstance(node, list) for item in node]
        else:
            found = [node[step] for node in found if isinstance(node, dict) and step in node]
    return found


def retention_within_state(field: str, path: list[str]) -> dict[str, Any]:
    return {"rule": "retention_fits", "field": field, "path": path}


def _unique(lists: list[Any], member: str) -> bool:
    for items in lists:
        if not isinstance(items, list):
            continue
        values = [json.dumps(item[member], sort_keys=True) for item in items
                  if isinstance(item, dict) and member in item]
        if len(values) != len(set(values)):
            return False
    return True


def _compiles(patterns: list[Any]) -> bool:
    from app.pii import pattern_is_accepted  # the op's own pattern rules

    return all(pattern_is_accepted(pattern) for pattern in patterns if isinstance(pattern, str))


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
    if kind == "unique_by":
        return _unique(_at(value, rule["path"]), rule["member"])
    if kind == "re2_pattern":
        return _compiles(_at(value, rule["path"]))
    if kind == "retention_fits":
        from app.object_types import retention_fits  # the op's own retention rules

        return all(retention_fits(item) for item in _at(value, rule["path"]))
    raise ValueError(f"x-loom-rules: no rule {kind!r} (known: {', '.join(RULES)})")
