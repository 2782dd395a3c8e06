"""The memory.* ops: durable rows (facts and profile sections), their versions and flags.

No seed lists these fields; DESIGN.md ("The memory rows the profiles are built from") names the
row's fields and the ops, and docs/decisions.md records each choice made here. A row is named by
the caller's (agent, user_id, session_id) and its ``key``, or by its ``memory_id`` from any
identity in the namespace that can see it (a write: that may write it, the reach a key gives).
Reads honour the token's read scope; a row outside it reads as not found, so its existence
does not leak.

Roles: set, delete, lock, unlock, pin, unpin and the revisions (revert, restore, restate,
reinforce, recall, backfill) are writer ops; delete_version and redact rewrite history and are
admin ops. The MCP ``all`` toolset lists set, get, list and history.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from app.attributes import with_attribute_tags
from app.auth import (
    READ_SCOPE_RANK,
    READ_SCOPES,
    effective_read_scope,
    row_visible,
    row_writable,
)
from app.clock import iso_from_ns
from app.errors import AuthInsufficient, MemoryNotFound, ValidationFailed
from app.registry import Call, op
from app.schemas.common import (
    Answer,
    IdentityArgs,
    Moment,
    PlainText,
    StrictBool,
    StrictFloat,
    StrictInt,
    VersionText,
    no_control_characters,
)
from app.schemas.rules import after, length_within
from app.store import keys
from app.store.activity import ActivityStore
from app.store.idempotency import kept_reply
from app.store.memory import (
    DEFAULT_PROFILE_CHAR_LIMIT,
    DELETE_VERSION_TRACE,
    MAX_CHAR_LIMIT,
    PROFILE_TYPE,
    Content,
    Location,
    MemoryRow,
    MemoryStore,
    Written,
    redact_row,
)
from app.store.memory_row import Redacted

KEY_MAX = 512
TAGS_MAX = 64
TAG_MAX = 128
TRACE_MAX = 4096
PAGE_MAX = 100
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Unpadded base64url, as _encode_cursor writes it: whole quads, then 2 or 3 characters or none.
CURSOR_PATTERN = r"^(?:[A-Za-z0-9_-]{4})*(?:[A-Za-z0-9_-]{2,3})?$"
_WHO = {"namespace": "support", "agent": "triage-bot", "user_id": "u-42"}


# --------------------------------------------------------------------------------------------
# Fields


def _not_a_delete_version_trace(value: str) -> None:
    if value.startswith(DELETE_VERSION_TRACE):
        raise ValidationError(
            f"a trace starting {DELETE_VERSION_TRACE!r} is memory.delete_version's marker"
        )


class KeyText(PlainText):
    """A row key or a profile label: 1 to 512 characters, no control characters."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            validate=[validate.Length(min=1, max=KEY_MAX), no_control_characters], **kwargs
        )


def memory_type_field(**kwargs: Any) -> fields.String:
    return fields.String(
        validate=validate.Regexp(
            r"^[a-z][a-z0-9_]{0,39}$", error="must be a lower-case name such as semantic"
        ),
        **kwargs,
    )


def source_trace_field() -> fields.String:
    return fields.String(
        load_default="",
        validate=[validate.Length(max=TRACE_MAX), _not_a_delete_version_trace],
        metadata={
            "description": "Where the content came from; a trace starting "
            "memory.delete_version: is refused (that op's marker)."
        },
    )


def read_scope_field() -> fields.String:
    return fields.String(
        load_default=None,
        validate=validate.OneOf(READ_SCOPES),
        metadata={
            "description": "How far the read reaches across users and session_ids; left out, "
            "the token's ceiling."
        },
    )


def to_ns(moment: datetime) -> int:
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def _moment(description: str) -> Moment:
    # Stored as nanoseconds since 1970 (to_ns): an earlier instant has no place there.
    return Moment(from_epoch=True, load_default=None, metadata={"description": description})


# --------------------------------------------------------------------------------------------
# Schemas


