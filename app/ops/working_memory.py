"""The working_memory.* ops (seed 004): their schemas, and handlers over WorkingMemoryStore."""

from __future__ import annotations

from typing import Any, ClassVar

from marshmallow import Schema, fields, validate

from app.prompt_text import markdown_body, markdown_heading, xml_attribute, xml_text
from app.registry import Call, op
from app.schemas.common import Answer, IdentityArgs, StrictInt, no_control_characters
from app.schemas.fastload import fast_load
from app.schemas.rules import length_within
from app.store.idempotency import kept_reply
from app.store.working_memory import (
    DEFAULT_BLOCK_KEY,
    DEFAULT_CHAR_LIMIT,
    MAX_CHAR_LIMIT,
    WorkingMemoryStore,
)

BLOCK_KEY_MAX = 80
_WHO = {"namespace": "support", "agent": "triage-bot", "run_id": "run-7"}
RENDER_MAX_BLOCK_KEYS = 20


def _block_key(description: str) -> fields.String:
    return fields.String(
        load_default=DEFAULT_BLOCK_KEY,
        validate=[validate.Length(min=1, max=BLOCK_KEY_MAX), no_control_characters],
        metadata={"description": description},
    )


@fast_load
class WorkingMemorySetArgs(IdentityArgs):
    # The char_limit beside the content caps it, as the OpenAPI document states it.
    OPENAPI_RULES: ClassVar[dict[str, Any]] = {"x-loom-rules": [
        length_within("content", "char_limit", DEFAULT_CHAR_LIMIT, "characters")]}

    block_key = _block_key("The block to write, within the caller's scope.")
    content = fields.String(
        load_default="", metadata={"description": "The block's whole new text."}
    )
    char_limit = StrictInt(
        load_default=DEFAULT_CHAR_LIMIT,
        validate=validate.Range(min=1, max=MAX_CHAR_LIMIT),
        metadata={
            "description": "The block's size cap in characters (default 4096, at most 16384); "
            "a set without it gives the block the default cap."
        },
    )


@fast_load
class WorkingMemoryAppendArgs(IdentityArgs):
    block_key = _block_key("The block to append to; a missing block is created.")
    addition = fields.String(required=True, metadata={"description": "Text added at the end."})
    separator = fields.String(
        load_default="\n",
        metadata={"description": "Put between the existing text and addition."},
    )


@fast_load
class WorkingMemoryReplaceArgs(IdentityArgs):
    block_key = _block_key("The block to edit; a missing block is a 404.")
    old = fields.String(
        required=True,
        validate=validate.Length(min=1),
        metadata={"description": "Text to find; every occurrence is replaced."},
    )
    new = fields.String(
        load_default="", metadata={"description": "Replacement text; empty deletes."}
    )


@fast_load
class WorkingMemoryKeyArgs(IdentityArgs):
    block_key = _block_key("The block to read or delete.")


@fast_load
class WorkingMemoryDeleteArgs(WorkingMemoryKeyArgs):
    """The delete's own schema: a write names one agent, a read may name '*' (the OpenAPI
    document says so per schema)."""


@fast_load
class WorkingMemoryRenderArgs(IdentityArgs):
    block_keys = fields.List(
        fields.String(validate=[validate.Length(min=1, max=BLOCK_KEY_MAX),
                                no_control_characters]),
        load_default=None,
        validate=validate.Length(max=RENDER_MAX_BLOCK_KEYS),
        metadata={"description": "Only these blocks (at most 20); empty = every live block."},
    )
    format = fields.String(load_default="xml", validate=validate.OneOf(["xml", "markdown"]))
    limit = StrictInt(load_default=20, validate=validate.Range(min=1, max=100))


@fast_load
class WorkingMemoryScopesArgs(IdentityArgs):
    class Meta(IdentityArgs.Meta):
        exclude = ("session_id", "run_id")


class WorkingMemoryScope(Schema):
    agent = fields.String()
    session_id = fields.String()
    run_id = fields.String()
    block_count = fields.Integer()


class WorkingMemoryScopes(Answer):
    scopes = fields.List(fields.Nested(WorkingMemoryScope))


class WorkingMemoryWrite(Answer):
    block_key = fields.String()
    version = fields.Integer()
    version_text = fields.String(metadata={"description": "version as decimal text: exact "
                                 "where a JSON number above 2^53 is not"})
    char_limit = fields.Integer()
    value_length = fields.Integer()
    fill_ratio = fields.Float()


class WorkingMemoryBlock(Schema):
    block_key = fields.String()
    content = fields.String()
    char_limit = fields.Integer()
    version = fields.Integer()
    version_text = fields.String(metadata={"description": "version as decimal text: exact "
                                 "where a JSON number above 2^53 is not"})
    updated_at = fields.String(allow_none=True)
    fill_ratio = fields.Float()


class WorkingMemoryGet(Answer, WorkingMemoryBlock):
    found = fields.Boolean()


class WorkingMemoryDeleted(Answer):
    deleted = fields.Boolean()
    block_key = fields.String()


class WorkingMemoryRendered(Answer):
    rendered = fields.String()
    blocks = fields.List(fields.Nested(WorkingMemoryBlock))
    block_count = fields.Integer()
    total_chars = fields.Integer()


def _store(call: Call) -> WorkingMemoryStore:
    return call.services.store(WorkingMemoryStore)


def _replayed_write(call: Call, kept: str) -> dict[str, Any]:
    """A keyed write's answer again from the script reply its Idempotency-Key's record kept."""
    return WorkingMemoryStore.write_of(call.args["block_key"], kept_reply(kept)).as_answer()


