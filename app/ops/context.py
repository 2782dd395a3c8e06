"""context.pack (seed 000, "How context.pack loads them"): what an agent is told, as one text.

A pack renders working memory first and the profile second, ahead of the query-dependent
sections, so its start stays the same across questions and a client can place a prompt-cache
breakpoint after it (``stable_prefix_chars``, ``stable_hash``). With a ``query``, the facts
``memory.search`` finds for it follow the prefix as the ``memories`` section, in rank order,
within its own budget; the prefix never depends on the query.

Working memory is layered narrowest first: a pack for a run carries the run's blocks, then its
session's (``run_id`` ``-``), then the agent's (``session_id`` ``-``, ``run_id`` ``-``). A
plugin's "where was I" note (block key ``session:<project>``) lives in the agent layer; with
``session_block`` set, the agent layer's other ``session:*`` notes are left out. The profile
section is what ``profile.render`` renders, through the same helpers.

Each section has a character budget. A block or profile section that does not fit is dropped
whole, never cut mid-text, and listed under the section's ``dropped``; the ones after it that
still fit are kept, so a budget keeps the narrowest layers and the first sections first.

A pack reads the profile, so it counts in ``profile.activity``. Agent state (seed 002) is never
read here: it is written by code and never enters a prompt.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

from marshmallow import Schema, ValidationError, fields, validate

from app.auth import row_visible
from app.ops.memory import read_scope_for, record_profile_read
from app.ops.profile import ProfileRenderArgs, render_sections, section_text, sections_in_scope
from app.ops.recall import (
    QUERY_DESCRIPTION,
    QUERY_MAX,
    QUERY_TERMS_MAX,
    search_call_cost,
    search_rows,
    within_query_terms,
)
from app.ops.working_memory import BLOCK_KEY_MAX, render_blocks
from app.registry import Call, op
from app.schemas.common import Answer, StrictInt
from app.schemas.rules import terms_within
from app.store.identity import Identity
from app.store.memory import MemoryRow
from app.store.working_memory import Block, WorkingMemoryStore

DEFAULT_SECTION_CHARS = 16384
# The most a section may be given: several blocks at their 16,384-character cap, or a handful
# of profile sections at theirs. A pack is a prompt fragment, not an export.
MAX_SECTION_CHARS = 262144
SESSION_NOTE_PREFIX = "session:"
SEPARATORS = {"xml": "\n", "markdown": "\n\n"}
NO_QUERY_SECTIONS = (
    "No query: the pack is working memory and the profile, with no query-dependent section."
)
# The most facts the query's section ranks before its budget keeps what fits.
QUERY_HITS = 10
DEFAULT_MEMORY_CHARS = 8192
_WHO = {"namespace": "support", "agent": "triage-bot", "user_id": "u-42", "run_id": "run-7"}

Item = TypeVar("Item")


def _session_note(value: str) -> None:
    if not value.startswith(SESSION_NOTE_PREFIX) or value == SESSION_NOTE_PREFIX:
        raise ValidationError("must be a session note's block key: session:<project>")


def _budget(description: str) -> StrictInt:
    return StrictInt(
        load_default=DEFAULT_SECTION_CHARS,
        validate=validate.Range(min=0, max=MAX_SECTION_CHARS),
        metadata={"description": description},
    )


class ContextPackArgs(ProfileRenderArgs):
    """profile.render's fields (format, labels, scope, read_scope), and the pack's own."""

    # The query is searched as memory.search's is: its distinct terms are bounded alike.
    OPENAPI_RULES: ClassVar[dict[str, Any]] = {"x-loom-rules": [
        terms_within("query", QUERY_TERMS_MAX)]}

    query = fields.String(
        load_default="",
        validate=[validate.Length(max=QUERY_MAX), within_query_terms],
        metadata={
            "description": "The question the pack is for: the facts memory.search finds for "
            f"it follow the stable prefix (the memories section); {QUERY_DESCRIPTION}."
        },
    )
    session_block = fields.String(
        load_default=None,
        validate=[validate.Length(max=BLOCK_KEY_MAX), _session_note],
        metadata={
            "pattern": r"^session:[\s\S]",
            "description": "This project's note, e.g. session:projectA: the agent layer's "
            "other session:* blocks are left out."
        },
    )
    working_memory_chars = _budget(
        "Character budget of the working-memory section (default 16384, 0 to 262144); "
        "blocks that do not fit are dropped whole."
    )
    profile_chars = _budget(
        "Character budget of the profile section (default 16384, 0 to 262144); sections "
        "that do not fit are dropped whole."
    )
    memory_chars = StrictInt(
        load_default=DEFAULT_MEMORY_CHARS,
        validate=validate.Range(min=0, max=MAX_SECTION_CHARS),
        metadata={"description": "Character budget of the query's memories section (default "
                  "8192, 0 to 262144); facts that do not fit are dropped whole."},
    )


class PackItem(Schema):
    layer = fields.String(
        metadata={"description": "Working memory: run, session or agent."}
    )
    block_key = fields.String(metadata={"description": "Working memory: the block."})
    label = fields.String(metadata={"description": "Profile: the section's label."})
    agent = fields.String(metadata={"description": "Profile: the agent that wrote it."})
    memory_id = fields.String(metadata={"description": "Memories: the fact."})
    key = fields.String(metadata={"description": "Memories: the fact's key."})
    chars = fields.Integer(metadata={"description": "Its length as rendered."})


class PackSection(Schema):
    name = fields.String(metadata={"description": "working_memory, profile or memories."})
    chars = fields.Integer(metadata={"description": "The section's length in the pack."})
    budget = fields.Integer()
    blocks = fields.List(
        fields.Nested(PackItem), metadata={"description": "Working memory: blocks kept."}
    )
    labels = fields.List(
        fields.String(), metadata={"description": "Profile: labels kept, in pack order."}
    )
    memories = fields.List(
        fields.Nested(PackItem), metadata={"description": "Memories: facts kept, best first."}
    )
    dropped = fields.List(
        fields.Nested(PackItem), metadata={"description": "Left out whole for the budget."}
    )


class ContextPacked(Answer):
    pack = fields.String()
    sections = fields.List(fields.Nested(PackSection))
    stable_prefix_chars = fields.Integer(
        metadata={"description": "Length of the working-memory + profile prefix, which no "
                  "query changes."}
    )
    stable_hash = fields.String(
        metadata={"description": "sha256 hex of that prefix: equal across questions."}
    )
    total_chars = fields.Integer()
    query_sections = fields.List(
        fields.Nested(PackSection),
        metadata={"description": "The sections that depend on query (memories), after the "
                  "prefix; empty without a query."}
    )
    notes = fields.List(fields.String())


def fit(
    items: Sequence[Item], render: Callable[[Item], str], separator: str, budget: int
) -> tuple[list[tuple[Item, int]], list[tuple[Item, int]]]:
    """Keep items in order while they fit the budget; one that does not is dropped whole.

    Returns (kept, dropped), each item with its rendered length. The lengths add up exactly:
    a section's text is its kept items' renders joined by ``separator``.
    """
    kept: list[tuple[Item, int]] = []
    dropped: list[tuple[Item, int]] = []
    used = 0
    for item in items:
        size = len(render(item))
        cost = size + (len(separator) if kept else 0)
        if used + cost <= budget:
            kept.append((item, size))
            used += cost
        else:
            dropped.append((item, size))
    return kept, dropped


def layers(identity: Identity) -> list[tuple[str, Identity]]:
    """The working-memory scopes a pack reads, narrowest first, each once."""
    found: list[tuple[str, Identity]] = []
    if identity.run_id != "-":
        found.append(("run", identity))
    # Without a session_id, the session layer is the agent layer: it is read once, as that.
    if identity.session_id != "-":
        found.append(("session", identity.with_(run_id="-")))
    found.append(("agent", identity.with_(session_id="-", run_id="-")))
    return found


def _kept_by_session_block(name: str, block: Block, session_block: str | None) -> bool:
    if session_block is None or name != "agent":
        return True
    return not block.block_key.startswith(SESSION_NOTE_PREFIX) or block.block_key == session_block


def _working_memory(call: Call, read_scope: str, style: str) -> tuple[str, dict[str, Any]]:
    a, identity = call.args, call.identity
    store = call.services.store(WorkingMemoryStore)
    candidates: list[tuple[str, Block]] = []
    for name, scope in layers(identity):
        # A layer outside the read scope (the agent layer for a token bound to one session)
        # is not read, as a memory row of that (user, session) would not be.
        if not row_visible(read_scope, identity, scope.user_id, scope.session_id):
            continue
        candidates.extend(
            (name, block)
            for block in store.blocks(scope)
            if _kept_by_session_block(name, block, a["session_block"])
        )
    separator = SEPARATORS[style]
    kept, dropped = fit(
        candidates,
        lambda item: render_blocks([item[1]], style),
        separator,
        a["working_memory_chars"],
    )
    text = render_blocks([block for (_, block), _ in kept], style)

    def described(entries: list[tuple[tuple[str, Block], int]]) -> list[dict[str, Any]]:
        return [
            {"layer": name, "block_key": block.block_key, "chars": size}
            for (name, block), size in entries
        ]

    return text, {
        "name": "working_memory",
        "chars": len(text),
        "budget": a["working_memory_chars"],
        "blocks": described(kept),
        "dropped": described(dropped),
    }


def _profile(call: Call, read_scope: str, style: str) -> tuple[str, dict[str, Any]]:
    a = call.args
    rows = sections_in_scope(call, read_scope, a["scope"], a["labels"])
    kept, dropped = fit(
        rows, lambda row: render_sections([row], style), SEPARATORS[style], a["profile_chars"]
    )
    text = render_sections([row for row, _ in kept], style)
    return text, {
        "name": "profile",
        "chars": len(text),
        "budget": a["profile_chars"],
        "labels": [row.key for row, _ in kept],
        "dropped": [
            {"label": row.key, "agent": row.agent, "chars": size} for row, size in dropped
        ],
    }


def _escaped(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render_memories(rows: list[MemoryRow], style: str) -> str:
    if style == "markdown":
        return "\n".join(f"- {row.key}: {section_text(row)}" for row in rows)
    return "\n".join(
        f'<memory key="{_escaped(row.key).replace(chr(34), "&quot;")}" '
        f'memory_id="{row.memory_id}">{_escaped(section_text(row))}</memory>'
        for row in rows
    )


def _memories(call: Call, read_scope: str, style: str) -> tuple[str, dict[str, Any]]:
    a = call.args
    rows = [row for row, _hit in search_rows(call, a["query"], QUERY_HITS, read_scope)]
    kept, dropped = fit(
        rows, lambda row: render_memories([row], style), "\n", a["memory_chars"]
    )
    text = render_memories([row for row, _ in kept], style)

    def described(entries: list[tuple[MemoryRow, int]]) -> list[dict[str, Any]]:
        return [{"memory_id": row.memory_id, "key": row.key, "chars": size}
                for row, size in entries]

    return text, {
        "name": "memories",
        "chars": len(text),
        "budget": a["memory_chars"],
        "memories": described(kept),
        "dropped": described(dropped),
    }


@op("context.pack", role="viewer", kind="read",
    cost=search_call_cost,
    args=ContextPackArgs, answer=ContextPacked,
    example={**_WHO, "query": "refund policy", "format": "xml", "read_scope": "own_user"})
def context_pack(call: Call) -> dict[str, Any]:
    """Working memory, then the profile, then the query's facts, with a stable prefix."""
    a = call.args
    style = a["format"]
    read_scope = read_scope_for(call, a["read_scope"])
    memory_text, memory_section = _working_memory(call, read_scope, style)
    profile_text, profile_section = _profile(call, read_scope, style)
    record_profile_read(call, "context.pack")
    separator = SEPARATORS[style]
    prefix = separator.join(text for text in (memory_text, profile_text) if text)
    query_sections: list[dict[str, Any]] = []
    notes: list[str] = []
    pack = prefix
    if a["query"].strip():
        query_text, query_section = _memories(call, read_scope, style)
        query_sections.append(query_section)
        # The query's section follows the prefix; the prefix stays byte for byte the same.
        pack = separator.join(text for text in (prefix, query_text) if text)
    else:
        notes.append(NO_QUERY_SECTIONS)
    return {
        "pack": pack,
        "sections": [memory_section, profile_section],
        "stable_prefix_chars": len(prefix),
        "stable_hash": hashlib.sha256(prefix.encode("utf-8")).hexdigest(),
        "total_chars": len(pack),
        "query_sections": query_sections,
        "notes": notes,
    }
