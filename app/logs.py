"""Loom's log lines: one JSON object a line (or plain text for a terminal), in every process.

``configure_logging`` puts one handler on the root logger of the web, worker and scheduler
processes, so Loom's own INFO lines and RQ's reach the same output in the same shape. The
fields a request or a job binds with ``bind`` (``request_id``, ``op``, ``org``, ``namespace``,
``job_id``, ``function``) ride on every line written while it runs; they live in a context
variable, so a thread or a forked RQ work horse sees only its own.

What may appear: ops, orgs, namespaces, statuses, durations, job ids and function names.
What never does: a user, session or scope id, a token or a secret. A line that must point at
one user names ``user_digest``, the keyed hash from ``user_digest()``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from contextvars import ContextVar
from json.encoder import encode_basestring
from typing import Any

from app.keyed import keyed_digest

LOG_FORMATS = ("auto", "json", "text")
# The probes a load balancer or a platform polls every few seconds: no access line, neither
# Loom's nor gunicorn's, or they would drown the rest.
PROBE_PATHS = frozenset(("/healthz", "/readyz"))

# The fields that ``bind`` and ``extra=`` may set, in the order a JSON line lists them.
CONTEXT_FIELDS = (
    "request_id",
    "op",
    "status",
    "duration_ms",
    "org",
    "namespace",
    "job_id",
    "function",
    "queue",
    "user_digest",
)

_FIELD_NAMES = frozenset(CONTEXT_FIELDS)
_NOTHING: dict[str, Any] = {}

_context: ContextVar[dict[str, Any] | None] = ContextVar("loom_log_context", default=None)


def bound() -> dict[str, Any]:
    return dict(_context.get() or _NOTHING)


def bind(**fields: Any) -> None:
    """Add fields to every line this request or job writes from now on."""
    if not fields.keys() <= _FIELD_NAMES:
        raise ValueError(f"not a log field: {sorted(set(fields) - _FIELD_NAMES)}")
    merged = dict(_context.get() or _NOTHING)
    for name, value in fields.items():
        if value is not None:
            merged[name] = value
    _context.set(merged)


def bind_fresh(**fields: Any) -> None:
    """Forget what was bound, then bind ``fields``: the start of a request."""
    if not fields.keys() <= _FIELD_NAMES:
        raise ValueError(f"not a log field: {sorted(set(fields) - _FIELD_NAMES)}")
    _context.set({name: value for name, value in fields.items() if value is not None})


def clear() -> None:
    _context.set(None)


@contextlib.contextmanager
def bound_to(**fields: Any) -> Iterator[None]:
    """Bind fields for the length of a block, then restore what was bound before."""
    token = _context.set({**(_context.get() or {}), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def user_digest(secret: str, org: str, namespace: str, user_id: str) -> str:
    """A short keyed hash naming one user in a log line without the raw id."""
    return keyed_digest(secret.encode(), b"loom-log-user", org, namespace, user_id)[:16]


# json.dumps builds a new encoder for every call that passes options; one is enough.
_encode_line = json.JSONEncoder(ensure_ascii=False, default=str).encode


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, then the bound fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _iso_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = _context.get() or _NOTHING
        given = record.__dict__
        for name in CONTEXT_FIELDS:
            value = given.get(name)
            if value is None:
                value = context.get(name)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        return _encode_line(line)


class TextFormatter(logging.Formatter):
    """A terminal's line: time, level, logger, message, then the bound fields as key=value."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        context = _context.get() or _NOTHING
        pairs = []
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is None:
                value = context.get(name)
            if value is not None:
                pairs.append(f"{name}={value}")
        return text + (" " + " ".join(pairs) if pairs else "")


# The last second formatted: a busy process writes many lines within one second.
_last_second: tuple[int, str] = (-1, "")


def _iso_time(created: float) -> str:
    global _last_second
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    cached_second, prefix = _last_second
    if seconds != cached_second:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        _last_second = (seconds, prefix)
    return f"{prefix}.{millis:03d}Z"


def _sole_json_handler(logger: logging.Logger) -> logging.StreamHandler | None:  # type: ignore[type-arg]
    """Loom's own JSON handler when it is the only one an INFO line of ``logger`` reaches and no
    filter stands in the way; else None (a test's capture, a text format, another handler)."""
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        if current.handlers:
            handler = current.handlers[0]
            if (current is not logging.root or len(current.handlers) != 1
                    or not getattr(handler, _MARK, False) or handler.filters
                    or type(handler.formatter) is not JsonFormatter
                    or handler.level > logging.INFO):
                return None
            return handler  # type: ignore[return-value]
        if not current.propagate:
            return None
        current = current.parent
    return None


