"""Keeps raw ids out of log lines: the one URL that carries an id logs its keyed hash instead.

Seed 002 keeps scope ids out of URLs, but the console's view of a profile,
``GET /v1/profiles/<profile_id>/agent-state``, takes a customer handle (an email, a phone
number) in its path, and every access log (gunicorn's, werkzeug's) and every error line that
names ``request.path`` would write it verbatim. ``install`` wraps the process's log-record
factory once, so every record any logger creates, whichever handler or formatter later writes
it (plain text or JSON), has that path segment replaced by ``h:<keyed hash>`` (HMAC-SHA256 under
the install's secret, so equal ids still correlate across lines and nobody without the secret
can test a guess). Percent-encoded and plain spellings of one id give the same hash.

Every spelling a router or a client may use is caught: doubled slashes
(``//v1//profiles/<id>/agent-state``), percent-encoded letters or slashes anywhere in the path
(``/v1/%70rofiles/...``, an id holding ``%2F``), either case. A word of a line that decodes to
such a path is written as the canonical path with the hash.
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import unquote

from app.keyed import keyed_digest

_PURPOSE = b"loom.log.path_id.v1"
# The profile agent-state path in a decoded word: any run of slashes, any case; the id is
# everything between (it may hold a decoded slash).
_PROFILE_PATH = re.compile(r"/+v1/+profiles/+(.+?)/+agent-state", re.IGNORECASE)
# One word of a line: what a request line, a JSON string or a message separates by spaces or
# quotes.
_WORD = re.compile(r"[^\s\"']+")

_secret: bytes = b""
_base_factory: Any = None


def hashed_id(raw: str) -> str:
    return "h:" + keyed_digest(_secret, _PURPOSE, _decoded(raw))[:32]


def _decoded(text: str) -> str:
    # Percent-decoding until nothing changes (a few rounds): a client may encode twice.
    for _ in range(4):
        decoded = unquote(text)
        if decoded == text:
            break
        text = decoded
    return text


def _scrub_word(match: re.Match[str]) -> str:
    word = match.group(0)
    decoded = _decoded(word)
    if not _PROFILE_PATH.search(decoded):
        return word
    return _PROFILE_PATH.sub(
        lambda m: "/v1/profiles/" + hashed_id(m.group(1)) + "/agent-state", decoded)


def scrub(text: str) -> str:
    """``text`` with every profile id of an agent-state path replaced by its keyed hash."""
    if not _secret or ("%" not in text and "profiles" not in text.lower()):
        return text
    return _WORD.sub(_scrub_word, text)


def _scrub_value(value: Any) -> Any:
    return scrub(value) if isinstance(value, str) else value


def _scrubbing_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
    record: logging.LogRecord = _base_factory(*args, **kwargs)
    if isinstance(record.msg, str):
        record.msg = scrub(record.msg)
    if isinstance(record.args, dict):
        # gunicorn's access log passes its atoms (r, U, q, ...) as one mapping.
        record.args = {key: _scrub_value(value) for key, value in record.args.items()}
    elif isinstance(record.args, tuple):
        record.args = tuple(_scrub_value(value) for value in record.args)
    return record


def install(secret: str) -> None:
    """Scrub every log record of this process with ``secret`` (idempotent; the latest wins)."""
    global _secret, _base_factory
    _secret = secret.encode("utf-8")
    if _base_factory is None:
        _base_factory = logging.getLogRecordFactory()
        logging.setLogRecordFactory(_scrubbing_factory)