class MemorySetArgs(IdentityArgs):
    # _window below, and the cap on the value (char_limit, else the row's, at most
    # MAX_CHAR_LIMIT), as the OpenAPI document states them (app.schemas.rules).
    OPENAPI_RULES: ClassVar[dict[str, Any]] = {"x-loom-rules": [
        after("valid_to", "valid_at"),
        length_within("value", "char_limit", MAX_CHAR_LIMIT, "json")]}

    key = KeyText(required=True, metadata={"description": "The row's name in this identity."})
    value = fields.Raw(
        required=True,
        allow_none=False,
        metadata={"description": "Any JSON value; its canonical JSON is what char_limit caps."},
    )
    memory_type = memory_type_field(
        load_default="semantic",
        metadata={"description": "semantic, preference, decision, episodic, profile, ..."},
    )
    confidence = StrictFloat(load_default=1.0, validate=validate.Range(min=0, max=1))
    tags = fields.List(
        fields.String(validate=[validate.Length(min=1, max=TAG_MAX), no_control_characters]),
        load_default=list,
        validate=validate.Length(max=TAGS_MAX),
        metadata={"description": "about:other, attribute:<name>, forget, or free tags."},
    )
    label = fields.String(
        load_default="normal",
        validate=validate.OneOf(["normal", "high"]),
        metadata={"description": "Sensitivity: high keeps the row out of every profile."},
    )
    valid_at = _moment("When the fact became true; dates it for profile builds.")
    valid_to = _moment("When the fact stops being true.")
    duplicate_of = fields.String(
        load_default="", validate=[validate.Length(max=64), no_control_characters]
    )
    provenance = fields.String(
        load_default="stated", validate=validate.OneOf(["stated", "derived"])
    )
    source_trace = source_trace_field()
    char_limit = StrictInt(
        load_default=None,
        validate=validate.Range(min=1, max=MAX_CHAR_LIMIT),
        metadata={
            "description": "Size cap on the value's canonical JSON; left out, the row keeps "
            "its cap (8192 for a new profile row, none otherwise)."
        },
    )
    if_match_sha256 = fields.String(
        load_default="",
        validate=validate.Length(max=64),
        metadata={"description": "Write only over this content_sha256 (409 otherwise)."},
    )

    @validates_schema
    def _window(self, data: dict[str, Any], **kwargs: Any) -> None:
        start, end = data.get("valid_at"), data.get("valid_to")
        if start is not None and end is not None and end <= start:
            raise ValidationError("must be after valid_at", field_name="valid_to")


class MemoryTargetArgs(IdentityArgs):
    """A row named by key (in the caller's identity) or by memory_id, not both."""

    # _one_name below, as the OpenAPI document states it.
    OPENAPI_RULES: ClassVar[dict[str, Any]] = {"oneOf": [
        {"required": ["key"], "properties": {"key": {"type": "string"},
                                             "memory_id": {"enum": [None]}}},
        {"required": ["memory_id"], "properties": {"memory_id": {"type": "string"},
                                                   "key": {"enum": [None]}}},
    ]}

    key = KeyText(load_default=None, metadata={"description": "The row's key."})
    memory_id = fields.String(
        load_default=None,
        validate=[validate.Length(min=1, max=64), no_control_characters],
        metadata={"description": "The row's id, from any identity that can see it."},
    )
    memory_type = memory_type_field(
        load_default=None,
        metadata={"description": "Only a row of this type (profile for a section)."},
    )

    @validates_schema
    def _one_name(self, data: dict[str, Any], **kwargs: Any) -> None:
        if (data.get("key") is None) == (data.get("memory_id") is None):
            raise ValidationError("give key or memory_id (one of them)", field_name="key")


class MemoryGetArgs(MemoryTargetArgs):
    read_scope = read_scope_field()


class MemoryHistoryArgs(MemoryTargetArgs):
    read_scope = read_scope_field()
    limit = StrictInt(load_default=20, validate=validate.Range(min=1, max=PAGE_MAX))
    cursor = fields.String(
        load_default=None,
        validate=validate.Regexp(r"^[0-9]{1,20}$"),
        metadata={"description": "next_cursor of the previous page."},
    )


class MemoryDeleteArgs(MemoryTargetArgs):
    source_trace = source_trace_field()


class MemoryDeleteVersionArgs(MemoryTargetArgs):
    """A row and one version of it, named as a number or as its decimal text: one of the two."""

    # _one_version below, as the OpenAPI document states it, beside the row's own rule.
    OPENAPI_RULES: ClassVar[dict[str, Any]] = {
        **MemoryTargetArgs.OPENAPI_RULES,
        "allOf": [{"oneOf": [
            {"required": ["version"], "properties": {"version": {"type": "integer"},
                                                     "version_text": {"enum": [None]}}},
            {"required": ["version_text"], "properties": {"version_text": {"type": "string"},
                                                          "version": {"enum": [None]}}},
        ]}],
    }

    version = StrictInt(load_default=None, validate=validate.Range(min=1))
    version_text = fields.String(
        load_default=None,
        validate=validate.Regexp(r"^[1-9][0-9]{0,19}$", error="must be a decimal version"),
        metadata={"description": "The version as a decimal string (exact in JavaScript)."},
    )

    @validates_schema
    def _one_version(self, data: dict[str, Any], **kwargs: Any) -> None:
        number, text = data.get("version"), data.get("version_text")
        if (number is None) == (text is None):
            raise ValidationError("give version or version_text (one of them)",
                                  field_name="version")


class MemoryRevertArgs(MemoryDeleteVersionArgs):
    """A row and the version (from memory.history) whose content comes back."""


class MemoryReinforceArgs(MemoryTargetArgs):
    confidence = StrictFloat(
        load_default=None,
        validate=validate.Range(min=0, max=1),
        metadata={"description": "Raise the row's confidence to this; a lower one leaves it "
                  "as it is (a reinforcement never lowers it). Left out, it stays."},
    )


