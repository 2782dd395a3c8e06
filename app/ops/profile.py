"""The profile.* ops of seed 003 except profile.structured: sections as memory rows.

A section is the memory row with ``memory_type='profile'`` and ``key=label`` in the caller's
(agent, user_id, session_id). set, append and replace are thin wrappers over the memory store
that fix the type and a ``char_limit`` (8,192 characters of the value's canonical JSON by
default). render reads every agent's sections in the namespace (``scope='namespace'``) or the
caller's own, within the read scope, through the section indexes so that it reads only the rows
it renders; every read of a profile is noted for ``profile.activity``. get, list and delete of
one section are ``memory.get``/``list``/``delete`` with ``memory_type='profile'`` and the label
as the key (the SDK's ``profile.get`` etc.).
"""

from __future__ import annotations

from typing import Any, ClassVar

from marshmallow import Schema, fields, validate

from app.auth import row_visible
from app.ops.memory import (
    KeyText,
    memory_store,
    read_scope_field,
    read_scope_for,
    record_profile_read,
    source_trace_field,
    writable_location,
)
from app.prompt_text import markdown_body, markdown_heading, xml_attribute, xml_text
from app.registry import Call, op
from app.schemas.common import Answer, IdentityArgs, StrictInt
from app.schemas.fastload import fast_load
from app.schemas.rules import length_within
from app.store.activity import RETENTION_DAYS, ActivityStore
from app.store.idempotency import kept_reply
from app.store.memory import (
    DEFAULT_PROFILE_CHAR_LIMIT,
    MAX_CHAR_LIMIT,
    PROFILE_TYPE,
    Content,
    MemoryRow,
    MemoryStore,
    SectionReach,
    Written,
    canonical_json,
)

RENDER_MAX_LABELS = 100
ACTIVITY_ENTRIES = 20
_WHO = {"namespace": "support", "agent": "triage-bot", "user_id": "u-42"}


@fast_load
class ProfileSetArgs(IdentityArgs):
    # The char_limit beside the value caps its JSON, as the OpenAPI document states it.
    OPENAPI_RULES: ClassVar[dict[str, Any]] = {"x-loom-rules": [
        length_within("value", "char_limit", DEFAULT_PROFILE_CHAR_LIMIT, "json")]}

    label = KeyText(
        required=True,
        metadata={"description": "The section's name (its memory key), e.g. persona."},
    )
    value = fields.String(required=True, metadata={"description": "The section's whole text."})
    char_limit = StrictInt(
        load_default=DEFAULT_PROFILE_CHAR_LIMIT,
        validate=validate.Range(min=1, max=MAX_CHAR_LIMIT),
        metadata={
            "description": "The section's size cap on the JSON-encoded value (default 8192); "
            "a set without it gives the section the default cap."
        },
    )
    source_trace = source_trace_field()
    if_match_sha256 = fields.String(
        load_default="",
        validate=validate.Length(max=64),
        metadata={"description": "Write only if the section's content_sha256 equals this."},
    )


@fast_load
class ProfileAppendArgs(IdentityArgs):
    label = KeyText(
        required=True,
        metadata={"description": "The section to append to; a missing one is created."},
    )
    addition = fields.String(required=True, metadata={"description": "Text added at the end."})
    separator = fields.String(
        load_default="\n",
        metadata={"description": "Between the existing text and addition; unused when new."},
    )


@fast_load
class ProfileReplaceArgs(IdentityArgs):
    label = KeyText(
        required=True, metadata={"description": "The section to edit; a missing one is a 404."}
    )
    old = fields.String(
        required=True,
        validate=validate.Length(min=1),
        metadata={"description": "Text to find; every occurrence is replaced."},
    )
    new = fields.String(
        required=True, metadata={"description": "Replacement text; empty deletes."}
    )


@fast_load
class ProfileRenderArgs(IdentityArgs):
    format = fields.String(load_default="xml", validate=validate.OneOf(["xml", "markdown"]))
    labels = fields.List(
        KeyText(),
        load_default=None,
        validate=validate.Length(max=RENDER_MAX_LABELS),
        metadata={"description": "If set, render only these labels, in this order."},
    )
    scope = fields.String(
        load_default="namespace",
        validate=validate.OneOf(["namespace", "this_agent"]),
        metadata={"description": "namespace: every agent's sections; this_agent: the caller's."},
    )
    read_scope = read_scope_field()


