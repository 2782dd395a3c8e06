"""Idempotency-Key on write ops: a repeat within a day answers the first answer, applies nothing.

A write op called with an ``Idempotency-Key`` header runs at most once per (caller, op,
identity, key). Before the handler runs, one script reserves the key (``app.store.idempotency``)
for a short lease (``LEASE_MS``) that this process renews while the try runs; a concurrent
duplicate finds the live lease and is answered ``409 IDEMPOTENCY_IN_PROGRESS`` with
``Retry-After``. After the handler, the answer (or the op's own refusal, a 4xx) is stored and
every repeat gets it back unchanged. The same key with a different body is ``422
IDEMPOTENCY_KEY_REUSED``.

Every write op keeps its answer in the key's record in the same step as its write, and writes
only while its try holds the key: the op declares a ``replay`` (the answer again from the
reply its step kept) and its store makes the step keep it: memory_write.lua for the memory
writes, ``app.store.idempotency.KeyedScript`` for any other write script (working memory,
agent state, budgets, a blacklist), ``transact`` for a write made by MULTI (namespace
documents, schemas, tokens, the org's switch). The record lives under the hash tag of the
subject the write touches (``Op.keyed_in``; the identity's user when none is declared), so on
Redis Cluster it sits in the slot of the write's keys. So when a try ends without an answer
(its process died, the store went away or stalled mid-write), the record says which it was:
the answer is there (the write committed; every repeat gets it), or the key is free once the
lease lapses (the write never ran; the next try runs it). A try that lost its lease to a later
one writes nothing and is answered 409 ``IDEMPOTENCY_IN_PROGRESS``. An op declared ``reruns``
(user.erase, whose start finds the user's one erasure) is simply run again by a retry.

A write declaring neither would have its write and answer in separate steps: a try that ended
without an answer may have been applied, so the key is marked unknown and a repeat is answered
``409 IDEMPOTENCY_OUTCOME_UNKNOWN``, never run again (no op of this release does;
tests/test_idempotency.py holds every write op to it). A refusal that says "try again" (a 429
or a contended write, both with ``Retry-After``) applied nothing and frees the key.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import threading
import time
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
from app.store import keys
from app.store.connection import UNAVAILABLE_ERRORS
from app.store.idempotency import HeldKey, IdempotencyStore, KeyRecord

log = logging.getLogger("loom.idempotency")

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 255
# How long a try holds its key without renewing it: a try whose process died lets go this long
# after its last renewal, so a repeat settles within seconds, never a minute.
LEASE_MS = 3_000
# How often a running try's lease is renewed: three renewals fit in one lease, so one late
# renewal (a busy process, a slow round trip) does not lose it.
RENEW_SECONDS = LEASE_MS / 3000
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


class _Renewer:
    """Renews the leases of this process's running tries: one daemon thread for all of them
    (a greenlet where gevent has patched ``threading``), asleep while none runs.

    Its lock, its event and its thread are made in the process that first holds a lease, after
    gevent's patch: gunicorn's master imports this module before it forks and patches, and a
    worker's greenlets waiting on the master's unpatched lock or event would block the whole
    worker. The lock is never held across a wait (starting the thread waits for it)."""

    def __init__(self) -> None:
        self._pid = 0
        self._lock: threading.Lock | None = None
        self._running: threading.Event | None = None
        self._held: dict[int, tuple[IdempotencyStore, KeyRecord, str]] = {}
        self._next = itertools.count()

    def _this_process(self) -> tuple[threading.Lock, threading.Event]:
        if self._pid != os.getpid() or self._lock is None or self._running is None:
            with _FIRST_USE:  # only steps that never wait, so no greenlet blocks on it
                started = self._pid == os.getpid() and self._lock is not None
                if not started:
                    self._pid = os.getpid()
                    self._held = {}
                    self._lock, self._running = threading.Lock(), threading.Event()
            if not started:
                threading.Thread(target=self._renew_forever,
                                 args=(self._lock, self._running),
                                 name="loom-idempotency-leases", daemon=True).start()
        assert self._lock is not None and self._running is not None
        return self._lock, self._running

    def hold(self, store: IdempotencyStore, record: KeyRecord, holder: str) -> int:
        lock, running = self._this_process()
        with lock:
            ticket = next(self._next)
            self._held[ticket] = (store, record, holder)
            running.set()
        return ticket

    def drop(self, ticket: int) -> None:
        lock, running = self._this_process()
        with lock:
            self._held.pop(ticket, None)
            if not self._held:
                running.clear()

    def _renew_forever(self, lock: threading.Lock, running: threading.Event) -> None:
        while True:
            running.wait()
            time.sleep(RENEW_SECONDS)
            with lock:
                by_store: dict[int, tuple[IdempotencyStore, list[tuple[KeyRecord, str]]]] = {}
                for store, record, holder in self._held.values():
                    by_store.setdefault(id(store), (store, []))[1].append((record, holder))
            for store, leases in by_store.values():
                try:
                    store.renew(leases, LEASE_MS)
                except Exception as error:
                    log.warning("could not renew %d %s lease(s): %s: %s", len(leases), HEADER,
                                type(error).__name__, error)


_FIRST_USE = threading.Lock()
_renewer = _Renewer()


def run_once(call: Call, key: str, body: dict[str, Any],
             run: Callable[[], dict[str, Any]],
             completed: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    """``run()``'s answer, computed once per key: repeats get the first answer back. A write
    script's kept reply becomes that answer through the op's ``replay`` and ``completed``
    (what ``run`` adds to the handler's answer)."""
    identity = call.identity
    tag = (call.op.keyed_in(call) if call.op.keyed_in is not None
           else keys.user_tag(identity.org, identity.namespace, identity.user_id))
    record = KeyRecord(tag, call.principal.actor, call.op.name, checked_key(key))
    store = call.services.store(IdempotencyStore)
    holder = uuid.uuid4().hex
    replay = call.op.replay
    begun = store.begin(record, fingerprint(body), holder, LEASE_MS,
                        recorded=replay is not None or call.op.reruns)
    if begun.state == "DONE":
        assert begun.answer is not None
        return _replay(begun.answer)
    if begun.state == "RECORDED":
        assert begun.answer is not None and replay is not None
        return completed(replay(call, begun.answer))
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
    held = HeldKey(record.redis_key, holder) if replay is not None else None
    call.held_key = held
    ticket = _renewer.hold(store, record, holder)
    try:
        answer = run()
    except LoomError as refusal:
        if refusal.status < 500 and "retry_after" not in refusal.details:
            _settle(store.finish, record, holder, json.dumps(
                {"status": refusal.status, "error": refusal.to_dict()}, ensure_ascii=False))
        elif refusal.status < 500 or held is not None or call.op.reruns:
            # Nothing applied, or (a write that keeps its answer) either the answer is kept
            # and the record refuses a release, or the write never ran: the key is free.
            _settle(store.release, record, holder)
        else:
            _settle(store.abandon, record, holder)
        raise
    except BaseException:
        _settle(store.release if held is not None or call.op.reruns else store.abandon,
                record, holder)
        raise
    finally:
        _renewer.drop(ticket)
    if held is None or not held.answered:
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
