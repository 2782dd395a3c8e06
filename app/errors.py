"""Loom's domain errors: a flat list of small classes, each with the seed's code.

Stores, schemas and jobs raise these; the HTTP layer turns every one of them into the single
error shape ``{"error": {"code", "message", ...details}}``. Nothing below knows about HTTP
beyond the status number it carries.
"""

from __future__ import annotations

from typing import Any

from app.error_catalogue import status_of


class LoomError(Exception):
    """Root of every error Loom answers with; ``details`` are extra keys of the error object.

    A subclass names its ``code``; its status (and everything else about the code) is the
    catalogue's (``app.error_catalogue``), and a code the catalogue lacks fails at import.
    ``field`` names the one input field at fault: it is sent as ``fields``, that field with the
    message, the shape ``VALIDATION_ERROR`` gives every field it names."""

    code = "LOOM_ERROR"
    status = 400

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.status = status_of(cls.code)

    def __init__(self, message: str, *, field: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        if field is not None:
            details = {"fields": {field: [message]}, **details}
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.details}


# --- request shape (400 / 404 / 413 / 422) ---------------------------------------------------


class MalformedJson(LoomError):
    code = "MALFORMED_JSON"


class UnsupportedContentType(LoomError):
    code = "UNSUPPORTED_CONTENT_TYPE"


class BodyTooLarge(LoomError):
    code = "BODY_TOO_LARGE"


class UnknownOp(LoomError):
    code = "UNKNOWN_OP"


class RouteNotFound(LoomError):
    code = "NOT_FOUND"


class HostNotAllowed(LoomError):
    code = "HOST_NOT_ALLOWED"


class MethodNotAllowed(LoomError):
    code = "METHOD_NOT_ALLOWED"


class ValidationFailed(LoomError):
    """422 naming each bad field: ``fields`` maps a field path to its messages."""

    code = "VALIDATION_ERROR"

    def __init__(self, fields: dict[str, Any], message: str | None = None) -> None:
        names = ", ".join(sorted(fields))
        super().__init__(message or f"invalid input: {names}", fields=fields)


class IdentityIncomplete(LoomError):
    code = "IDENTITY_INCOMPLETE"


class SchemaRuleViolation(LoomError):
    """A declared document (profile schema, object types, features) breaks a named rule."""

    code = "SCHEMA_INVALID"

    def __init__(self, rule: str, message: str, **details: Any) -> None:
        super().__init__(message, rule=rule, **details)
        self.rule = rule


# --- auth (401 / 403 / 429) -------------------------------------------------------------------


class AuthRequired(LoomError):
    code = "AUTH_REQUIRED"


class AuthInvalid(LoomError):
    code = "AUTH_INVALID"


class AuthInsufficient(LoomError):
    code = "AUTH_INSUFFICIENT"


class RateLimited(LoomError):
    code = "RATE_LIMITED"


class TokenNotFound(LoomError):
    code = "TOKEN_NOT_FOUND"


# --- Idempotency-Key (409 / 422) --------------------------------------------------------------


class IdempotencyKeyReused(LoomError):
    """The key was first sent with another body: a key names one request, never two."""

    code = "IDEMPOTENCY_KEY_REUSED"


class IdempotencyInProgress(LoomError):
    """The first call with this key is still running: ask again after Retry-After."""

    code = "IDEMPOTENCY_IN_PROGRESS"


class IdempotencyOutcomeUnknown(LoomError):
    """The first call with this key stopped without an answer (the store went away, or its
    process did, mid-write): it may or may not have been applied, so it is never run again."""

    code = "IDEMPOTENCY_OUTCOME_UNKNOWN"


# --- the store (503) -------------------------------------------------------------------------


class InternalError(LoomError):
    """Nothing expected this failure; its traceback is in the log, never in the answer."""

    code = "INTERNAL_ERROR"


class NotReady(LoomError):
    """``/readyz``: a part the server needs did not answer."""

    code = "NOT_READY"


class CrossSiteRefused(LoomError):
    """The queue dashboard answers only requests its own pages make."""

    code = "CROSS_SITE_REFUSED"


