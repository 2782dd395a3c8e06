"""Loom's domain errors: a flat list of small classes, each with the seed's code and status.

Stores, schemas and jobs raise these; the HTTP layer turns every one of them into the single
error shape ``{"error": {"code", "message", ...details}}``. Nothing below knows about HTTP
beyond the status number it carries.
"""

from __future__ import annotations

from typing import Any


class LoomError(Exception):
    """Root of every error Loom answers with; ``details`` are extra keys of the error object."""

    code = "LOOM_ERROR"
    status = 400

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.details}


# --- request shape (400 / 404 / 413 / 422) ---------------------------------------------------


class MalformedJson(LoomError):
    code = "MALFORMED_JSON"
    status = 400


class UnsupportedContentType(LoomError):
    code = "UNSUPPORTED_CONTENT_TYPE"
    status = 400


class BodyTooLarge(LoomError):
    code = "BODY_TOO_LARGE"
    status = 413


class UnknownOp(LoomError):
    code = "UNKNOWN_OP"
    status = 404


class RouteNotFound(LoomError):
    code = "NOT_FOUND"
    status = 404


class MethodNotAllowed(LoomError):
    code = "METHOD_NOT_ALLOWED"
    status = 405


class ValidationFailed(LoomError):
    """422 naming each bad field: ``fields`` maps a field path to its messages."""

    code = "VALIDATION_ERROR"
    status = 422

    def __init__(self, fields: dict[str, Any], message: str | None = None) -> None:
        names = ", ".join(sorted(fields))
        super().__init__(message or f"invalid input: {names}", fields=fields)


class IdentityIncomplete(LoomError):
    code = "IDENTITY_INCOMPLETE"
    status = 422


class SchemaRuleViolation(LoomError):
    """A declared document (profile schema, object types, features) breaks a named rule."""

    code = "SCHEMA_INVALID"
    status = 422

    def __init__(self, rule: str, message: str, **details: Any) -> None:
        super().__init__(message, rule=rule, **details)
        self.rule = rule


# --- auth (401 / 403 / 429) -------------------------------------------------------------------


class AuthRequired(LoomError):
    code = "AUTH_REQUIRED"
    status = 401


class AuthInvalid(LoomError):
    code = "AUTH_INVALID"
    status = 401


class AuthInsufficient(LoomError):
    code = "AUTH_INSUFFICIENT"
    status = 403


class RateLimited(LoomError):
    code = "RATE_LIMITED"
    status = 429


class TokenNotFound(LoomError):
    code = "TOKEN_NOT_FOUND"
    status = 404


# --- Idempotency-Key (409 / 422) --------------------------------------------------------------


class IdempotencyKeyReused(LoomError):
    """The key was first sent with another body: a key names one request, never two."""

    code = "IDEMPOTENCY_KEY_REUSED"
    status = 422


class IdempotencyInProgress(LoomError):
    """The first call with this key is still running: ask again after Retry-After."""

    code = "IDEMPOTENCY_IN_PROGRESS"
    status = 409


class IdempotencyOutcomeUnknown(LoomError):
    """The first call with this key stopped without an answer (the store went away, or its
    process did, mid-write): it may or may not have been applied, so it is never run again."""

    code = "IDEMPOTENCY_OUTCOME_UNKNOWN"
    status = 409


# --- the store (503) -------------------------------------------------------------------------


class StoreUnavailable(LoomError):
    """Redis is down, hung past the socket timeout, or still loading its data: ask again later."""

    code = "STORE_UNAVAILABLE"
    status = 503


# --- working memory (seed 004) ----------------------------------------------------------------


class WorkingMemoryLimitExceeded(LoomError):
    code = "WORKING_MEMORY_LIMIT_EXCEEDED"
    status = 422

    def __init__(self, value_length: int, char_limit: int) -> None:
        super().__init__(
            f"content of {value_length} characters is over the block's char_limit {char_limit}",
            value_length=value_length,
            char_limit=char_limit,
        )


class SubstringNotFound(LoomError):
    code = "SUBSTRING_NOT_FOUND"
    status = 422


class WorkingMemoryBlockNotFound(LoomError):
    code = "WORKING_MEMORY_BLOCK_NOT_FOUND"
    status = 404


# --- memory rows and profiles (seed 003) ------------------------------------------------------


class CharLimitExceeded(LoomError):
    code = "CHAR_LIMIT_EXCEEDED"
    status = 422

    def __init__(self, value_length: int, char_limit: int) -> None:
        super().__init__(
            f"value of {value_length} characters (canonical JSON) is over char_limit {char_limit}",
            value_length=value_length,
            char_limit=char_limit,
        )


class HashMismatch(LoomError):
    code = "HASH_MISMATCH"
    status = 409


class MemoryNotFound(LoomError):
    code = "MEMORY_NOT_FOUND"
    status = 404


class ProfileSectionNotFound(LoomError):
    code = "PROFILE_SECTION_NOT_FOUND"
    status = 404


class MemoryLocked(LoomError):
    code = "MEMORY_LOCKED"
    status = 409


class UserBeingErased(LoomError):
    code = "USER_BEING_ERASED"
    status = 409


# --- agent state (seed 002) -------------------------------------------------------------------


class AgentStateConflict(LoomError):
    code = "agent_state_conflict"
    status = 412


class FeatureDisabled(LoomError):
    code = "FEATURE_DISABLED"
    status = 403


# --- memory rows: more refusals ---------------------------------------------------------------


class MemoryPinned(LoomError):
    """A worker's write to a pinned (or ``high``) row: the row is left as it is."""

    code = "MEMORY_PINNED"
    status = 409


class MemoryTypeMismatch(LoomError):
    """A write through one plane (profile.*) to a key that holds a row of another type."""

    code = "MEMORY_TYPE_MISMATCH"
    status = 409

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
    status = 409


class WriteContended(LoomError):
    """A compare-and-swap write kept losing to other writers until its deadline."""

    code = "WRITE_CONFLICT"
    status = 409


# --- erasure ----------------------------------------------------------------------------------


class ErasureRunning(LoomError):
    """Another process is running this user's erasure right now; ask again shortly."""

    code = "ERASURE_RUNNING"
    status = 409


class ErasureNotFound(LoomError):
    code = "ERASURE_NOT_FOUND"
    status = 404


# --- model calls in a request (memory.ask) ----------------------------------------------------


class ModelCallsOff(LoomError):
    """No model is configured (LOOM_LLM_BASE_URL, LOOM_LLM_MODEL), or the org switched model
    calls off (org.set_model_calls); ``reason`` says which."""

    code = "MODEL_CALLS_OFF"
    status = 409


class ModelBudgetExceeded(LoomError):
    """The call would pass the namespace's or the org's model-call budget (budget.set);
    ``budget`` says whose."""

    code = "MODEL_BUDGET_EXCEEDED"
    status = 429


class ModelCallError(LoomError):
    """The model server failed, refused the request, or gave no usable answer."""

    code = "MODEL_CALL_FAILED"
    status = 502


class ModelTimedOut(LoomError):
    """The model server did not answer within the request's model timeout."""

    code = "MODEL_TIMEOUT"
    status = 504