class MemoryListArgs(IdentityArgs):
    memory_type = memory_type_field(load_default=None)
    key_prefix = fields.String(
        load_default="", validate=[validate.Length(max=KEY_MAX), no_control_characters]
    )
    scope = fields.String(
        load_default="namespace",
        validate=validate.OneOf(["namespace", "this_agent"]),
        metadata={"description": "namespace: every agent's rows; this_agent: the caller's."},
    )
    include_deleted = StrictBool(load_default=False)
    limit = StrictInt(load_default=20, validate=validate.Range(min=1, max=PAGE_MAX))
    cursor = fields.String(
        load_default=None,
        validate=[validate.Length(max=4096), validate.Regexp(
            CURSOR_PATTERN, error="must be a next_cursor (unpadded base64url)")],
        metadata={"description": "next_cursor of the previous page: a place in the key order "
                  "(unpadded base64url); the page starts after it.",
                  "pattern": CURSOR_PATTERN},
    )
    read_scope = read_scope_field()


class MemoryRowAnswer(Schema):
    memory_id = fields.String()
    key = fields.String()
    agent = fields.String()
    user_id = fields.String()
    session_id = fields.String()
    memory_type = fields.String()
    value = fields.Raw(allow_none=True)
    value_length = fields.Integer()
    content_sha256 = fields.String()
    confidence = fields.Float()
    tags = fields.List(fields.String())
    label = fields.String()
    valid_at = fields.String(allow_none=True)
    valid_to = fields.String(allow_none=True)
    duplicate_of = fields.String()
    provenance = fields.String()
    source_trace = fields.String()
    actor = fields.String()
    written_by = fields.String()
    pinned = fields.Boolean()
    locked = fields.Boolean()
    deleted = fields.Boolean()
    redacted = fields.Boolean()
    char_limit = fields.Integer(allow_none=True)
    version = fields.Integer()
    version_text = fields.String()
    created_at = fields.String()
    updated_at = fields.String(metadata={
        "description": "The row's last change; a recall or a backfill writes a version "
        "without moving it."})
    change = fields.String(metadata={
        "description": "What wrote this version: write, delete, lock, unlock, pin, unpin, "
        "delete_version, revert, restore, restate, reinforce, recall or backfill ('' for a "
        "version written before Loom kept it)."})
    from_version = fields.Integer(allow_none=True, metadata={
        "description": "A revert's or restore's source: the version whose content came back."})
    from_version_text = VersionText()
    recall_count = fields.Integer(metadata={"description": "memory.recall calls on the row."})
    recalled_at = fields.String(allow_none=True)
    reinforce_count = fields.Integer(metadata={
        "description": "memory.reinforce calls on the row."})


class MemoryRevisionAnswer(Answer):
    memory_id = fields.String()
    key = fields.String()
    memory_type = fields.String()
    change = fields.String(metadata={"description": "The op's word, as memory.history shows it."})
    version = fields.Integer()
    version_text = VersionText()
    from_version = fields.Integer(allow_none=True, metadata={
        "description": "A revert's or restore's source: the version whose content came back."})
    from_version_text = VersionText()
    content_sha256 = fields.String()
    confidence = fields.Float()
    updated_at = fields.String(metadata={
        "description": "The row's last change, which dates the fact for profile builds "
        "unless its valid_at does."})
    recall_count = fields.Integer()
    reinforce_count = fields.Integer()
    changed = fields.Boolean(metadata={
        "description": "False when a backfill found the row's index entry current (no "
        "version written)."})
    digest_moved = fields.Boolean(metadata={
        "description": "Whether the write moved the user's structured-profile sources, so a "
        "rebuild follows (after the cooldown): never for a recall or a backfill."})


class MemoryWriteAnswer(Answer):
    memory_id = fields.String()
    key = fields.String()
    memory_type = fields.String()
    version = fields.Integer()
    version_text = fields.String()
    content_sha256 = fields.String()
    value_length = fields.Integer()
    char_limit = fields.Integer(allow_none=True)
    created = fields.Boolean()


class MemoryGetAnswer(Answer):
    found = fields.Boolean()
    memory = fields.Nested(MemoryRowAnswer, allow_none=True)


class MemoryListAnswer(Answer):
    memories = fields.List(fields.Nested(MemoryRowAnswer))
    count = fields.Integer()
    next_cursor = fields.String(metadata={"description": "Empty when there are no more rows."})


class MemoryHistoryAnswer(Answer):
    memory_id = fields.String()
    key = fields.String()
    versions = fields.List(fields.Nested(MemoryRowAnswer))
    next_cursor = fields.String()


class MemoryDeleteAnswer(Answer):
    deleted = fields.Boolean()
    memory_id = fields.String()
    key = fields.String()
    version = fields.Integer(allow_none=True)
    version_text = fields.String()


class MemoryDeleteVersionAnswer(Answer):
    memory_id = fields.String()
    key = fields.String()
    removed_version = fields.Integer()
    removed_version_text = fields.String()
    version = fields.Integer()
    version_text = fields.String()
    deleted = fields.Boolean()
    content_sha256 = fields.String()


