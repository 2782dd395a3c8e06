"""When a call is sent again, and after how long: one policy for the sync and async transports.

An op's kind (from the registry, through the manifest) says what is safe:

- ``read`` and ``idempotent`` ops are sent again after a connection error (refused, reset,
  timeout, a kept-alive connection the server closed), a 503 or a 429, waiting
  ``Retry-After`` when the answer carries it, else an exponential backoff with jitter;
- every call that writes (``working_memory.append``, ``memory.set``, ...) is sent with an
  ``Idempotency-Key`` header, one key per call kept across its tries: Loom answers a repeat
  with the first answer and applies nothing, so a keyed write is retried as an idempotent op
  is, and also after ``409 IDEMPOTENCY_IN_PROGRESS``. An unkeyed write (kind ``write``, as a
  caller of ``retriable`` may still ask about) is sent again only when its request never left
  this machine.

What each answer to a keyed write means:

- ``200`` (or any other answer of the op): applied once, whichever try it answers;
- ``409 IDEMPOTENCY_IN_PROGRESS``: a try with this key is still running (or its process died
  and its short lease has not run out yet); sent again after ``Retry-After``, and answered by
  that try's outcome once it ends: its answer, or, when it never ran, the write run now;
- ``503`` or no answer at all (reset, timeout): unknown from here, but safe to send again with
  the same key, which settles it;
- ``409 IDEMPOTENCY_OUTCOME_UNKNOWN``: an op whose answer is a step of its own ended without
  one and may have been applied; never sent again: read the state, then write with a new key;
- ``422 IDEMPOTENCY_KEY_REUSED``: the key came with another body; never sent again.

Since only an answer says whether a keyed write applied, a keyed write is sent again until it
is answered or ``total`` runs out, however many tries that takes; ``attempts`` bounds every
other call, and a keyed write whose connection never opened (nothing reached the server).
``Retry(attempts=1)`` or ``retry=False`` on the ``Agent`` switches retries off. An op missing
from the manifest is treated as a ``write``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from loom.errors import LoomError, LoomTransportError, RateLimited, ServerError

SAFE_KINDS = frozenset({"read", "idempotent"})
# A write sent with an Idempotency-Key: Loom applies it once however often it is sent.
KEYED = "keyed"
IN_PROGRESS = "IDEMPOTENCY_IN_PROGRESS"
RETRIED_STATUSES = frozenset({429, 503})
MODEL_BUDGET_EXCEEDED = "MODEL_BUDGET_EXCEEDED"


@dataclass(frozen=True)
class Retry:
    """The retry policy of an ``Agent`` (``Agent(..., retry=Retry(attempts=5))``).

    ``attempts``: tries in all, the first included (1 = never retry); a keyed write, once
    retries are on, is bounded by ``total`` alone while it may have reached the server (see
    the module). ``backoff``: the first wait in seconds, doubled after each try up to
    ``max_wait``, with up to half of it taken off at random so that clients do not retry in
    step. ``Retry-After`` is waited as the
    server asks, unless it is longer than ``max_wait``: then the error is raised at once.
    ``total``: no new try starts after this many seconds since the first one began.
    """

    attempts: int = 3
    backoff: float = 0.2
    max_wait: float = 10.0
    total: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts counts the first try: 1 or more")
        if self.backoff < 0 or self.max_wait < 0 or self.total < 0:
            raise ValueError("backoff, max_wait and total are seconds, 0 or more")

    def wait_before_retry(
        self, kind: str, error: LoomError, attempt: int, elapsed: float
    ) -> float | None:
        """Seconds to wait before try ``attempt + 1``, or None when ``error`` is final."""
        if self.attempts == 1 or not retriable(kind, error):
            return None
        if attempt >= self.attempts and not (kind == KEYED and may_be_pending(error)):
            return None
        asked = retry_after(error)
        if asked is not None:
            wait = asked
            if wait > self.max_wait:
                return None
        else:
            step = min(self.backoff * 2 ** (attempt - 1), self.max_wait)
            wait = step * (1 - random.random() / 2)
        if elapsed + wait > self.total:
            return None
        return wait


NO_RETRY = Retry(attempts=1)


def retriable(kind: str, error: LoomError) -> bool:
    """Whether ``error`` leaves an op of ``kind`` (``keyed`` for a write sent with an
    Idempotency-Key) safe to send again. A model-call budget's refusal is a 429 that waiting
    seconds does not lift: never sent again."""
    if error.code == MODEL_BUDGET_EXCEEDED:
        return False
    if kind == KEYED:
        return isinstance(error, LoomTransportError) or error.code == IN_PROGRESS or (
            isinstance(error, RateLimited | ServerError) and error.status in RETRIED_STATUSES)
    if isinstance(error, LoomTransportError):
        return kind in SAFE_KINDS or not error.may_have_reached_server
    if isinstance(error, RateLimited | ServerError) and error.status in RETRIED_STATUSES:
        return kind in SAFE_KINDS
    return False


def may_be_pending(error: LoomError) -> bool:
    """Whether a keyed write's outcome may still be settling on the server, the reason it is
    sent again past ``attempts``: an answer (409 in progress, 503, 429) or a try that may have
    reached it. A connection that never opened holds no key and applied nothing: it is tried
    ``attempts`` times like any other call, so a caller with a fallback (agent state's offline
    queue) gets the error at once instead of after ``total`` seconds."""
    return not (isinstance(error, LoomTransportError) and not error.may_have_reached_server)


def retry_after(error: LoomError) -> float | None:
    """The wait a 429 or 503 asks for (its error's ``retry_after``, else the header)."""
    value = error.details.get("retry_after")
    if value is None and error.response is not None:
        value = error.response.headers.get("Retry-After")
    try:
        seconds = float(value) if value is not None else None
    except (TypeError, ValueError):
        return None  # an HTTP date or garbage: back off as without one
    return max(seconds, 0.0) if seconds is not None else None
