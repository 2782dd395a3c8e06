"""Keeps raw ids out of log lines: the one URL that carries an id logs its keyed hash instead.

Seed 002 keeps scope ids out of URLs, but the console's view of a profile,
``GET /v1/profiles/<profile_id>/agent-state``, takes a customer handle (an email, a phone
number) in its path, and every access log (gunicorn's, werkzeug's) and every error line that
names ``request.path`` would write it verbatim. ``install`` wraps the process's log-record
factory once, so every record any logger creates, whichever handler or formatter later writes
it (plain text or JSON), has that path segment replaced by ``h:<keyed hash>`` (HMAC-SHA256 under
the install's secret, so equal ids still correlate across lines and nobody without the secret
can test a guess). Percent-encoded and plain spellings of one id give the same hash.
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import unquote

from app.keyed import keyed_digest

_PURPOSE = b"loom.log.path_id.v1"
# The id segment of the profile agent-state path, in a raw path or a full request line.
_PROFILE_PATH = re.compile(r"(/v1/profiles/)([^/?#\s\"]+)(/agent-state)")

_secret: bytes = b""
_base_factory: Any = None


def hashed_id(raw: str) -> str:
    return "h:" + keyed_digest(_secret, _PURPOSE, unquote(raw))[:32]


def scrub(text: str) -> str:
    """``text`` with every profile id of an agent-state path replaced by its keyed hash."""
    if "/v1/profiles/" not in text or not _secret:
        return text
    return _PROFILE_PATH.sub(lambda m: m.group(1) + hashed_id(m.group(2)) + m.group(3), text)


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
