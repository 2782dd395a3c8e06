"""The agent-state ops (seed 002): write, read, the console's view of a profile, erase a scope.

Agent state is written by code, never by a model: none of these ops is an MCP tool, and no
render or pack reads the plane. The scope travels in the body (a conversation id can look like
a phone number), never in a URL; only the console view takes a profile id in its path, as the
seed defines it. With auth on, the key needs the ``agent_state`` scope. Writes and reads need
the namespace's ``agent_state`` feature on (403 ``FEATURE_DISABLED`` otherwise); the console
view and erasure work with the feature off, so governance can always see and remove what is
stored.
"""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, fields, validate

from app.clock import iso_from_ns
from app.errors import AuthInsufficient, ValidationFailed
from app.json_patterns import NOT_BLANK_PATTERN
from app.ops.namespace_config import NamespaceArgs
from app.registry import Call, op
from app.schemas.common import Answer, IdentityArgs, IdentityText, StrictInt, VersionText
from app.scope_ids import (
    HANDLE_PATTERN,
    MAX_SCOPE_ID_LENGTH,
    OBJECT_ID_PATTERN,
    SCOPE_KINDS,
    canonical_scope,
    handle_pattern,
)
from app.store import keys
from app.store.agent_state import AgentStateStore
from app.store.idempotency import kept_reply

SCOPE = "agent_state"
_WHO = {
    "namespace": "shop",
    "agent": "shop_guide",
    "scope": {"kind": "conversation", "id": "conv-8c1e"},
}


def _scope_field(description: str) -> fields.Dict:
    return fields.Dict(required=True, metadata={
        "description": description,
        # What app.scope_ids checks of every kind, then the id rules of each kind (the kinds
        # exclude each other, so anyOf says what oneOf would), and no other member. Left
        # open, schemathesis's coverage phase drew any-value members beside the per-kind rule
        # and crashed CPython 3.11.7's parser (a crash, not a finding).
        "required": ["kind", "id"],
        "properties": {
            "kind": {"type": "string", "enum": list(SCOPE_KINDS)},
            # Not blank as str.strip() reads it (app.scope_ids), Python's whitespace spelled out.
            "id": {"type": "string", "minLength": 1, "maxLength": MAX_SCOPE_ID_LENGTH,
                   "pattern": NOT_BLANK_PATTERN},
        },
        "anyOf": [
            {"properties": {"kind": {"enum": ["conversation", "task"]}}},
            {"properties": {"kind": {"enum": ["object"]},
                            "id": {"pattern": OBJECT_ID_PATTERN}}},
            {"properties": {"kind": {"enum": ["subject"]}, "id": {"pattern": HANDLE_PATTERN}}},
        ],
        "additionalProperties": False,
    })


def _handle_schema() -> dict[str, Any]:
    """A customer handle as ``app.scope_ids.canonical_subject`` takes one."""
    return {"minLength": 1, "maxLength": MAX_SCOPE_ID_LENGTH, "pattern": HANDLE_PATTERN}


class AgentStateArgs(IdentityArgs):
    """org, namespace, agent and the scope: a state has no user, session or run."""

    class Meta(IdentityArgs.Meta):
        exclude = ("user_id", "session_id", "run_id")

    scope = _scope_field(
        '{"kind": "conversation"|"task"|"object"|"subject", "id": "..."}: what the state '
        "belongs to. An object id is <type>:<id>; a subject id is one of the customer's handles."
    )


