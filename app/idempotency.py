"""Idempotency-Key on write ops: a repeat within a day answers the first answer, applies nothing.

A write op called with an ``Idempotency-Key`` header runs at most once per (caller, op,
identity, key). Before the handler runs, one script reserves the key (``app.store.idempotency``);
a concurrent duplicate finds the reservation and is answered ``409 IDEMPOTENCY_IN_PROGRESS``
with ``Retry-After``. After the handler, the answer (or the op's own refusal, a 4xx) is stored
and every repeat gets it back unchanged. The same key with a different body is ``422
IDEMPOTENCY_KEY_REUSED``.

The reservation comes first so that no write runs twice: when a call ends without an answer
(the store hung or dropped mid-write, the process died), the write may have been applied, so
the key is marked unknown (or, when even that cannot be written, its reservation simply
outlives ``RUNNING_MS``) and a repeat is answered ``409 IDEMPOTENCY_OUTCOME_UNKNOWN``, never run
again. A refusal that says "try again" (a 429 or a contended write, both with ``Retry-After``)
applied nothing and frees the key.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

from app.errors import (
    IdempotencyInProgress,
    IdempotencyKeyReused,
    IdempotencyOutcomeUnknown,
    LoomError,
    ValidationFailed,
)
from app.registry import Call
from app.store.connection import UNAVAILABLE_ERRORS
from app.store.idempotency import IdempotencyStore, KeyRecord

log = logging.getLogger("loom.idempotency")

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 255
# How long a first call may still be at work: past this, a reservation without an answer is an
# outcome nobody will report (a request never runs this long: gunicorn's timeout is shorter).
RUNNING_MS = 60_000
# Seconds a duplicate of a running call is asked to wait before asking again.
RUNNING_RETRY_AFTER = 1


def checked_key(value: str) -> str:
    """The header's value, or 422 naming the header: 1 to 255 visible ASCII characters."""
    if not 0 < len(value) <= MAX_KEY_LENGTH or not all(" " <= ch <= "~" for ch in value):
        raise ValidationFailed(
            {HEADER: [f"1 to {MAX_KEY_LENGTH} printable ASCII characters"]},
            f"invalid {HEADER} header",
        )
    return value


def fingerprint(body: dict[str, Any]) -> str:
    """The request as sent (body, path and query arguments), independent of key order."""
    canonical = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _replay(stored: str) -> dict[str, Any]:
    first = json.loads(stored)
    if "answer" in first:
        answer: dict[str, Any] = first["answer"]
        return answer
    error = first["error"]
    replayed = LoomError(error["message"], **{
        name: value for name, value in error.items() if name not in ("code", "message")})
    replayed.code = error["code"]
    replayed.status = first["status"]
    raise replayed


def run_once(call: Call, key: str, body: dict[str, Any],
             run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run()``'s answer, computed once per key: repeats get the first answer back."""
    identity = call.identity
    record = KeyRecord(identity.org, identity.namespace, identity.user_id,
                       call.principal.actor, call.op.name, checked_key(key))
    store = call.services.store(IdempotencyStore)
    holder = uuid.uuid4().hex
    begun = store.begin(record, fingerprint(body), holder, RUNNING_MS)
    if begun.state == "DONE":
        assert begun.answer is not None
        return _replay(begun.answer)
    if begun.state == "REUSED":
        raise IdempotencyKeyReused(
            f"this {HEADER} was first sent with another body; use a new key for a new request",
            idempotency_key=key)
    if begun.state == "RUNNING":
        raise IdempotencyInProgress(
            f"the first {call.op.name} with this {HEADER} is still running",
            idempotency_key=key, retry_after=RUNNING_RETRY_AFTER)
    if begun.state == "UNKNOWN":
        raise IdempotencyOutcomeUnknown(
            f"the first {call.op.name} with this {HEADER} ended without an answer and may "
            "have been applied; read the state, then send with a new key",
            idempotency_key=key)
    try:
        answer = run()
    except LoomError as refusal:
        if refusal.status < 500 and "retry_after" not in refusal.details:
            _settle(store.finish, record, holder, json.dumps(
                {"status": refusal.status, "error": refusal.to_dict()}, ensure_ascii=False))
        elif refusal.status < 500:
            _settle(store.release, record, holder)
        else:
            _settle(store.abandon, record, holder)
        raise
    except BaseException:
        _settle(store.abandon, record, holder)
        raise
    _settle(store.finish, record, holder,
            json.dumps({"status": 200, "answer": answer}, ensure_ascii=False))
    return answer


def _settle(step: Callable[..., bool], *args: Any) -> None:
    """Record the outcome; a store that is gone by now leaves the reservation to run out."""
    try:
        step(*args)
    except UNAVAILABLE_ERRORS as error:
        log.warning("could not record an %s outcome: %s: %s", HEADER, type(error).__name__,
                    error)
