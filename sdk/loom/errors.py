"""Every exception the SDK raises, and the table that turns a Loom error answer into one.

Loom answers every failure as ``{"error": {"code", "message", ...details}}`` with an HTTP
status. ``error_from_answer`` picks the class for the ``code`` (the seed's error codes), falls
back to the class for the status when the code is new to this SDK, and to ``LoomAPIError``
after that, so ``except NotFound`` keeps working when the server grows a new 404 code.
Failures before an answer (refused connection, DNS, timeouts) are wrapped too, so a caller
never has to import ``requests`` to handle them.

This module is the SDKs' one error catalogue: every code of the server's table has its own
class here, and the TypeScript SDK's classes, ``BY_CODE`` and ``BY_STATUS``
(``sdk-ts/src/generated/errors.ts``) are generated from these by ``python -m app.sdk_ts``, whose
``--check`` fails when the two drift.

Hierarchy::

    LoomError                           status, code, message, details, response
    ├── LoomTransportError              no answer arrived (status None)
    │   ├── LoomConnectionError         CONNECTION_ERROR: refused, reset, DNS, TLS
    │   └── LoomTimeout                 TIMEOUT: no answer within the call's timeout
    └── LoomAPIError                    Loom answered with an error
        ├── BadRequest                  400
        │   ├── MalformedJson                MALFORMED_JSON
        │   └── UnsupportedContentType       UNSUPPORTED_CONTENT_TYPE
        ├── Unauthorized                401
        │   ├── AuthRequired                 AUTH_REQUIRED
        │   └── AuthInvalid                  AUTH_INVALID
        ├── Forbidden                   403
        │   ├── AuthInsufficient             AUTH_INSUFFICIENT
        │   └── FeatureDisabled              FEATURE_DISABLED
        ├── NotFound                    404  NOT_FOUND
        │   ├── UnknownOp                    UNKNOWN_OP
        │   ├── WorkingMemoryBlockNotFound   WORKING_MEMORY_BLOCK_NOT_FOUND
        │   ├── MemoryNotFound               MEMORY_NOT_FOUND
        │   ├── ProfileSectionNotFound       PROFILE_SECTION_NOT_FOUND
        │   ├── TokenNotFound                TOKEN_NOT_FOUND
        │   └── ErasureNotFound              ERASURE_NOT_FOUND
        ├── MethodNotAllowed            405  METHOD_NOT_ALLOWED
        ├── Conflict                    409
        │   ├── ModelCallsOff                MODEL_CALLS_OFF
        │   ├── HashMismatch                 HASH_MISMATCH
        │   ├── MemoryLocked                 MEMORY_LOCKED
        │   ├── MemoryPinned                 MEMORY_PINNED
        │   ├── MemoryTypeMismatch           MEMORY_TYPE_MISMATCH
        │   ├── MemoryNotDeleted             MEMORY_NOT_DELETED
        │   ├── WriteContended               WRITE_CONFLICT (retry later)
        │   ├── UserBeingErased              USER_BEING_ERASED
        │   ├── ErasureRunning               ERASURE_RUNNING (retry later)
        │   ├── IdempotencyInProgress        IDEMPOTENCY_IN_PROGRESS (retried)
        │   └── IdempotencyOutcomeUnknown    IDEMPOTENCY_OUTCOME_UNKNOWN
        ├── PreconditionFailed          412
        │   └── AgentStateConflict           agent_state_conflict
        ├── PayloadTooLarge             413
        │   └── BodyTooLarge                 BODY_TOO_LARGE
        ├── Unprocessable               422
        │   ├── ValidationError              VALIDATION_ERROR (.fields)
        │   ├── IdentityIncomplete           IDENTITY_INCOMPLETE
        │   ├── IdempotencyKeyReused         IDEMPOTENCY_KEY_REUSED
        │   ├── SchemaInvalid                SCHEMA_INVALID
        │   ├── SubstringNotFound            SUBSTRING_NOT_FOUND
        │   └── LimitExceeded                (.value_length, .char_limit)
        │       ├── WorkingMemoryLimitExceeded  WORKING_MEMORY_LIMIT_EXCEEDED
        │       └── CharLimitExceeded           CHAR_LIMIT_EXCEEDED
        ├── RateLimited                 429  RATE_LIMITED (.retry_after)
        │   └── ModelBudgetExceeded          MODEL_BUDGET_EXCEEDED (never retried)
        └── ServerError                 5xx  INTERNAL_ERROR; HTTP_<status> without Loom's shape
            ├── AnswerContractViolation 500  ANSWER_CONTRACT_VIOLATION
            ├── ModelCallFailed         502  MODEL_CALL_FAILED
            ├── ModelTimeout            504  MODEL_TIMEOUT
            └── StoreUnavailable        503  STORE_UNAVAILABLE (.retry_after; retry later)
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
    default_code = "HTTP_ERROR"


class BadRequest(LoomAPIError):
    default_code = "BAD_REQUEST"


class MalformedJson(BadRequest):
    """The body is not JSON."""

    default_code = "MALFORMED_JSON"


class UnsupportedContentType(BadRequest):
    """The body was not sent as ``application/json``."""

    default_code = "UNSUPPORTED_CONTENT_TYPE"


class Unauthorized(LoomAPIError):
    default_code = "AUTH_REQUIRED"


class AuthRequired(Unauthorized):
    default_code = "AUTH_REQUIRED"


class AuthInvalid(Unauthorized):
    default_code = "AUTH_INVALID"


class Forbidden(LoomAPIError):
    default_code = "FORBIDDEN"


class AuthInsufficient(Forbidden):
    default_code = "AUTH_INSUFFICIENT"


class FeatureDisabled(Forbidden):
    default_code = "FEATURE_DISABLED"


class NotFound(LoomAPIError):
    default_code = "NOT_FOUND"


class UnknownOp(NotFound):
    default_code = "UNKNOWN_OP"


class WorkingMemoryBlockNotFound(NotFound):
    default_code = "WORKING_MEMORY_BLOCK_NOT_FOUND"


class MemoryNotFound(NotFound):
    default_code = "MEMORY_NOT_FOUND"


class ProfileSectionNotFound(NotFound):
    default_code = "PROFILE_SECTION_NOT_FOUND"


class TokenNotFound(NotFound):
    default_code = "TOKEN_NOT_FOUND"


class ErasureNotFound(NotFound):
    default_code = "ERASURE_NOT_FOUND"


class MethodNotAllowed(LoomAPIError):
    default_code = "METHOD_NOT_ALLOWED"


class Conflict(LoomAPIError):
    default_code = "CONFLICT"


class ModelCallsOff(Conflict):
    """memory.ask cannot call a model: none configured, or the org switched calls off
    (``details["reason"]``: ``no_model`` or ``org_off``)."""

    default_code = "MODEL_CALLS_OFF"


class HashMismatch(Conflict):
    default_code = "HASH_MISMATCH"


class MemoryLocked(Conflict):
    default_code = "MEMORY_LOCKED"


class MemoryPinned(Conflict):
    default_code = "MEMORY_PINNED"


class MemoryTypeMismatch(Conflict):
    default_code = "MEMORY_TYPE_MISMATCH"


class MemoryNotDeleted(Conflict):
    """memory.restore of a row that is not deleted: there is nothing to bring back."""

    default_code = "MEMORY_NOT_DELETED"


class WriteContended(Conflict):
    """A compare-and-swap write kept losing to other writers until its deadline."""

    default_code = "WRITE_CONFLICT"


class UserBeingErased(Conflict):
    default_code = "USER_BEING_ERASED"


class ErasureRunning(Conflict):
    """Another process runs this user's erasure; ask again shortly."""

    default_code = "ERASURE_RUNNING"


