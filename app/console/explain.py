"""Why a structured profile has the status it has, in words, from what the ops answer.

``profile.structured`` answers a status; the console adds the reason a person asks for next
(stale since which change, pending because unbuilt, redacted, written by a caller or labelled
high). It reads only op answers (the profile row from ``memory.get``, the schema from
``profile_schema.get``, the user's facts from ``memory.list``), so it needs no store of its own.
"""

from __future__ import annotations

from typing import Any

# A profile row another actor than this worker wrote is a caller's and reads as no profile.
from app.store.structured import WORKER as STRUCTURED_WORKER

SOURCE_TYPES = ("semantic", "preference", "decision")


def structured_reason(
    answer: dict[str, Any],
    row: dict[str, Any] | None,
    schema: dict[str, Any],
    facts: list[dict[str, Any]],
    model_off: str = "",
) -> str:
    """One sentence on why ``answer['status']`` is what it is. ``model_off`` says why the
    worker makes no model call (none configured, or the org switched calls off), when so: a
    profile it has not built then waits on that, not on the worker's turn."""
    status = answer.get("status")
    if status in ("pending", "stale") and model_off and (row is None or row.get("deleted")
                                                         or status == "stale"):
        return f"Not built: {model_off}, so the worker makes no model call."
    if status == "no_schema":
        if schema.get("json_schema") is None:
            return "The namespace has no structured-profile schema: set one on its page."
        return "The namespace's stored schema no longer parses."
    if status == "pending":
        return _pending_reason(row)
    if status == "ready":
        if row is None or not answer.get("memory_id"):
            return "The user has no facts yet, so every property is empty."
        return "Built from the user's current facts under the current schema."
    if status == "stale":
        return _stale_reason(answer, schema, facts)
    return ""


def _pending_reason(row: dict[str, Any] | None) -> str:
    if row is None or row.get("deleted"):
        return "Not built yet: the worker has not reached this user since their facts arrived."
    if row.get("redacted"):
        return "The built profile was redacted; the worker rebuilds it on a later pass."
    if row.get("label") == "high":
        return ("The profile row is labelled high: it is held as it is until its key moves "
                "to a new version.")
    actor = row.get("actor") or row.get("written_by") or ""
    if actor != STRUCTURED_WORKER:
        return (f"The profile row was written by a caller ({actor or 'unknown'}), not the "
                "worker; the worker rebuilds over it unless it is pinned or locked.")
    return "The built profile has expired; the worker rebuilds it on a later pass."


def _stale_reason(
    answer: dict[str, Any], schema: dict[str, Any], facts: list[dict[str, Any]]
) -> str:
    built_at = answer.get("built_at") or ""
    set_at = schema.get("set_at") or ""
    if built_at and set_at and set_at > built_at:
        return f"Stale since the schema changed at {set_at} (built at {built_at})."
    changed = [
        fact for fact in facts
        if fact.get("memory_type") in SOURCE_TYPES and (fact.get("updated_at") or "") > built_at
    ]
    if changed:
        newest = max(changed, key=lambda fact: fact.get("updated_at") or "")
        verb = "was deleted" if newest.get("deleted") else "changed"
        more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
        return (f"Stale since fact {newest.get('key')!r} {verb} at {newest.get('updated_at')}"
                f"{more} (built at {built_at}).")
    return (f"Stale: a fact it counted was not served when it was built at {built_at}, or a "
            "source moved out of the profile's reach (tags, type, expiry).")
