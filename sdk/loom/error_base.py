"""The roots of the SDK's errors, which carry behaviour: the constructor, the transport's flag
and ``retry_after``. Every class below ``LoomAPIError`` (one per status, one per code) is
generated into ``loom.error_classes`` from the server's error catalogue; the TypeScript SDK's
``src/error_base.ts`` holds the same roots (``python -m app.sdk_ts --check`` compares them).

    LoomError                      status, code, message, details, response
    ├── LoomTransportError         no answer arrived (status None)
    │   ├── LoomConnectionError    CONNECTION_ERROR: refused, reset, DNS, TLS
    │   └── LoomTimeout            TIMEOUT: no answer within the call's timeout
    └── LoomAPIError               Loom answered with an error (.retry_after, .remedy)
"""

from __future__ import annotations

from typing import Any, Protocol


class Answer(Protocol):
    """What ``response`` is: a ``requests.Response`` (sync) or an ``httpx.Response`` (async)."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Any: ...


class LoomError(Exception):
    """Root of every SDK exception.

    ``status`` is the HTTP status (None when no answer arrived), ``code`` Loom's error code,
    ``details`` the error object's other keys, ``response`` the HTTP response if any
    (``requests.Response`` in the sync form, ``httpx.Response`` in the async one).
    """

    default_code = "LOOM_ERROR"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        details: dict[str, Any] | None = None,
        response: Answer | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code or self.default_code
        self.details: dict[str, Any] = dict(details or {})
        self.response = response

    def __str__(self) -> str:
        where = f" (HTTP {self.status})" if self.status is not None else ""
        return f"{self.code}{where}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        """The error in Loom's wire shape, with ``status`` added."""
        return {"code": self.code, "message": self.message, "status": self.status, **self.details}


# --- no answer --------------------------------------------------------------------------------


class LoomTransportError(LoomError):
    """No answer arrived. ``may_have_reached_server`` is False only when the request never
    left this machine (the connection could not be opened): only then is a write safe to
    send again."""

    default_code = "TRANSPORT_ERROR"

    def __init__(self, message: str, *, may_have_reached_server: bool = True,
                 **options: Any) -> None:
        super().__init__(message, **options)
        self.may_have_reached_server = may_have_reached_server


class LoomConnectionError(LoomTransportError):
    default_code = "CONNECTION_ERROR"


class LoomTimeout(LoomTransportError):
    default_code = "TIMEOUT"


# --- answers ----------------------------------------------------------------------------------


class LoomAPIError(LoomError):
    """Loom answered with an error. ``remedy`` is what the catalogue says a caller should do
    about the code (``fix_input``, ``retry_after``, ``retry_with_backoff``,
    ``read_then_resend``, ``authenticate``, ``do_not_retry``), None for a class that stands
    for a whole status."""

    default_code = "HTTP_ERROR"
    default_status: int | None = None
    remedy: str | None = None

    @property
    def retry_after(self) -> float | None:
        """Seconds to wait, from the error's ``retry_after`` or the Retry-After header."""
        value = self.details.get("retry_after")
        if value is None and self.response is not None:
            value = self.response.headers.get("Retry-After")
        try:
            return float(value) if value is not None else None
        except (TypeError, ValueError):
            return None
