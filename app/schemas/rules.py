"""The rules of an op's body that JSON Schema cannot state, as the OpenAPI document states them.

A request schema's ``x-loom-rules`` (an OpenAPI extension) lists them in a small vocabulary,
each naming the fields it reads; a field left out (or null) keeps every rule that reads it:

- ``after``: the moment in ``field`` is later than the one in ``than`` (two fields compared);
- ``future``: the moment in ``field`` is later than the moment the request arrives (the clock);
- ``length_within``: ``field``'s length is at most the value in ``limit``, or ``default`` when
  that is left out (or names no field); ``measure`` is ``characters`` (a string's), ``json``
  (its canonical JSON's, ``app.store.memory_row.canonical_json``) or ``json_bytes`` (the UTF-8
  bytes of that text);
- ``unique_by``: in the list at ``path`` within ``field`` (object keys, ``*`` for every item of
  a list), no two objects hold the same value of ``member``;
- ``re2_pattern``: every string at ``path`` within ``field`` compiles as a Python and an RE2
  regular expression and does not match the empty string (``app.pii``'s pattern rules);
- ``retention_fits``: every object type at ``path`` within ``field`` has a ``retention`` that
  names its declared ``fields`` only (and ``state``), none kept longer than the state
  (``app.object_types``);
- ``pattern_compiles``: every string at ``path`` within ``field`` compiles as a Python regular
  expression (the dialect a profile schema's answers are checked with, ``app.profile_schema``);
- ``ordered``: in every object at ``path`` within ``field`` that holds both, the number in
  ``low`` is at most the one in ``high`` (two values compared);
- ``answer_fits``: the profile schema in ``field`` sizes a full answer at most ``max_values``
  values and ``max_tokens`` output tokens (sums over its properties, by
  ``app.profile_schema``'s ``answer_value_count`` and ``output_cap_estimate``);
- ``terms_within``: the query in ``field`` holds at most ``max`` distinct terms once its words
  are lower-cased, stop words dropped and each stemmed (``app.store.recall_terms.query_terms``,
  the terms a search reads).

In a ``path``, ``*`` steps into every item of a list and every value of an object.

The op stays the authority (its own validators and error codes); ``rule_holds`` reads a rule
the way a client would, and CI's schemathesis run uses it to draw only bodies that keep them.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

RULES = ("after", "future", "length_within", "unique_by", "re2_pattern",
         "retention_fits", "pattern_compiles", "ordered", "answer_fits", "terms_within")


def after(field: str, than: str) -> dict[str, Any]:
    return {"rule": "after", "field": field, "than": than}


def future(field: str) -> dict[str, Any]:
    return {"rule": "future", "field": field}


def length_within(field: str, limit: str | None, default: int, measure: str) -> dict[str, Any]:
    return {"rule": "length_within", "field": field, "limit": limit, "default": default,
            "measure": measure}


def unique_by(field: str, path: list[str], member: str) -> dict[str, Any]:
    return {"rule": "unique_by", "field": field, "path": path, "member": member}


def re2_pattern(field: str, path: list[str]) -> dict[str, Any]:
    return {"rule": "re2_pattern", "field": field, "path": path}


def pattern_compiles(field: str, path: list[str]) -> dict[str, Any]:
    return {"rule": "pattern_compiles", "field": field, "path": path}


def ordered(field: str, path: list[str], low: str, high: str) -> dict[str, Any]:
    return {"rule": "ordered", "field": field, "path": path, "low": low, "high": high}


def answer_fits(field: str, max_values: int, max_tokens: int) -> dict[str, Any]:
    return {"rule": "answer_fits", "field": field, "max_values": max_values,
            "max_tokens": max_tokens}


def terms_within(field: str, most: int) -> dict[str, Any]:
    return {"rule": "terms_within", "field": field, "max": most}


def _at(value: Any, path: list[str]) -> list[Any]:
    """The values at ``path`` within ``value``; a step that does not fit leads nowhere."""
    found = [value]
    for step in path:
        if step == "*":
            found = [item for node in found if isinstance(node, list | dict)
                     for item in (node.values() if isinstance(node, dict) else node)]
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


def _python_patterns(patterns: list[Any]) -> bool:
    for pattern in patterns:
        if not isinstance(pattern, str):
            continue
        try:
            re.compile(pattern)
        except re.error:
            return False
    return True


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _in_order(nodes: list[Any], low: str, high: str) -> bool:
    return all(node[low] <= node[high] for node in nodes if isinstance(node, dict)
               and _number(node.get(low)) and _number(node.get(high)))


def _answer_fits(doc: Any, max_values: int, max_tokens: int) -> bool:
    from app.profile_schema import answer_value_count, output_cap_estimate  # the op's sums

    if not isinstance(doc, dict):
        return True
    return answer_value_count(doc) <= max_values and output_cap_estimate(doc) <= max_tokens


def _moment(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _length(value: Any, measure: str) -> int | None:
    if measure in ("json", "json_bytes"):
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
        return len(text.encode("utf-8")) if measure == "json_bytes" else len(text)
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
        limit = body.get(rule["limit"]) if rule["limit"] else None
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
    if kind == "pattern_compiles":
        return _python_patterns(_at(value, rule["path"]))
    if kind == "ordered":
        return _in_order(_at(value, rule["path"]), rule["low"], rule["high"])
    if kind == "answer_fits":
        return _answer_fits(value, rule["max_values"], rule["max_tokens"])
    if kind == "terms_within":
        from app.store.recall_terms import query_terms  # the terms a search reads

        return not isinstance(value, str) or len(query_terms(value)) <= rule["max"]
    raise ValueError(f"x-loom-rules: no rule {kind!r} (known: {', '.join(RULES)})")