class MemoryFlagAnswer(Answer):
    memory_id = fields.String()
    key = fields.String()
    version = fields.Integer()
    version_text = fields.String()
    locked = fields.Boolean()
    pinned = fields.Boolean()
    changed = fields.Boolean(metadata={"description": "False when the flag was already so."})


class MemoryRedactAnswer(Answer):
    memory_id = fields.String()
    key = fields.String()
    redacted = fields.Boolean()
    versions_redacted = fields.Integer()


# --------------------------------------------------------------------------------------------
# Shared by the memory.* and profile.* handlers


def memory_store(call: Call) -> MemoryStore:
    return call.services.store(MemoryStore)


def read_scope_for(call: Call, requested: str | None) -> str:
    """The read scope of a read: the token's ceiling, narrowed by what the token pins.

    A token pinned to a session reads at most ``own_session``, one pinned to a user at most
    ``own_user`` (an end user's token reads only that user's rows and the namespace's). Naming
    a broader scope is refused, as ``effective_read_scope`` refuses one above the ceiling.
    """
    principal = call.principal
    scope = effective_read_scope(principal, requested)
    pinned = (
        "own_session" if principal.session_id else "own_user" if principal.read_user_id else None
    )
    if pinned is None or READ_SCOPE_RANK[scope] <= READ_SCOPE_RANK[pinned]:
        return scope
    if requested is None:
        return pinned
    raise AuthInsufficient(
        f"read_scope {requested!r} is broader than this token reaches ({pinned!r})",
        field="read_scope",
    )


def own_location(call: Call, key: str) -> Location:
    identity = call.identity
    return Location(
        identity.org, identity.namespace, identity.user_id, identity.agent,
        identity.session_id, key,
    )


def writable_location(call: Call, key: str) -> Location:
    if call.identity.agent == "*":
        raise ValidationFailed({"agent": ["a write names one agent, not '*'"]})
    return own_location(call, key)


def record_profile_read(call: Call, op_name: str) -> None:
    """Note a read of the caller's user's profile (render, section get, structured, pack)."""
    call.services.store(ActivityStore).record(call.identity, call.client, op_name,
                                              by_console=call.by_console)


def _not_found(call: Call) -> MemoryNotFound:
    a = call.args
    if a.get("memory_id"):
        return MemoryNotFound(f"no memory row {a['memory_id']!r} here", memory_id=a["memory_id"])
    return MemoryNotFound(f"no memory row {a['key']!r} here", key=a["key"])


def _target(call: Call, *, read_scope: str, write: bool = False) -> tuple[Location, str]:
    """The row the call names, and the memory_id a script must find there ('' for a key).

    A memory_id is held to the same reach as a key. A read sees what ``read_scope`` shows and,
    for a token fixed to an agent, that agent's rows and the namespace-level ones (agent '-');
    a write reaches only what ``row_writable`` allows. A row out of reach is not found, as one
    that does not exist, so no answer tells the two apart."""
    a = call.args
    memory_id = a.get("memory_id")
    if memory_id is None:
        return (own_location(call, a["key"]), "")
    location = memory_store(call).locate(call.identity.org, call.identity.namespace, memory_id)
    if location is None:
        raise _not_found(call)
    if write:
        reached = row_writable(call.principal, read_scope, call.identity, location.user_id,
                               location.session_id, location.agent)
    else:
        fixed_agent = call.principal.agent
        reached = row_visible(
            read_scope, call.identity, location.user_id, location.session_id
        ) and (fixed_agent is None or location.agent in (fixed_agent, "-"))
    if not reached:
        raise _not_found(call)
    return location, memory_id


def _write_target(call: Call) -> tuple[Location, str]:
    """A write's row: by key in the caller's identity, or by a memory_id the caller may write
    (``row_writable``: a token pinned to a user, session or agent reaches only its own rows).
    With ``memory_type`` given, a row of another type is not found."""
    if call.args.get("memory_id") is None and call.identity.agent == "*":
        raise ValidationFailed({"agent": ["a write names one agent, not '*'"]})
    location, memory_id = _target(call, read_scope=read_scope_for(call, None), write=True)
    wanted = call.args.get("memory_type")
    if wanted is not None:
        row = memory_store(call).read(location)
        if row is None or row.memory_type != wanted:
            raise _not_found(call)
    return location, memory_id


def write_answer(written: Written) -> dict[str, Any]:
    row = written.row
    return {
        "memory_id": row.memory_id,
        "key": row.key,
        "memory_type": row.memory_type,
        "version": row.version,
        "version_text": str(row.version),
        "content_sha256": row.content_sha256,
        "value_length": row.value_length,
        "char_limit": row.char_limit,
        "created": written.created,
    }


# --------------------------------------------------------------------------------------------
# Ops