_encode_text = encode_basestring  # a str as JSON, non-ASCII kept: as _encode_line
_INFINITE = (float("-inf"), float("inf"))


def _json_value(value: Any) -> str:
    """``value`` as ``_encode_line`` writes it, without an encoder for the common types."""
    kind = type(value)
    if kind is str:
        return _encode_text(value)
    if kind is int or (kind is float and value == value and value not in _INFINITE):
        return repr(value)
    return _encode_line(value)


def info_line(logger: logging.Logger, message: str, **fields: Any) -> None:
    """``logger.info(message, extra=fields)`` for a line made of Loom's own values (no path, no
    raw id): when Loom's JSON handler is the only one that would see it, the same line, byte
    for byte, is written without a LogRecord, the record factory, the handler chain or a JSON
    encoder (the access line runs once a request)."""
    if not logger.isEnabledFor(logging.INFO):
        return
    handler = _sole_json_handler(logger)
    if handler is None:
        logger.info(message, extra=fields)
        return
    # JsonFormatter's line: its four fields, then the context fields in their order, a given
    # one first, else the bound one (bind keeps no None).
    context = _context.get() or _NOTHING
    line = (f'{{"time": "{_iso_time(time.time())}", "level": "INFO", "logger": '
            f'{_encode_text(logger.name)}, "message": {_encode_text(message)}')
    # Membership tests, not .get calls: ten fields a request.
    for name in CONTEXT_FIELDS:
        if name in fields and fields[name] is not None:
            value = fields[name]
        elif name in context:
            value = context[name]
        else:
            continue
        line += f', "{name}": {_encode_text(value) if type(value) is str else _json_value(value)}'
    try:
        handler.write_line(line + "}")  # type: ignore[attr-defined]
    except Exception:  # as the handler would: a line that cannot be written stops no request
        handler.handleError(logger.makeRecord(logger.name, logging.INFO, "(unknown file)", 0,
                                              message, (), None, extra=fields))


def pass_level(did_something: bool | int) -> int:
    """The level of a periodic pass's summary line: INFO when the pass did something, DEBUG
    when it had nothing to do (a worker's log holds what happened, not that a clock ticked)."""
    return logging.INFO if did_something else logging.DEBUG


def resolve_format(value: str, stream: Any = None) -> str:
    """``auto``: text when the output is a terminal, JSON otherwise (a deploy's log pipe)."""
    if value != "auto":
        return value
    stream = stream if stream is not None else sys.stderr
    try:
        return "text" if stream.isatty() else "json"
    except (AttributeError, ValueError):
        return "json"


def make_formatter(log_format: str) -> logging.Formatter:
    return JsonFormatter() if resolve_format(log_format) == "json" else TextFormatter()


_MARK = "_loom_handler"


class _LineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that does not flush stderr again after each line: stderr is
    line-buffered, so the line's newline has flushed it already (or, under
    PYTHONUNBUFFERED, it has no buffer at all)."""

    def flush(self) -> None:
        if not _flushes_itself(self.stream):
            super().flush()

    def write_line(self, line: str) -> None:
        """One whole line and its flush, under one taking of the handler's lock."""
        with self.lock:  # type: ignore[union-attr]
            stream = self.stream
            stream.write(line + self.terminator)
            if self._flushing_checked is not stream:
                # The stream's buffering is read once per stream (an ABC isinstance check
                # costs more than the line's write).
                self._flushing_checked, self._needs_flush = stream, not _flushes_itself(stream)
            if self._needs_flush:
                stream.flush()

    _flushing_checked: Any = None
    _needs_flush = True


def _flushes_itself(stream: Any) -> bool:
    return bool(getattr(stream, "line_buffering", False) or (
        getattr(stream, "write_through", False)
        and isinstance(getattr(stream, "buffer", None), io.RawIOBase)))


def configure_logging(log_format: str | None = None, level: int = logging.INFO) -> None:
    """One stderr handler on the root logger, in the chosen format; idempotent.

    Called by every process at start. RQ adds its own handlers only when the hierarchy has
    none, so with this in place its lines come out in Loom's format too.
    """
    chosen = log_format or os.environ.get("LOOM_LOG_FORMAT", "auto").strip().lower() or "auto"
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _MARK, False):
            root.removeHandler(handler)
    handler = _LineHandler(sys.stderr)
    handler.setFormatter(make_formatter(chosen))
    setattr(handler, _MARK, True)
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("loom").setLevel(level)
    # No formatter here prints where a line was logged from, or which thread or process wrote
    # it: the logging HOWTO's "Optimization" switches spare every record the stack walk.
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    # werkzeug's own request lines repeat Loom's access line in another shape.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
