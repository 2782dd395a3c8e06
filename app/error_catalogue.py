"""Loom's error catalogue: every error code Loom answers with, declared once.

Each ``ErrorSpec`` gives a code (the seed's, exactly), its HTTP status, what it means, the
detail fields its error object carries beside ``code`` and ``message`` (name, JSON type,
meaning), what a caller should do about it, and the class that stands for it in both SDKs.
Everything else is derived from this table:

- ``app.errors``: each ``LoomError`` subclass names its code; its status comes from here, and a
  class whose code is not here fails at import;
- the OpenAPI document (``app.api``): each op's error responses list the codes it can answer,
  from ``codes_for_op`` (what every op can meet, what every write can meet, and the op's own
  ``raises=`` in its ``@op`` declaration);
- the SDKs (``app.sdk_errors``): ``python -m app.sdk_manifest`` writes
  ``sdk/loom/error_classes.py`` (the Python SDK's classes, ``BY_CODE``, ``BY_STATUS``) and
  ``python -m app.sdk_ts`` writes ``sdk-ts/src/generated/errors.ts``; each has a ``--check``;
- the whole table in the OpenAPI document as ``x-error-catalogue`` (``as_json``);
- the reference: ``app.error_reference.markdown_table()``, printed by
  ``python -m app.error_reference --markdown`` (``--json``: ``as_json``).

This module imports nothing from the rest of ``app`` so that ``app.errors`` can read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, Protocol

JsonType = Literal["string", "integer", "number", "boolean", "object", "array"]


class Remedy(StrEnum):
    """What a caller should do on meeting a code."""

    FIX_INPUT = "fix_input"
    RETRY_AFTER = "retry_after"
    RETRY_WITH_BACKOFF = "retry_with_backoff"
    READ_THEN_RESEND = "read_then_resend"
    AUTHENTICATE = "authenticate"
    DO_NOT_RETRY = "do_not_retry"


REMEDY_TEXT = {
    Remedy.FIX_INPUT: "fix the request, then send it again",
    Remedy.RETRY_AFTER: "send the same request again after `Retry-After` seconds",
    Remedy.RETRY_WITH_BACKOFF: "send the same request again, waiting longer each time",
    Remedy.READ_THEN_RESEND: "read the current state, then send a write made from it",
    Remedy.AUTHENTICATE: "send a valid token (`Authorization: Bearer ...`)",
    Remedy.DO_NOT_RETRY: "do not send it again as it is; see the meaning",
}

# Where a code can come from: an op (``every_op``: any op; ``write``: any op that writes;
# ``op``: the ops whose ``@op`` names it in ``raises``), a route outside the ops (a probe,
# the queue dashboard, an unknown path), or only a worker's job (never an HTTP answer: the
# job's log and the SDK's class name it).
Reach = Literal["every_op", "write", "op", "outside_ops", "worker"]


@dataclass(frozen=True)
class Detail:
    """One key of an error object beside ``code`` and ``message``."""

    name: str
    type: JsonType
    meaning: str
    # A value for the OpenAPI document's examples; None: one made from the type.
    example: Any = None

    def example_value(self) -> Any:
        if self.example is not None:
            return self.example
        return {"string": "text", "integer": 1, "number": 1.5, "boolean": True,
                "object": {}, "array": []}[self.type]


@dataclass(frozen=True)
class ErrorSpec:
    code: str
    status: int
    meaning: str
    remedy: Remedy
    sdk_class: str | None
    reach: Reach = "op"
    details: tuple[Detail, ...] = ()
    # The SDK class this one extends, when not its status's family class (STATUS_FAMILIES).
    sdk_parent: str | None = None
    # What the caller should do, where the remedy alone does not say it.
    advice: str = ""

    @property
    def detail_names(self) -> frozenset[str]:
        return frozenset(detail.name for detail in self.details)


# --- details shared by several codes ------------------------------------------------------

FIELDS = Detail("fields", "object",
                "each input field at fault (a dotted path) with the list of its messages",
                {"key": ["Missing data for required field."]})
RETRY_AFTER = Detail("retry_after", "integer",
                     "seconds to wait before asking again (also the Retry-After header)")
KEY = Detail("key", "string", "the memory row's key (a profile section's label)")
MEMORY_ID = Detail("memory_id", "string", "the memory row's id")
IDEMPOTENCY_KEY = Detail("idempotency_key", "string", "the Idempotency-Key the request sent")
VALUE_LENGTH = Detail("value_length", "integer", "the length of what was sent")
CHAR_LIMIT = Detail("char_limit", "integer", "the cap it is over")


@dataclass(frozen=True)
class StatusFamily:
    """An SDK class that stands for a status: what an SDK raises for a code it does not know.
    ``code`` is its own code when the catalogue has an entry of that code and class."""

    sdk_class: str
    status: int
    code: str


STATUS_FAMILIES: tuple[StatusFamily, ...] = (
    StatusFamily("BadRequest", 400, "BAD_REQUEST"),
    StatusFamily("Unauthorized", 401, "AUTH_REQUIRED"),
    StatusFamily("Forbidden", 403, "FORBIDDEN"),
    StatusFamily("NotFound", 404, "NOT_FOUND"),
    StatusFamily("MethodNotAllowed", 405, "METHOD_NOT_ALLOWED"),
    StatusFamily("Conflict", 409, "CONFLICT"),
    StatusFamily("PreconditionFailed", 412, "PRECONDITION_FAILED"),
    StatusFamily("PayloadTooLarge", 413, "PAYLOAD_TOO_LARGE"),
    StatusFamily("MisdirectedRequest", 421, "MISDIRECTED_REQUEST"),
    StatusFamily("Unprocessable", 422, "UNPROCESSABLE"),
    StatusFamily("RateLimited", 429, "RATE_LIMITED"),
    StatusFamily("ServerError", 500, "INTERNAL_ERROR"),
)


@dataclass(frozen=True)
class SdkGroup:
    """An SDK class between a family and some of its codes, with the details they share."""

    sdk_class: str
    parent: str
    code: str
    meaning: str
    details: tuple[Detail, ...]


SDK_GROUPS: tuple[SdkGroup, ...] = (
    SdkGroup("LimitExceeded", "Unprocessable", "LIMIT_EXCEEDED",
             "A write over a size cap; nothing was written. Trim to `char_limit` and retry.",
             (VALUE_LENGTH, CHAR_LIMIT)),
)


CATALOGUE: tuple[ErrorSpec, ...] = (
    # --- the request itself (every op) -----------------------------------------------------
    ErrorSpec("MALFORMED_JSON", 400, "The body is not a JSON object (or ends before its length).",
              Remedy.FIX_INPUT, "MalformedJson", "every_op"),
    ErrorSpec("UNSUPPORTED_CONTENT_TYPE", 400, "A body was sent, not as `application/json`.",
              Remedy.FIX_INPUT, "UnsupportedContentType", "every_op",
              (Detail("content_type", "string", "the media type the request sent"),)),
    ErrorSpec("BODY_TOO_LARGE", 413, "The body is over `LOOM_MAX_BODY_BYTES`; nothing was read.",
              Remedy.FIX_INPUT, "BodyTooLarge", "every_op",
              (Detail("max_bytes", "integer", "the largest body this server reads"),)),
    ErrorSpec("VALIDATION_ERROR", 422, "The input breaks the op's schema; `fields` names each "
              "field at fault.", Remedy.FIX_INPUT, "ValidationError", "every_op", (FIELDS,)),
    ErrorSpec("IDENTITY_INCOMPLETE", 422, "An identity field the op needs (namespace, agent, "
              "user_id, session_id) is missing and no token fills it.", Remedy.FIX_INPUT,
              "IdentityIncomplete", "every_op", (FIELDS,)),
    ErrorSpec("METHOD_NOT_ALLOWED", 405, "The path does not take this HTTP method (the `Allow` "
              "header names the ones it does).", Remedy.FIX_INPUT, "MethodNotAllowed", "every_op",
              (Detail("method", "string", "the method sent"),)),
    ErrorSpec("HOST_NOT_ALLOWED", 421, "This server does not answer the request's Host name.",
              Remedy.DO_NOT_RETRY, "HostNotAllowed", "every_op", (FIELDS,),
              advice="call the server by a name it answers, or add the name to "
                     "`LOOM_ALLOWED_HOSTS`"),
    # --- auth and budgets (every op) --------------------------------------------------------
    ErrorSpec("AUTH_REQUIRED", 401, "Auth is on and the request sent no token.",
              Remedy.AUTHENTICATE, "AuthRequired", "every_op"),
    ErrorSpec("AUTH_INVALID", 401, "The token is unknown, revoked or expired.",
              Remedy.AUTHENTICATE, "AuthInvalid", "every_op"),
    ErrorSpec("AUTH_INSUFFICIENT", 403, "The token's role or scopes are too low for the op, or "
              "the body names an identity outside the token's reach.", Remedy.DO_NOT_RETRY,
              "AuthInsufficient", "every_op",
              (FIELDS,
               Detail("required_role", "string", "the role the op needs"),
               Detail("required_scope", "string", "the scope the op needs")),
              advice="use a token that reaches it, or leave out the identity it does not"),
    ErrorSpec("RATE_LIMITED", 429, "The token's request budget is spent, or the address sent "
              "too many refused tokens.", Remedy.RETRY_AFTER, "RateLimited", "every_op",
              (RETRY_AFTER,)),
    # --- the server (every op) --------------------------------------------------------------
    ErrorSpec("STORE_UNAVAILABLE", 503, "Redis is down, hung past its socket timeout, or still "
              "loading its data; nothing was written.", Remedy.RETRY_AFTER, "StoreUnavailable",
              "every_op", (RETRY_AFTER,), sdk_parent="ServerError"),
    ErrorSpec("INTERNAL_ERROR", 500, "An error nothing expected; it has been logged.",
              Remedy.RETRY_WITH_BACKOFF, "ServerError", "every_op",
              advice="a write may or may not have been applied: read before writing again"),
    ErrorSpec("ANSWER_CONTRACT_VIOLATION", 500, "What the server was about to send does not "
              "match its own OpenAPI document (with `LOOM_VALIDATE_ANSWERS` on).",
              Remedy.DO_NOT_RETRY, "AnswerContractViolation", "every_op",
              advice="report it: the server's answer and its document disagree"),
    # --- Idempotency-Key (every write) ------------------------------------------------------
    ErrorSpec("IDEMPOTENCY_KEY_REUSED", 422, "The Idempotency-Key was first sent with another "
              "body: a key names one request, never two.", Remedy.FIX_INPUT,
              "IdempotencyKeyReused", "write", (IDEMPOTENCY_KEY,),
              advice="send a new key for a new request"),
    ErrorSpec("IDEMPOTENCY_IN_PROGRESS", 409, "The first call with this Idempotency-Key is "
              "still running.", Remedy.RETRY_AFTER, "IdempotencyInProgress", "write",
              (IDEMPOTENCY_KEY, RETRY_AFTER)),
    ErrorSpec("IDEMPOTENCY_OUTCOME_UNKNOWN", 409, "The first call with this Idempotency-Key "
              "stopped without an answer (the store or its process went away mid-write): it may "
              "or may not have been applied, so it is never run again.",
              Remedy.READ_THEN_RESEND, "IdempotencyOutcomeUnknown", "write", (IDEMPOTENCY_KEY,),
              advice="read the state, then write again with a new key if it is not there"),
    # --- schemas and documents -------------------------------------------------------------
    ErrorSpec("SCHEMA_INVALID", 422, "A declared document (profile schema, object types, "
              "features) breaks a named rule.", Remedy.FIX_INPUT, "SchemaInvalid", "op",
              (Detail("rule", "string", "the rule broken"), FIELDS)),
    ErrorSpec("FEATURE_DISABLED", 403, "The namespace's features document has this feature off.",
              Remedy.DO_NOT_RETRY, "FeatureDisabled", "op",
              (Detail("feature", "string", "the feature that is off"),),
              advice="an admin turns it on (features.set)"),
    # --- working memory (seed 004) ---------------------------------------------------------
    ErrorSpec("WORKING_MEMORY_LIMIT_EXCEEDED", 422, "The block's content would be longer than "
              "its `char_limit`; nothing was written.", Remedy.FIX_INPUT,
              "WorkingMemoryLimitExceeded", "op", (VALUE_LENGTH, CHAR_LIMIT),
              sdk_parent="LimitExceeded"),
    ErrorSpec("SUBSTRING_NOT_FOUND", 422, "The text to replace is not in the block or section.",
              Remedy.READ_THEN_RESEND, "SubstringNotFound", "op",
              (Detail("block_key", "string", "the working-memory block"),
               Detail("label", "string", "the profile section"))),
    ErrorSpec("WORKING_MEMORY_BLOCK_NOT_FOUND", 404, "No block of that key in the scope.",
              Remedy.FIX_INPUT, "WorkingMemoryBlockNotFound", "op",
              (Detail("block_key", "string", "the block asked for"),)),
    # --- memory rows and profiles (seed 003) -----------------------------------------------
    ErrorSpec("CHAR_LIMIT_EXCEEDED", 422, "The value's canonical JSON is longer than the row's "
              "`char_limit`; nothing was written.", Remedy.FIX_INPUT, "CharLimitExceeded", "op",
              (VALUE_LENGTH, CHAR_LIMIT), sdk_parent="LimitExceeded"),
    ErrorSpec("HASH_MISMATCH", 409, "The row's content hash is not the `if_content_sha256` "
              "given: it changed since it was read.", Remedy.READ_THEN_RESEND, "HashMismatch",
              "op", (KEY, Detail("content_sha256", "string", "the row's current content hash"))),
    ErrorSpec("MEMORY_NOT_FOUND", 404, "No memory row (or no such version of it) here.",
              Remedy.FIX_INPUT, "MemoryNotFound", "op",
              (KEY, MEMORY_ID, Detail("version_text", "string", "the version asked for"))),
    ErrorSpec("PROFILE_SECTION_NOT_FOUND", 404, "No profile section of that label.",
              Remedy.FIX_INPUT, "ProfileSectionNotFound", "op",
              (Detail("label", "string", "the section asked for"),)),
    ErrorSpec("MEMORY_LOCKED", 409, "The row is locked: only memory.unlock writes to it.",
              Remedy.DO_NOT_RETRY, "MemoryLocked", "op", (KEY, MEMORY_ID),
              advice="unlock it first (memory.unlock), or leave it"),
    ErrorSpec("MEMORY_PINNED", 409, "A worker's write to a pinned (or `high`) row: the row is "
              "left as it is.", Remedy.DO_NOT_RETRY, "MemoryPinned", "worker", (KEY, MEMORY_ID)),
    ErrorSpec("MEMORY_TYPE_MISMATCH", 409, "The key holds a row of another memory type than the "
              "op writes.", Remedy.FIX_INPUT, "MemoryTypeMismatch", "op",
              (KEY, Detail("memory_type", "string", "the type of the row the key holds"))),
    ErrorSpec("MEMORY_NOT_DELETED", 409, "A restore of a row that is not deleted: there is "
              "nothing to bring back.", Remedy.DO_NOT_RETRY, "MemoryNotDeleted", "op",
              (KEY, MEMORY_ID)),
    ErrorSpec("WRITE_CONFLICT", 409, "A compare-and-swap write kept losing to other writers "
              "until its deadline; nothing was written.", Remedy.RETRY_AFTER, "WriteContended",
              "op", (RETRY_AFTER,)),
    ErrorSpec("USER_BEING_ERASED", 409, "The user is being erased; writes are refused until "
              "the erasure is done.", Remedy.DO_NOT_RETRY, "UserBeingErased", "op",
              (Detail("user_id", "string", "the user being erased"),)),
    # --- agent state (seed 002) ------------------------------------------------------------
    ErrorSpec("agent_state_conflict", 412, "The stored state's version is not `if_version`; "
              "nothing changed.", Remedy.READ_THEN_RESEND, "AgentStateConflict", "op",
              (Detail("if_version", "integer", "the version the write expected"),
               Detail("if_version_text", "string", "`if_version` as a decimal string"),
               Detail("version", "integer", "the stored version"),
               Detail("version_text", "string", "`version` as a decimal string"))),
    # --- tokens and erasure ----------------------------------------------------------------
    ErrorSpec("TOKEN_NOT_FOUND", 404, "No token of that id in the org.", Remedy.FIX_INPUT,
              "TokenNotFound", "op", (Detail("token_id", "string", "the token asked for"),)),
    ErrorSpec("ERASURE_RUNNING", 409, "Another process is running this user's erasure right "
              "now.", Remedy.RETRY_AFTER, "ErasureRunning", "op",
              (Detail("erasure_id", "string", "the erasure running"), RETRY_AFTER)),
    ErrorSpec("ERASURE_NOT_FOUND", 404, "No erasure of that id.", Remedy.FIX_INPUT,
              "ErasureNotFound", "op",
              (Detail("erasure_id", "string", "the erasure asked for"),)),
    # --- model calls in a request (memory.ask) ---------------------------------------------
    ErrorSpec("MODEL_CALLS_OFF", 409, "No model is configured, or the org switched model calls "
              "off; `reason` says which.", Remedy.DO_NOT_RETRY, "ModelCallsOff", "op",
              (Detail("reason", "string", "`no_model` or `org_off`"),),
              advice="configure a model (LOOM_LLM_*), or an admin turns calls on "
                     "(org.set_model_calls)"),
    ErrorSpec("MODEL_BUDGET_EXCEEDED", 429, "The call would pass the namespace's or the org's "
              "model-call budget (budget.set).", Remedy.DO_NOT_RETRY, "ModelBudgetExceeded", "op",
              (Detail("budget", "string", "whose budget: `namespace` or `org`"),),
              advice="the rolling window frees room only as its entries age; raise the budget "
                     "or wait"),
    ErrorSpec("MODEL_CALL_FAILED", 502, "The model server failed, refused the request, or gave "
              "no usable answer.", Remedy.RETRY_WITH_BACKOFF, "ModelCallFailed", "op",
              (Detail("model_status", "integer", "the model server's HTTP status"),),
              sdk_parent="ServerError"),
    ErrorSpec("MODEL_TIMEOUT", 504, "The model server did not answer within "
              "`LOOM_ASK_TIMEOUT_SECONDS`.", Remedy.RETRY_WITH_BACKOFF, "ModelTimeout", "op",
              (Detail("timeout_seconds", "number", "the timeout that passed"),),
              sdk_parent="ServerError"),
    # --- routes outside the ops ------------------------------------------------------------
    ErrorSpec("UNKNOWN_OP", 404, "No op of that name under `/v1/`.", Remedy.FIX_INPUT,
              "UnknownOp", "outside_ops", (Detail("op", "string", "the name asked for"),)),
    ErrorSpec("NOT_FOUND", 404, "No route of that path.", Remedy.FIX_INPUT, "NotFound",
              "outside_ops"),
    ErrorSpec("NOT_READY", 503, "`/readyz`: a part the server needs did not answer.",
              Remedy.RETRY_AFTER, "NotReady", "outside_ops",
              (Detail("failing", "array", "the parts that did not answer"),
               Detail("checks", "object", "each part with what it answered"), RETRY_AFTER)),
    ErrorSpec("CROSS_SITE_REFUSED", 403, "The queue dashboard answers only its own pages.",
              Remedy.DO_NOT_RETRY, "CrossSiteRefused", "outside_ops", (FIELDS,)),
)

BY_CODE: dict[str, ErrorSpec] = {spec.code: spec for spec in CATALOGUE}


def spec(code: str) -> ErrorSpec:
    """The entry of ``code``; a KeyError names a code the catalogue does not declare."""
    try:
        return BY_CODE[code]
    except KeyError:
        raise KeyError(f"error code {code!r} is not in app/error_catalogue.py") from None


def status_of(code: str) -> int:
    return spec(code).status


class DeclaresErrors(Protocol):
    """What the catalogue reads of an op (``app.registry.Op``): named by shape, so that the
    catalogue, below every layer, imports nothing of the registry's."""

    @property
    def kind(self) -> str: ...

    @property
    def raises(self) -> tuple[str, ...]: ...


def codes_for_op(declared: DeclaresErrors) -> list[ErrorSpec]:
    """The codes an op can answer: every op's, every write's when it writes, and its own."""
    own = set(declared.raises)  # each a catalogue code: the registry refuses any other
    return [entry for entry in CATALOGUE
            if entry.reach == "every_op"
            or (entry.reach == "write" and declared.kind != "read")
            or entry.code in own]


def as_json() -> list[dict[str, Any]]:
    """The catalogue as plain JSON: the OpenAPI document's ``x-error-catalogue``."""
    return [{"code": entry.code, "status": entry.status, "meaning": entry.meaning,
             "remedy": entry.remedy.value, "advice": entry.advice or REMEDY_TEXT[entry.remedy],
             "reach": entry.reach,
             "details": {detail.name: {"type": detail.type, "description": detail.meaning}
                         for detail in entry.details}}
            for entry in CATALOGUE]


def example_error(entry: ErrorSpec) -> dict[str, Any]:
    """An error object of ``entry`` as the wire carries it, for the OpenAPI examples."""
    return {"code": entry.code, "message": entry.meaning,
            **{detail.name: detail.example_value() for detail in entry.details}}