def _deleted(block_key: str, reply: Any) -> dict[str, Any]:
    return {"deleted": bool(reply), "block_key": block_key}


@op("working_memory.set", role="writer", kind="idempotent",
    raises=("WORKING_MEMORY_LIMIT_EXCEEDED", "USER_BEING_ERASED"),
    args=WorkingMemorySetArgs, answer=WorkingMemoryWrite, replay=_replayed_write,
    example={**_WHO, "block_key": "state", "content": "cursor: ticket 4812"})
def working_memory_set(call: Call) -> dict[str, Any]:
    """Overwrite one working-memory block."""
    a = call.args
    written = _store(call).set(call.identity, a["block_key"], a["content"], a["char_limit"],
                               held=call.held_key)
    return written.as_answer()


@op("working_memory.append", role="writer", kind="write",
    raises=("WORKING_MEMORY_LIMIT_EXCEEDED", "USER_BEING_ERASED"),
    args=WorkingMemoryAppendArgs, answer=WorkingMemoryWrite, replay=_replayed_write,
    example={**_WHO, "block_key": "state", "addition": "step 3 done"})
def working_memory_append(call: Call) -> dict[str, Any]:
    """Append text to a working-memory block, creating it when missing."""
    a = call.args
    written = _store(call).append(call.identity, a["block_key"], a["addition"], a["separator"],
                                  held=call.held_key)
    return written.as_answer()


@op("working_memory.replace", role="writer", kind="idempotent", listed=False,
    raises=("WORKING_MEMORY_BLOCK_NOT_FOUND", "SUBSTRING_NOT_FOUND",
            "WORKING_MEMORY_LIMIT_EXCEEDED", "USER_BEING_ERASED"),
    args=WorkingMemoryReplaceArgs, answer=WorkingMemoryWrite, replay=_replayed_write,
    example={**_WHO, "block_key": "state", "old": "4812", "new": "4813"})
def working_memory_replace(call: Call) -> dict[str, Any]:
    """Replace exact text inside a working-memory block."""
    a = call.args
    return _store(call).replace(call.identity, a["block_key"], a["old"], a["new"],
                                held=call.held_key).as_answer()


@op("working_memory.delete", role="writer", kind="idempotent", listed=False,
    raises=("USER_BEING_ERASED",),
    args=WorkingMemoryDeleteArgs, answer=WorkingMemoryDeleted,
    replay=lambda call, kept: _deleted(call.args["block_key"], kept_reply(kept)),
    example={**_WHO, "block_key": "state"})
def working_memory_delete(call: Call) -> dict[str, Any]:
    """Delete one working-memory block."""
    block_key = call.args["block_key"]
    return _deleted(block_key, _store(call).delete(call.identity, block_key, held=call.held_key))


@op("working_memory.get", role="viewer", kind="read", listed=False,
    args=WorkingMemoryKeyArgs, answer=WorkingMemoryGet,
    example={**_WHO, "block_key": "state"})
def working_memory_get(call: Call) -> dict[str, Any]:
    """Fetch one working-memory block by key."""
    block_key = call.args["block_key"]
    block = _store(call).get(call.identity, block_key)
    if block is None:
        return {
            "found": False,
            "block_key": block_key,
            "content": "",
            "char_limit": DEFAULT_CHAR_LIMIT,
            "version": 0,
            "version_text": "0",
            "updated_at": None,
            "fill_ratio": 0.0,
        }
    return {"found": True, **block.as_answer()}


def render_blocks(blocks: list[Any], style: str) -> str:
    """The blocks as one prompt fragment; context.pack renders its layers with this too."""
    if style == "markdown":
        return "\n\n".join(
            f"## {markdown_heading(block.block_key)}\n{markdown_body(block.content)}"
            for block in blocks
        )
    return "\n".join(
        f'<working-memory block="{xml_attribute(block.block_key)}">{xml_text(block.content)}'
        "</working-memory>"
        for block in blocks
    )


@op("working_memory.render", role="viewer", kind="read",
    args=WorkingMemoryRenderArgs, answer=WorkingMemoryRendered,
    example={**_WHO, "format": "xml"})
def working_memory_render(call: Call) -> dict[str, Any]:
    """Render working-memory blocks as XML or markdown."""
    a = call.args
    blocks = _store(call).blocks(call.identity, a["block_keys"], a["limit"])
    return {
        "rendered": render_blocks(blocks, a["format"]),
        "blocks": [block.as_answer() for block in blocks],
        "block_count": len(blocks),
        "total_chars": sum(len(block.content) for block in blocks),
    }



@op("working_memory.scopes", role="viewer", kind="read", listed=False, mcp=False,
    args=WorkingMemoryScopesArgs, answer=WorkingMemoryScopes, needs_agent=False,
    example={"namespace": "support", "user_id": "u-42"})
def working_memory_scopes(call: Call) -> dict[str, Any]:
    """List a user's working-memory scopes (agent, session, run) and block counts; no content."""
    identity, principal = call.identity, call.principal
    scopes = _store(call).scope_summaries(identity.org, identity.namespace, identity.user_id)
    # A token that fixes an agent or a session sees only its own scopes.
    visible = [
        scope for scope in scopes
        if principal.agent in (None, scope.agent)
        and principal.session_id in (None, scope.session_id)
    ]
    return {"scopes": [scope.as_answer() for scope in visible]}