class StoreUnavailable(LoomError):
    """Redis is down, hung past the socket timeout, or still loading its data: ask again later."""

    code = "STORE_UNAVAILABLE"


# --- working memory (seed 004) ----------------------------------------------------------------


class WorkingMemoryLimitExceeded(LoomError):
    code = "WORKING_MEMORY_LIMIT_EXCEEDED"

    def __init__(self, value_length: int, char_limit: int) -> None:
        super().__init__(
            f"content of {value_length} characters is over the block's char_limit {char_limit}",
            value_length=value_length,
            char_limit=char_limit,
        )


class SubstringNotFound(LoomError):
    code = "SUBSTRING_NOT_FOUND"


class WorkingMemoryBlockNotFound(LoomError):
    code = "WORKING_MEMORY_BLOCK_NOT_FOUND"


# --- memory rows and profiles (seed 003) ------------------------------------------------------


class CharLimitExceeded(LoomError):
    code = "CHAR_LIMIT_EXCEEDED"

    def __init__(self, value_length: int, char_limit: int) -> None:
        super().__init__(
            f"value of {value_length} characters (canonical JSON) is over char_limit {char_limit}",
            value_length=value_length,
            char_limit=char_limit,
        )


class HashMismatch(LoomError):
    code = "HASH_MISMATCH"


class MemoryNotFound(LoomError):
    code = "MEMORY_NOT_FOUND"


class ProfileSectionNotFound(LoomError):
    code = "PROFILE_SECTION_NOT_FOUND"


class MemoryLocked(LoomError):
    code = "MEMORY_LOCKED"


class UserBeingErased(LoomError):
    code = "USER_BEING_ERASED"


# --- agent state (seed 002) -------------------------------------------------------------------


class AgentStateConflict(LoomError):
    code = "agent_state_conflict"


class FeatureDisabled(LoomError):
    code = "FEATURE_DISABLED"


# --- memory rows: more refusals ---------------------------------------------------------------


class MemoryPinned(LoomError):
    """A worker's write to a pinned (or ``high``) row: the row is left as it is."""

    code = "MEMORY_PINNED"


class MemoryTypeMismatch(LoomError):
    """A write through one plane (profile.*) to a key that holds a row of another type."""

    code = "MEMORY_TYPE_MISMATCH"

    @classmethod
    def of(cls, key: str, found: str, wanted: str) -> MemoryTypeMismatch:
        wanted_text = f", not {wanted!r}" if wanted else ""
        return cls(
            f"key {key!r} holds a {found!r} row{wanted_text}",
            key=key,
            memory_type=found,
        )


class MemoryNotDeleted(LoomError):
    """A restore of a row that is not deleted: there is nothing to bring back."""

    code = "MEMORY_NOT_DELETED"


class WriteContended(LoomError):
    """A compare-and-swap write kept losing to other writers until its deadline."""

    code = "WRITE_CONFLICT"


# --- erasure ----------------------------------------------------------------------------------


class ErasureRunning(LoomError):
    """Another process is running this user's erasure right now; ask again shortly."""

    code = "ERASURE_RUNNING"


class ErasureNotFound(LoomError):
    code = "ERASURE_NOT_FOUND"


# --- model calls in a request (memory.ask) ----------------------------------------------------


class ModelCallsOff(LoomError):
    """No model is configured (LOOM_LLM_BASE_URL, LOOM_LLM_MODEL), or the org switched model
    calls off (org.set_model_calls); ``reason`` says which."""

    code = "MODEL_CALLS_OFF"


class ModelBudgetExceeded(LoomError):
    """The call would pass the namespace's or the org's model-call budget (budget.set);
    ``budget`` says whose."""

    code = "MODEL_BUDGET_EXCEEDED"


class ModelCallError(LoomError):
    """The model server failed, refused the request, or gave no usable answer."""

    code = "MODEL_CALL_FAILED"


class ModelTimedOut(LoomError):
    """The model server did not answer within the request's model timeout."""

    code = "MODEL_TIMEOUT"