class IdempotencyInProgress(Conflict):
    """The first call with this write's Idempotency-Key is still running; ask again shortly."""

    default_code = "IDEMPOTENCY_IN_PROGRESS"


class IdempotencyOutcomeUnknown(Conflict):
    """The first call with this Idempotency-Key ended without an answer (Loom's store went
    away mid-write): it may have been applied. Read the state before writing again."""

    default_code = "IDEMPOTENCY_OUTCOME_UNKNOWN"


class PreconditionFailed(LoomAPIError):
    default_code = "PRECONDITION_FAILED"


class AgentStateConflict(PreconditionFailed):
    default_code = "agent_state_conflict"


class PayloadTooLarge(LoomAPIError):
    default_code = "PAYLOAD_TOO_LARGE"


class BodyTooLarge(PayloadTooLarge):
    """The request body is over the server's size cap; nothing was read."""

    default_code = "BODY_TOO_LARGE"


class Unprocessable(LoomAPIError):
    default_code = "UNPROCESSABLE"


class ValidationError(Unprocessable):
    """422 naming each bad field: ``fields`` maps a field to its messages."""

    default_code = "VALIDATION_ERROR"

    @property
    def fields(self) -> dict[str, Any]:
        return dict(self.details.get("fields") or {})


class IdentityIncomplete(Unprocessable):
    default_code = "IDENTITY_INCOMPLETE"