class AgentStatePutArgs(AgentStateArgs):
    # cas needs if_version (a number: 0 for "must not exist"); merge_by_key, the default, may
    # leave it out. A subject-scoped state's customer is its scope's id: subject is left out.
    OPENAPI_RULES = {"allOf": [
        {"anyOf": [
            {"properties": {"mode": {"enum": ["merge_by_key", None]}}},
            {"required": ["if_version"], "properties": {"if_version": {"type": "integer"}}},
        ]},
        {"anyOf": [
            {"properties": {"scope": {"properties": {"kind": {"not": {"enum": ["subject"]}}}}}},
            {"properties": {"subject": {"enum": [None]}}},
        ]},
    ]}

    mode = fields.String(
        load_default="merge_by_key",
        validate=validate.OneOf(["merge_by_key", "cas"]),
        metadata={"description": "merge_by_key (default): named fields replaced whole; "
                  "cas: body is the whole new state."},
    )
    if_version = StrictInt(
        load_default=None,
        allow_none=True,
        validate=validate.Range(min=0),
        metadata={"description": "Apply only at this version (0: the state must not exist). "
                  "Required with cas."},
    )
    body = fields.Dict(
        required=True,
        metadata={"description": 'The fields to write; {"$delete": true} removes one '
                  "(merge_by_key)."},
    )
    subject = fields.String(
        load_default=None,
        allow_none=True,
        metadata={"description": "A handle of the customer the state is about, when the scope "
                  "does not name them (kept only as a keyed hash).", **_handle_schema()},
    )


class AgentStateProfileArgs(NamespaceArgs):
    # An identity text (1 to 256 characters, as a user id is): in a URL path, so that a GET
    # with its identity at the documented limits fits gunicorn's request line.
    profile_id = IdentityText(
        required=True,
        metadata={"description": "The subject: a user id or one of the customer's handles.",
                  "pattern": handle_pattern(control_free=True)},
    )


class AgentStateEraseArgs(NamespaceArgs):
    scope = _scope_field('{"kind", "id"}: the scope whose states are erased, for every agent.')


class AgentStateWritten(Answer):
    stored = fields.Boolean()
    version = fields.Integer()
    version_text = VersionText()
    reason = fields.String(
        allow_none=True, metadata={"description": "not_declared_field or over_cap when not "
                                   "stored; null when stored."}
    )


class AgentStateRead(Answer):
    body = fields.Dict()
    version = fields.Integer()
    version_text = VersionText()
    updated_at = fields.String(allow_none=True)


class AgentStateSummary(Schema):
    scope_kind = fields.String()
    agent = fields.String()
    type = fields.String()
    size_bytes = fields.Integer()
    version = fields.Integer()
    version_text = VersionText()
    created_at = fields.String()
    updated_at = fields.String()


class AgentStateOfProfile(Answer):
    states = fields.List(fields.Nested(AgentStateSummary))
    count = fields.Integer()


class AgentStateErased(Answer):
    erased = fields.Integer()


def _store(call: Call) -> AgentStateStore:
    return call.services.store(AgentStateStore)


def _reach(call: Call) -> str | None:
    """The subject digest a pinned token reaches (its user read as a customer handle), or
    None for a token that is not pinned. A pin that is no valid handle reaches no state."""
    pinned = call.principal.read_user_id
    if pinned is None:
        return None
    identity = call.identity
    try:
        return _store(call).subject_digest(identity.org, identity.namespace, pinned)
    except ValidationFailed:
        return ""


def _require_scope(call: Call) -> None:
    if not call.principal.has_scope(SCOPE):
        raise AuthInsufficient(
            "agent state needs a key with the agent_state scope", required_scope=SCOPE
        )


def _scope_slot(call: Call) -> str:
    """The hash tag of the scope a call writes: where its Idempotency-Key's record lives."""
    identity = call.identity
    kind, canonical_id = canonical_scope(call.args["scope"], identity.namespace)
    digest = _store(call).scope_digest(identity.org, identity.namespace, kind, canonical_id)
    return keys.agent_state_tag(identity.org, identity.namespace, digest)


@op("agent_state.put", role="writer", kind="write", args=AgentStatePutArgs,
    raises=("FEATURE_DISABLED", "agent_state_conflict", "WRITE_CONFLICT", "USER_BEING_ERASED"),
    answer=AgentStateWritten, http_method="PUT", path="/v1/agent-state", mcp=False,
    keyed_in=_scope_slot,
    replay=lambda _call, kept: AgentStateStore.written_of(kept_reply(kept)).as_answer(),
    example={**_WHO, "mode": "merge_by_key", "body": {"step": "sizes", "offer": "familia-plus"}})