def _row_slot(call: Call) -> str:
    """The hash tag of the user whose row a keyed write touches: where its Idempotency-Key
    record lives, in the slot of the row's keys, and goes with that user's erasure. A row by
    ``memory_id`` is looked up (one GET); one not found leaves the caller's user (the write
    then answers 404 and keeps nothing)."""
    identity = call.identity
    memory_id = call.args.get("memory_id")
    user_id = identity.user_id
    if memory_id:
        location = memory_store(call).locate(identity.org, identity.namespace, memory_id)
        if location is not None:
            user_id = location.user_id
    return keys.user_tag(identity.org, identity.namespace, user_id)


def _replayed(answer_of: Callable[[Call, Written], dict[str, Any]]
              ) -> Callable[[Call, str], dict[str, Any]]:
    """An op's ``replay``: its answer again from the reply its write script kept with the
    call's Idempotency-Key (app/idempotency.py), built by the same ``answer_of`` as the
    first answer."""

    def replay(call: Call, kept: str) -> dict[str, Any]:
        return answer_of(call, MemoryStore.written_of(json.loads(kept)))

    return replay


# What a write to a memory row can meet beyond every write's codes (app.error_catalogue).
MEMORY_WRITE_ERRORS = ("MEMORY_NOT_FOUND", "MEMORY_LOCKED", "MEMORY_TYPE_MISMATCH", "HASH_MISMATCH",
                       "CHAR_LIMIT_EXCEEDED", "USER_BEING_ERASED", "WRITE_CONFLICT")


@op("memory.set", role="writer", kind="idempotent",
    raises=MEMORY_WRITE_ERRORS,
    args=MemorySetArgs, answer=MemoryWriteAnswer,
    replay=_replayed(lambda _call, written: write_answer(written)),
    example={**_WHO, "key": "invoice_currency", "value": "Prefers EUR invoices.",
             "memory_type": "preference"})
def memory_set(call: Call) -> dict[str, Any]:
    """Write a memory row; every write is a new version."""
    a = call.args
    tags = list(dict.fromkeys(a["tags"]))
    if call.services.settings.memory_attribute_tagging:
        # LOOM_MEMORY_ATTRIBUTE_TAGGING: add attribute:<name> for each protected attribute the
        # value mentions (app/attributes.py, no model), so the profile folds leave the row out.
        tags = with_attribute_tags(tags, a["value"])
    content = Content(
        memory_type=a["memory_type"],
        value=a["value"],
        confidence=a["confidence"],
        tags=tags,
        label=a["label"],
        valid_at=None if a["valid_at"] is None else to_ns(a["valid_at"]),
        valid_to=None if a["valid_to"] is None else to_ns(a["valid_to"]),
        duplicate_of=a["duplicate_of"],
        provenance=a["provenance"],
        source_trace=a["source_trace"],
        actor=call.identity.agent,
    )
    written = memory_store(call).set(
        writable_location(call, a["key"]),
        content,
        written_by=call.identity.agent,
        char_limit=a["char_limit"],
        default_char_limit=(
            DEFAULT_PROFILE_CHAR_LIMIT if a["memory_type"] == PROFILE_TYPE else None
        ),
        if_match_sha256=a["if_match_sha256"],
        held=call.held_key,
    )
    return write_answer(written)


def _pick(rows: list[MemoryRow]) -> MemoryRow | None:
    return max(rows, key=lambda row: row.updated_at, default=None)


@op("memory.get", role="viewer", kind="read",
    args=MemoryGetArgs, answer=MemoryGetAnswer,
    example={**_WHO, "key": "invoice_currency"})
def memory_get(call: Call) -> dict[str, Any]:
    """Read one row by key or memory_id (agent '*': any agent's row of that key)."""
    a = call.args
    store = memory_store(call)
    scope = read_scope_for(call, a["read_scope"])
    identity = call.identity
    if a["memory_id"] is None and identity.agent == "*":
        # Any agent's row of this key under the caller's session_id: the latest written.
        candidates = [
            row
            for row in store.rows_with_key(
                identity.org, identity.namespace, identity.user_id, a["key"]
            )
            if row.session_id == identity.session_id
            and row.live
            and a["memory_type"] in (None, row.memory_type)
        ]
        row = _pick(candidates)
    else:
        try:
            location, memory_id = _target(call, read_scope=scope)
        except MemoryNotFound:
            return {"found": False, "memory": None}
        row = store.read(location)
        if row is not None and memory_id and row.memory_id != memory_id:
            row = None
    if row is None or not row.live or a["memory_type"] not in (None, row.memory_type):
        return {"found": False, "memory": None}
    if row.memory_type == PROFILE_TYPE:
        record_profile_read(call, "memory.get")
    return {"found": True, "memory": row.as_answer()}