class IdempotencyKeyReused(Unprocessable):
    """The Idempotency-Key was first sent with another body."""

    default_code = "IDEMPOTENCY_KEY_REUSED"


class SchemaInvalid(Unprocessable):
    default_code = "SCHEMA_INVALID"


class SubstringNotFound(Unprocessable):
    default_code = "SUBSTRING_NOT_FOUND"


class LimitExceeded(Unprocessable):
    """A write over a size cap; nothing was written. Trim to ``char_limit`` and retry."""

    default_code = "LIMIT_EXCEEDED"

    @property
    def value_length(self) -> int | None:
        return self.details.get("value_length")

    @property
    def char_limit(self) -> int | None:
        return self.details.get("char_limit")


class WorkingMemoryLimitExceeded(LimitExceeded):
    default_code = "WORKING_MEMORY_LIMIT_EXCEEDED"


class CharLimitExceeded(LimitExceeded):
    default_code = "CHAR_LIMIT_EXCEEDED"


def _retry_after(error: LoomAPIError) -> float | None:
    """Seconds to wait, from the error's ``retry_after`` or the Retry-After header."""
    value = error.details.get("retry_after")
    if value is None and error.response is not None:
        value = error.response.headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


class RateLimited(LoomAPIError):
    default_code = "RATE_LIMITED"

    @property
    def retry_after(self) -> float | None:
        return _retry_after(self)


class ModelBudgetExceeded(RateLimited):
    """memory.ask's model call would pass the namespace's or the org's model-call budget
    (``details["budget"]``); never retried by the SDK, since the rolling window frees room
    only as its entries age."""

    default_code = "MODEL_BUDGET_EXCEEDED"


class ServerError(LoomAPIError):
    default_code = "INTERNAL_ERROR"


class AnswerContractViolation(ServerError):
    """What the server was about to send does not match its own OpenAPI document (500)."""

    default_code = "ANSWER_CONTRACT_VIOLATION"


class ModelCallFailed(ServerError):
    """memory.ask's model server failed or gave no usable answer (502)."""

    default_code = "MODEL_CALL_FAILED"


class ModelTimeout(ServerError):
    """memory.ask's model server did not answer within LOOM_ASK_TIMEOUT_SECONDS (504)."""

    default_code = "MODEL_TIMEOUT"


class StoreUnavailable(ServerError):
    """Loom's Redis is down, hung or loading; the same call may succeed after ``retry_after``."""

    default_code = "STORE_UNAVAILABLE"

    @property
    def retry_after(self) -> float | None:
        return _retry_after(self)


BY_CODE: dict[str, type[LoomAPIError]] = {
    cls.default_code: cls
    for cls in (
        AuthRequired, AuthInvalid, AuthInsufficient, FeatureDisabled,
        NotFound, UnknownOp, WorkingMemoryBlockNotFound, MemoryNotFound,
        ProfileSectionNotFound, TokenNotFound, ErasureNotFound, MethodNotAllowed,
        HashMismatch, MemoryLocked, MemoryPinned, MemoryTypeMismatch, MemoryNotDeleted,
        WriteContended,
        UserBeingErased, ErasureRunning, AgentStateConflict, BodyTooLarge,
        ValidationError, IdentityIncomplete, SchemaInvalid, SubstringNotFound,
        WorkingMemoryLimitExceeded, CharLimitExceeded, RateLimited, ServerError,
        StoreUnavailable, IdempotencyInProgress, IdempotencyOutcomeUnknown,
        IdempotencyKeyReused, ModelCallsOff, ModelBudgetExceeded, ModelCallFailed,
        ModelTimeout, MalformedJson, UnsupportedContentType, AnswerContractViolation,
    )
}

BY_STATUS: dict[int, type[LoomAPIError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    412: PreconditionFailed,
    413: PayloadTooLarge,
    422: Unprocessable,
    429: RateLimited,
}


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