def agent_state_put(call: Call) -> dict[str, Any]:
    """Write an agent's typed state by compare-and-swap or merge by key."""
    _require_scope(call)
    a, identity = call.args, call.identity
    kind, canonical_id = canonical_scope(a["scope"], identity.namespace)
    result = _store(call).put(
        identity.org,
        identity.namespace,
        identity.agent,
        kind,
        canonical_id,
        mode=a["mode"],
        if_version=a["if_version"],
        body=a["body"],
        subject=a["subject"],
        reach=_reach(call),
        held=call.held_key,
    )
    return result.as_answer()


@op("agent_state.read", role="writer", kind="read", args=AgentStateArgs,
    raises=("FEATURE_DISABLED",),
    answer=AgentStateRead, path="/v1/agent-state/read", mcp=False, example=_WHO)
def agent_state_read(call: Call) -> dict[str, Any]:
    """Read an agent's state: body, version and updated_at (empty at version 0 when none)."""
    _require_scope(call)
    identity = call.identity
    kind, canonical_id = canonical_scope(call.args["scope"], identity.namespace)
    state = _store(call).read(
        identity.org, identity.namespace, identity.agent, kind, canonical_id, reach=_reach(call)
    )
    return {
        "body": state.body,
        "version": state.version,
        "version_text": str(state.version),
        "updated_at": None if state.updated_at is None else iso_from_ns(state.updated_at),
    }


@op("agent_state.of_profile", role="viewer", kind="read", args=AgentStateProfileArgs,
    raises=("FEATURE_DISABLED",),
    answer=AgentStateOfProfile, http_method="GET",
    path="/v1/profiles/<profile_id>/agent-state", mcp=False, needs_agent=False,
    example={"namespace": "shop", "profile_id": "cust-42"})
def agent_state_of_profile(call: Call) -> dict[str, Any]:
    """List the states naming a profile: kind, agent, type, size, version, dates; no content."""
    _require_scope(call)
    identity = call.identity
    reach = _reach(call)
    if reach is not None and reach != _store(call).subject_digest(
        identity.org, identity.namespace, call.args["profile_id"], path="profile_id"
    ):
        raise AuthInsufficient("this profile is outside this token's reach", field="profile_id")
    states = _store(call).states_of_subject(
        identity.org, identity.namespace, call.args["profile_id"]
    )
    return {"states": states, "count": len(states)}


@op("agent_state.erase", role="admin", kind="idempotent", args=AgentStateEraseArgs,
    raises=("FEATURE_DISABLED", "USER_BEING_ERASED"),
    answer=AgentStateErased, mcp=False, needs_agent=False, keyed_in=_scope_slot,
    replay=lambda _call, kept: {"erased": int(kept_reply(kept))},
    example={"namespace": "shop", "scope": {"kind": "conversation", "id": "conv-8c1e"}})
def agent_state_erase(call: Call) -> dict[str, Any]:
    """Erase one scope's states, for every agent; audited (kind and count, never the id)."""
    identity = call.identity
    kind, canonical_id = canonical_scope(call.args["scope"], identity.namespace)
    reach = _reach(call)
    if reach is not None and (kind != "subject" or reach != _store(call).scope_digest(
        identity.org, identity.namespace, kind, canonical_id
    )):
        # Other scopes hold states of many customers; a pinned token erases only its own.
        raise AuthInsufficient("a token pinned to a user erases only that user's subject "
                               "scope", field="scope")
    # Audited by the store in the erasing script's own step.
    erased = _store(call).erase_scope(identity.org, identity.namespace, kind, canonical_id,
                                      held=call.held_key, actor=call.principal.actor)
    return {"erased": erased}
