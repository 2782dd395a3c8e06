"""Every exception the SDK raises, and the table that turns a Loom error answer into one.

Loom answers every failure as ``{"error": {"code", "message", ...details}}`` with an HTTP
status. ``error_from_answer`` picks the class for the ``code`` (the server's error catalogue),
falls back to the class for the status when the code is new to this SDK, and to
``LoomAPIError`` after that, so ``except NotFound`` keeps working when the server grows a new
404 code. Failures before an answer (refused connection, DNS, timeouts) are wrapped too, so a
caller never has to import ``requests`` to handle them.

The roots (``LoomError``, the transport errors, ``LoomAPIError``) are ``loom.error_base``;
every class below ``LoomAPIError``, its code, status, ``remedy`` and detail accessors, and
``BY_CODE`` and ``BY_STATUS`` are ``loom.error_classes``, generated from the server's catalogue
(``app/error_catalogue.py``) by ``python -m app.sdk_manifest``, whose ``--check`` fails when
they drift. Its docstring draws the hierarchy. All of them are importable from here.
"""

from __future__ import annotations

from typing import Any

from loom.error_base import Answer as Answer
from loom.error_base import LoomAPIError as LoomAPIError
from loom.error_base import LoomConnectionError as LoomConnectionError
from loom.error_base import LoomError as LoomError
from loom.error_base import LoomTimeout as LoomTimeout
from loom.error_base import LoomTransportError as LoomTransportError
from loom.error_classes import *  # noqa: F403  (every generated class, BY_CODE, BY_STATUS)
from loom.error_classes import BY_CODE, BY_STATUS, ServerError


def error_class(status: int, code: str | None) -> type[LoomAPIError]:
    """The class for an error answer: by code, else by status, else the root of answers."""
    if code and code in BY_CODE:
        return BY_CODE[code]
    if status in BY_STATUS:
        return BY_STATUS[status]
    if status >= 500:
        return ServerError
    return LoomAPIError


def error_from_answer(
    status: int, error: dict[str, Any] | None, response: Answer | None = None
) -> LoomAPIError:
    """Build the exception for an error answer (``error`` is the ``"error"`` object, if any)."""
    error = dict(error or {})
    code = error.pop("code", None)
    message = error.pop("message", None)
    code = str(code) if code is not None else None
    if message is None:
        reason = getattr(response, "reason", "") or ""
        message = f"HTTP {status} {reason}".strip()
    # An answer without Loom's error shape (a proxy's page) keeps its status as its code.
    return error_class(status, code)(
        str(message), status=status, code=code or f"HTTP_{status}", details=error,
        response=response,
    )