@fast_load
class ProfileActivityArgs(IdentityArgs):
    lookback_days = StrictInt(
        load_default=7,
        validate=validate.Range(min=1),
        metadata={"description": "Days to look back; capped at 30 server-side."},
    )


class ProfileWrite(Answer):
    version = fields.Integer()
    version_text = fields.String(metadata={"description": "version as decimal text: exact "
                                 "where a JSON number above 2^53 is not"})
    memory_id = fields.String()
    content_sha256 = fields.String()
    namespace = fields.String()
    label = fields.String()
    char_limit = fields.Integer(allow_none=True)
    value_length = fields.Integer()


class ProfileRendered(Answer):
    rendered = fields.String()
    section_count = fields.Integer()
    total_chars = fields.Integer()
    labels = fields.List(fields.String())


class ProfileActivityEntry(Schema):
    agent = fields.String()
    client = fields.String(metadata={"description": "X-Loom-Client, else the User-Agent."})
    last_read_at = fields.String()
    op = fields.String(metadata={"description": "The op of that reader's last read."})


class ProfileActivity(Answer):
    entries = fields.List(fields.Nested(ProfileActivityEntry))


def _answer(call: Call, written: Written) -> dict[str, Any]:
    row = written.row
    return {
        "version": row.version,
        "version_text": str(row.version),
        "memory_id": row.memory_id,
        "content_sha256": row.content_sha256,
        "namespace": call.identity.namespace,
        "label": row.key,
        "char_limit": row.char_limit,
        "value_length": row.value_length,
    }


# What a write to a profile section can meet beyond every write's codes.
PROFILE_WRITE_ERRORS = ("CHAR_LIMIT_EXCEEDED", "HASH_MISMATCH", "MEMORY_LOCKED",
                        "MEMORY_TYPE_MISMATCH", "USER_BEING_ERASED", "WRITE_CONFLICT")


def _replayed(call: Call, kept: str) -> dict[str, Any]:
    """A keyed write's answer again from the reply its script kept with the Idempotency-Key."""
    return _answer(call, MemoryStore.written_of(kept_reply(kept)))


@op("profile.set", role="writer", kind="idempotent", listed=False,
    raises=PROFILE_WRITE_ERRORS,
    args=ProfileSetArgs, answer=ProfileWrite, replay=_replayed,
    example={**_WHO, "label": "persona", "value": "Terse. Cite ticket ids."})
def profile_set(call: Call) -> dict[str, Any]:
    """Create or replace a profile section at label."""
    a = call.args
    content = Content(
        memory_type=PROFILE_TYPE,
        value=a["value"],
        source_trace=a["source_trace"],
        actor=call.identity.agent,
    )
    written = memory_store(call).set(
        writable_location(call, a["label"]),
        content,
        written_by=call.identity.agent,
        char_limit=a["char_limit"],
        default_char_limit=DEFAULT_PROFILE_CHAR_LIMIT,
        if_match_sha256=a["if_match_sha256"],
        required_type=PROFILE_TYPE,
        held=call.held_key,
    )
    return _answer(call, written)


@op("profile.append", role="writer", kind="write", listed=False,
    raises=PROFILE_WRITE_ERRORS,
    args=ProfileAppendArgs, answer=ProfileWrite, replay=_replayed,
    example={**_WHO, "label": "preferences", "addition": "Prefers EUR invoices."})
def profile_append(call: Call) -> dict[str, Any]:
    """Append to a profile section, creating it when missing; no append is lost to a race."""
    a = call.args
    written = memory_store(call).append(
        writable_location(call, a["label"]),
        a["addition"],
        a["separator"],
        written_by=call.identity.agent,
        held=call.held_key,
    )
    return _answer(call, written)


@op("profile.replace", role="writer", kind="idempotent", listed=False,
    raises=(*PROFILE_WRITE_ERRORS, "PROFILE_SECTION_NOT_FOUND", "SUBSTRING_NOT_FOUND"),
    args=ProfileReplaceArgs, answer=ProfileWrite, replay=_replayed,
    example={**_WHO, "label": "preferences", "old": "EUR", "new": "CHF"})
def profile_replace(call: Call) -> dict[str, Any]:
    """Rewrite every occurrence of a substring inside a profile section."""
    a = call.args
    written = memory_store(call).replace_text(
        writable_location(call, a["label"]), a["old"], a["new"], written_by=call.identity.agent,
        held=call.held_key,
    )
    return _answer(call, written)