def _encode_cursor(member: str) -> str:
    return base64.urlsafe_b64encode(member.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> str:
    """The position a cursor names. A cursor is a place in the key order, not a row: any
    text the document's pattern admits decodes to one (bytes that are not UTF-8 read with
    U+FFFD), so a cursor this op did not give still names a place to start after."""
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    return raw.decode("utf-8", errors="replace")


# A list page reads at most this many batches before it answers with a cursor.
_LIST_MAX_BATCHES = 20


@op("memory.list", role="viewer", kind="read",
    args=MemoryListArgs, answer=MemoryListAnswer,
    example={**_WHO, "memory_type": "preference", "limit": 20})
def memory_list(call: Call) -> dict[str, Any]:
    """List the user's rows in key order, filtered by type and key prefix, a page at a time."""
    a = call.args
    identity = call.identity
    scope = read_scope_for(call, a["read_scope"])
    after = _decode_cursor(a["cursor"]) if a["cursor"] else None
    if after is not None and not after.startswith(a["key_prefix"]):
        # A place outside the prefix's keys: before them the page starts at their first,
        # after them there is nothing left to list.
        if after > a["key_prefix"]:
            return {"memories": [], "count": 0, "next_cursor": ""}
        after = None
    store = memory_store(call)
    limit = a["limit"]
    found: list[MemoryRow] = []
    cursor = ""
    # Without tombstones, the live index skips them and, with a type, the other types: a page
    # reads the rows it answers, and more only where scope or read_scope leave some out.
    live_type = None if a["include_deleted"] else (a["memory_type"] or "")
    for _ in range(_LIST_MAX_BATCHES):
        batch, more = store.scan_rows(
            identity.org, identity.namespace, identity.user_id,
            after=after, key_prefix=a["key_prefix"], batch=limit - len(found),
            live_type=live_type,
        )
        for member, row in batch:
            after = member
            if row is not None and _listed(row, a, scope, call):
                found.append(row)
        if len(found) == limit:
            cursor = _encode_cursor(after) if more and after is not None else ""
            break
        if not more:
            break
    else:
        # Read as far as one page may: the next page starts after the last row examined.
        cursor = _encode_cursor(after) if after is not None else ""
    if a["memory_type"] == PROFILE_TYPE and found:
        record_profile_read(call, "memory.list")
    return {
        "memories": [row.as_answer() for row in found],
        "count": len(found),
        "next_cursor": cursor,
    }


def _listed(row: MemoryRow, a: dict[str, Any], scope: str, call: Call) -> bool:
    if row.deleted and not a["include_deleted"]:
        return False
    if a["memory_type"] is not None and row.memory_type != a["memory_type"]:
        return False
    if a["scope"] == "this_agent" and row.agent != call.identity.agent:
        return False
    return row_visible(scope, call.identity, row.user_id, row.session_id)


@op("memory.history", role="viewer", kind="read",
    raises=("MEMORY_NOT_FOUND",),
    args=MemoryHistoryArgs, answer=MemoryHistoryAnswer,
    example={**_WHO, "key": "invoice_currency"})
def memory_history(call: Call) -> dict[str, Any]:
    """A row's versions, newest first, a page at a time."""
    a = call.args
    store = memory_store(call)
    location, memory_id = _target(call, read_scope=read_scope_for(call, a["read_scope"]))
    row = store.read(location)
    if (
        row is None
        or (memory_id and row.memory_id != memory_id)
        or a["memory_type"] not in (None, row.memory_type)
    ):
        raise _not_found(call)
    before = int(a["cursor"]) if a["cursor"] else None
    versions, more = store.history(location, before=before, limit=a["limit"])
    return {
        "memory_id": row.memory_id,
        "key": row.key,
        "versions": [version.as_answer() for version in versions],
        "next_cursor": str(versions[-1].version) if more and versions else "",
    }


def _delete_answer(_call: Call, written: Written) -> dict[str, Any]:
    row = written.row
    return {
        "deleted": written.changed,
        "memory_id": row.memory_id,
        "key": row.key,
        "version": row.version,
        "version_text": str(row.version),
    }


@op("memory.delete", role="writer", kind="idempotent", listed=False,
    raises=MEMORY_WRITE_ERRORS,
    args=MemoryDeleteArgs, answer=MemoryDeleteAnswer, replay=_replayed(_delete_answer),
    keyed_in=_row_slot,
    example={**_WHO, "key": "invoice_currency"})
def memory_delete(call: Call) -> dict[str, Any]:
    """Delete a row: a tombstone version; its history stays readable."""
    a = call.args
    try:
        location, memory_id = _write_target(call)
    except MemoryNotFound:
        if a["memory_id"] is not None:
            raise
        return {"deleted": False, "memory_id": "", "key": a["key"], "version": None,
                "version_text": ""}
    written = memory_store(call).delete(
        location, written_by=call.identity.agent, memory_id=memory_id,
        source_trace=a["source_trace"], held=call.held_key,
    )
    if written is None:
        if memory_id:
            raise _not_found(call)
        return {"deleted": False, "memory_id": "", "key": location.key, "version": None,
                "version_text": ""}
    return _delete_answer(call, written)


def _named_version(args: dict[str, Any]) -> int:
    """The version a call names, by number or by its text (the schema checked they agree)."""
    return args["version"] if args["version"] is not None else int(args["version_text"])


def _delete_version_answer(call: Call, written: Written) -> dict[str, Any]:
    version = _named_version(call.args)
    row = written.row
    return {
        "memory_id": row.memory_id,
        "key": row.key,
        "removed_version": version,
        "removed_version_text": str(version),
        "version": row.version,
        "version_text": str(row.version),
        "deleted": row.deleted,
        "content_sha256": row.content_sha256,
    }


@op("memory.delete_version", role="admin", kind="write", listed=False,
    raises=MEMORY_WRITE_ERRORS,
    args=MemoryDeleteVersionArgs, answer=MemoryDeleteVersionAnswer,
    replay=_replayed(_delete_version_answer),
    keyed_in=_row_slot,
    example={**_WHO, "key": "invoice_currency", "version_text": "1800000000000000000"})
def memory_delete_version(call: Call) -> dict[str, Any]:
    """Remove one version of a row (by version or version_text); the row records the removal."""
    version = _named_version(call.args)
    location, memory_id = _write_target(call)
    written = memory_store(call).delete_version(
        location, version, written_by=call.identity.agent, memory_id=memory_id,
        held=call.held_key,
    )
    return _delete_version_answer(call, written)


STRUCTURED_PROFILE_KEY = "structured_profile"


def _flag(call: Call, flag: str, on: bool) -> dict[str, Any]:
    location, memory_id = _write_target(call)
    written = memory_store(call).set_flag(
        location, flag, on, written_by=call.identity.agent, memory_id=memory_id,
        held=call.held_key,
    )
    row = written.row
    if written.changed and not on and row.key == STRUCTURED_PROFILE_KEY:
        # An unlock or unpin of the structured profile lets a refused build try again now.
        from app.store.structured import StructuredStore

        call.services.store(StructuredStore).unpark(
            location.org, location.namespace, location.user_id, call.services.clock.now_ns()
        )
    return _flag_answer(call, written)


def _flag_answer(_call: Call, written: Written) -> dict[str, Any]:
    row = written.row
    return {
        "memory_id": row.memory_id,
        "key": row.key,
        "version": row.version,
        "version_text": str(row.version),
        "locked": row.locked,
        "pinned": row.pinned,
        "changed": written.changed,
    }


@op("memory.lock", role="writer", kind="idempotent", listed=False,
    raises=MEMORY_WRITE_ERRORS,
    args=MemoryTargetArgs, answer=MemoryFlagAnswer, replay=_replayed(_flag_answer),
    keyed_in=_row_slot,
    example={**_WHO, "key": "invoice_currency"})
def memory_lock(call: Call) -> dict[str, Any]:
    """Lock a row: a new version with the same content; every write but unlock is refused."""
    return _flag(call, "locked", True)


@op("memory.unlock", role="writer", kind="idempotent", listed=False,
    raises=MEMORY_WRITE_ERRORS,
    args=MemoryTargetArgs, answer=MemoryFlagAnswer, replay=_replayed(_flag_answer),
    keyed_in=_row_slot,
    example={**_WHO, "key": "invoice_currency"})
def memory_unlock(call: Call) -> dict[str, Any]:
    """Unlock a row: a new version with the same content."""
    return _flag(call, "locked", False)


@op("memory.pin", role="writer", kind="idempotent", listed=False,
    raises=MEMORY_WRITE_ERRORS,
    args=MemoryTargetArgs, answer=MemoryFlagAnswer, replay=_replayed(_flag_answer),
    keyed_in=_row_slot,
    example={**_WHO, "key": "invoice_currency"})
def memory_pin(call: Call) -> dict[str, Any]:
    """Pin a row: no worker rebuilds it; a new version with the same content."""
    return _flag(call, "pinned", True)


@op("memory.unpin", role="writer", kind="idempotent", listed=False,
    raises=MEMORY_WRITE_ERRORS,
    args=MemoryTargetArgs, answer=MemoryFlagAnswer, replay=_replayed(_flag_answer),
    keyed_in=_row_slot,
    example={**_WHO, "key": "invoice_currency"})
def memory_unpin(call: Call) -> dict[str, Any]:
    """Unpin a row: workers may rebuild it again; a new version with the same content."""
    return _flag(call, "pinned", False)


def _redact_answer(redacted: Redacted) -> dict[str, Any]:
    return {
        "memory_id": redacted.written.row.memory_id,
        "key": redacted.written.row.key,
        "redacted": True,
        "versions_redacted": redacted.versions,
    }


@op("memory.redact", role="admin", kind="idempotent", listed=False,
    raises=MEMORY_WRITE_ERRORS,
    args=MemoryTargetArgs, answer=MemoryRedactAnswer,
    keyed_in=_row_slot,
    replay=lambda _call, kept: _redact_answer(MemoryStore.redacted_of(kept_reply(kept))),
    example={**_WHO, "key": "invoice_currency"})
def memory_redact(call: Call) -> dict[str, Any]:
    """Scrub every version of a row and the profile versions whose trace names it."""
    location, memory_id = _write_target(call)
    redacted = redact_row(
        memory_store(call), location, written_by=call.identity.agent, memory_id=memory_id,
        held=call.held_key,
    )
    return _redact_answer(redacted)


# --------------------------------------------------------------------------------------------
# Revisions: seed 000 names what each does to a structured profile's digest (docs/decisions.md)


def _revision_answer(_call: Call, written: Written) -> dict[str, Any]:
    row = written.row
    return {
        "memory_id": row.memory_id,
        "key": row.key,
        "memory_type": row.memory_type,
        "change": row.change,
        "version": row.version,
        "version_text": str(row.version),
        "from_version": row.from_version,
        "from_version_text": "" if row.from_version is None else str(row.from_version),
        "content_sha256": row.content_sha256,
        "confidence": row.confidence,
        "updated_at": iso_from_ns(row.updated_at),
        "recall_count": row.recall_count,
        "reinforce_count": row.reinforce_count,
        "changed": written.changed,
        "digest_moved": written.sources_moved,
    }


@op("memory.revert", role="writer", kind="write", listed=False,
    raises=MEMORY_WRITE_ERRORS,
    args=MemoryRevertArgs, answer=MemoryRevisionAnswer, replay=_replayed(_revision_answer),
    keyed_in=_row_slot,
    example={**_WHO, "key": "invoice_currency", "version_text": "1800000000000000000"})
def memory_revert(call: Call) -> dict[str, Any]:
    """Bring back a stored version's content (by version or version_text) as a new version."""
    version = _named_version(call.args)
    location, memory_id = _write_target(call)
    written = memory_store(call).revert(
        location, version, written_by=call.identity.agent, memory_id=memory_id,
        held=call.held_key,
    )
    return _revision_answer(call, written)


@op("memory.restore", role="writer", kind="write", listed=False,
    raises=(*MEMORY_WRITE_ERRORS, "MEMORY_NOT_DELETED"),
    args=MemoryTargetArgs, answer=MemoryRevisionAnswer, replay=_replayed(_revision_answer),
    keyed_in=_row_slot,
    example={**_WHO, "key": "invoice_currency"})
def memory_restore(call: Call) -> dict[str, Any]:
    """Bring a deleted row back with its last content before the delete, as a new version."""
    location, memory_id = _write_target(call)
    written = memory_store(call).revert(
        location, None, written_by=call.identity.agent, memory_id=memory_id,
        held=call.held_key,
    )
    return _revision_answer(call, written)


def _touch(call: Call, change: str, confidence: float | None = None) -> dict[str, Any]:
    location, memory_id = _write_target(call)
    written = memory_store(call).touch(
        location, change, written_by=call.identity.agent, memory_id=memory_id,
        confidence=confidence, held=call.held_key,
    )
    return _revision_answer(call, written)


@op("memory.restate", role="writer", kind="write", listed=False,
    raises=MEMORY_WRITE_ERRORS,
    args=MemoryTargetArgs, answer=MemoryRevisionAnswer, replay=_replayed(_revision_answer),
    keyed_in=_row_slot,
    example={**_WHO, "key": "invoice_currency"})
def memory_restate(call: Call) -> dict[str, Any]:
    """The fact was stated again: a new version with the same content, dated now."""
    return _touch(call, "restate")


@op("memory.reinforce", role="writer", kind="write", listed=False,
    raises=MEMORY_WRITE_ERRORS,
    args=MemoryReinforceArgs, answer=MemoryRevisionAnswer, replay=_replayed(_revision_answer),
    keyed_in=_row_slot,
    example={**_WHO, "key": "invoice_currency", "confidence": 0.9})
def memory_reinforce(call: Call) -> dict[str, Any]:
    """The fact was confirmed: counted, confidence raised if given, a new version dated now."""
    return _touch(call, "reinforce", call.args["confidence"])


@op("memory.recall", role="writer", kind="write", listed=False,
    raises=MEMORY_WRITE_ERRORS,
    args=MemoryTargetArgs, answer=MemoryRevisionAnswer, replay=_replayed(_revision_answer),
    keyed_in=_row_slot,
    example={**_WHO, "key": "invoice_currency"})
def memory_recall(call: Call) -> dict[str, Any]:
    """The fact was used: counted and timed in a new version that keeps its last change."""
    return _touch(call, "recall")


@op("memory.backfill", role="writer", kind="idempotent", listed=False,
    raises=MEMORY_WRITE_ERRORS,
    args=MemoryTargetArgs, answer=MemoryRevisionAnswer, replay=_replayed(_revision_answer),
    keyed_in=_row_slot,
    example={**_WHO, "key": "invoice_currency"})
def memory_backfill(call: Call) -> dict[str, Any]:
    """Bring a row's recall index entry up to date, keeping its content and last change."""
    from app.recall_backfill import backfill_one

    location, memory_id = _write_target(call)
    written = backfill_one(call.services, location, written_by=call.identity.agent,
                           memory_id=memory_id, held=call.held_key)
    return _revision_answer(call, written)