def _order(row: MemoryRow) -> tuple[Any, ...]:
    # Namespace-level sections first, then the user's, then per session_id; agent breaks ties.
    return (
        row.key,
        row.user_id != "-",
        row.user_id,
        row.session_id != "-",
        row.session_id,
        row.agent,
    )


def section_text(row: MemoryRow) -> str:
    return row.value if isinstance(row.value, str) else canonical_json(row.value)


def render_sections(rows: list[MemoryRow], style: str) -> str:
    """Sections as one prompt fragment; context.pack renders its profile layer with this."""
    if style == "markdown":
        return "\n\n".join(
            f"## {markdown_heading(row.key)}\n{markdown_body(section_text(row))}" for row in rows
        )
    parts = []
    for row in rows:
        attributes = f'label="{xml_attribute(row.key)}"'
        if row.user_id != "-":
            attributes += f' user_id="{xml_attribute(row.user_id)}"'
        if row.session_id != "-":
            attributes += f' session_id="{xml_attribute(row.session_id)}"'
        parts.append(f"<profile {attributes}>{xml_text(section_text(row))}</profile>")
    return "\n".join(parts)


def section_reaches(
    call: Call, read_scope: str, scope: str, labels: list[str] | None
) -> list[SectionReach]:
    """Which users' sections a render reads, and which of their sessions and labels: the
    namespace-level ones (user ``-``) and the caller's always, other users' only at read scope
    ``namespace`` and only those the namespace's indexes say hold what is asked."""
    identity = call.identity
    wanted = None if labels is None else tuple(dict.fromkeys(labels))
    if read_scope == "own_session":
        sessions = tuple(dict.fromkeys(["-", identity.session_id]))
        reaches = [SectionReach("-", sessions, wanted)]
        if identity.user_id != "-":
            reaches.append(SectionReach(identity.user_id, (identity.session_id,), wanted))
        return reaches
    own = {"-": wanted, identity.user_id: wanted}
    if read_scope == "namespace":
        agent = identity.agent if scope == "this_agent" else None
        others = memory_store(call).section_users(
            identity.org, identity.namespace, wanted, agent
        )
        own = {**others, **own}
    return [SectionReach(user_id, None, user_labels) for user_id, user_labels in own.items()]


def sections_in_scope(
    call: Call, read_scope: str, scope: str, labels: list[str] | None
) -> list[MemoryRow]:
    """The live sections a render reaches, in render order. Reads the rows it can render and
    no other (the section indexes, app/store/keys.py), so its cost follows its answer."""
    identity = call.identity
    agent = identity.agent if scope == "this_agent" else None
    now = call.services.clock.now_ns()
    rows = [
        row
        for row in memory_store(call).profile_sections(
            identity.org, identity.namespace,
            section_reaches(call, read_scope, scope, labels), agent,
        )
        if not row.expired(now)
        and (agent is None or row.agent == agent)
        and row_visible(read_scope, identity, row.user_id, row.session_id)
    ]
    rows.sort(key=_order)
    if labels is None:
        return rows
    by_label: dict[str, list[MemoryRow]] = {}
    for row in rows:
        by_label.setdefault(row.key, []).append(row)
    return [row for label in dict.fromkeys(labels) for row in by_label.get(label, [])]


@op("profile.render", role="viewer", kind="read",
    args=ProfileRenderArgs, answer=ProfileRendered,
    example={**_WHO, "format": "xml", "read_scope": "own_user"})
def profile_render(call: Call) -> dict[str, Any]:
    """Render every section in (org, namespace) into one prompt fragment."""
    a = call.args
    read_scope = read_scope_for(call, a["read_scope"])
    rows = sections_in_scope(call, read_scope, a["scope"], a["labels"])
    rendered = render_sections(rows, a["format"])
    record_profile_read(call, "profile.render")
    return {
        "rendered": rendered,
        "section_count": len(rows),
        "total_chars": len(rendered),
        "labels": [row.key for row in rows],
    }


@op("profile.activity", role="viewer", kind="read",
    args=ProfileActivityArgs, answer=ProfileActivity,
    example={**_WHO, "lookback_days": 7})
def profile_activity(call: Call) -> dict[str, Any]:
    """Recent profile reads per agent and client, most recent first (console reads left out)."""
    days = min(call.args["lookback_days"], RETENTION_DAYS)
    readers = call.services.store(ActivityStore).readers(call.identity, days, ACTIVITY_ENTRIES)
    return {"entries": [reader.as_answer() for reader in readers]}
