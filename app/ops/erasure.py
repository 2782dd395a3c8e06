"""Erasure and the data package: user.erase, erasure.status, subject.export.

``user.erase`` (admin) starts the erasure saga of ``app.store.erasure`` for one user of a
namespace and answers at once: the receipt with status ``running``. From that answer on, every
write for the user is refused 409 ``USER_BEING_ERASED``; an RQ worker runs the steps (the job's
arguments name the erasure id, never the user: a queued job naming the user is one of the
things an erasure removes). Asked again while the run is due, it answers that run's receipt.
A receipt with status ``failed`` (the census found data, for example a row a racing build
wrote) is retryable: calling user.erase again enqueues the run again. A run whose worker died
reads ``interrupted`` and is enqueued again by the resume pass (or by user.erase).

``erasure.status`` (admin) reads the receipt by the user id or by the receipt's
``erasure_id``: status, the steps done of the total and the current one, counts, census, times.
``subject.export`` is the data package, for an admin or for a token pinned to that user (an
end user's own token). None of them is an MCP tool: erasure and export are governance acts done
from code, the console or the ``flask loom`` commands, never by a model.
"""

from __future__ import annotations

from typing import Any

from marshmallow import fields, validate

from app.errors import AuthInsufficient, ErasureNotFound, IdentityIncomplete
from app.registry import Call, op
from app.schemas.common import Answer, IdentityArgs, IdentityText
from app.scope_ids import handle_pattern
from app.store.erasure import KINDS, MAX_HANDLES, STEPS, ErasureStore, SubjectExportStore

_WHO = {"namespace": "support", "user_id": "u-42"}


class UserArgs(IdentityArgs):
    """org, namespace and the user: these ops act on everything of one user."""

    class Meta(IdentityArgs.Meta):
        exclude = ("agent", "session_id", "run_id")


def _handles_field() -> fields.List:
    return fields.List(
        # What app.scope_ids.canonical_subject takes, as an identity text (no control
        # characters).
        IdentityText(metadata={"pattern": handle_pattern(control_free=True)}),
        load_default=list,
        validate=validate.Length(max=MAX_HANDLES),
        metadata={
            "description": "The customer's other handles (email, international phone, "
            "customer id) whose agent states are theirs too; the user id is always one. "
            "Never stored."
        },
    )


class UserEraseArgs(UserArgs):
    handles = _handles_field()


class ErasureStatusArgs(UserArgs):
    erasure_id = fields.String(
        load_default=None,
        validate=validate.Regexp(r"^[0-9a-f]{64}$", error="must be a receipt's erasure_id"),
        metadata={"description": "The receipt's id; or give user_id instead."},
    )


class SubjectExportArgs(UserArgs):
    handles = _handles_field()


class CensusAnswer(Answer):
    clean = fields.Boolean()
    found = fields.Dict(keys=fields.String(), values=fields.Integer())
    checked_at = fields.String(allow_none=True)


class ErasureReceipt(Answer):
    erasure_id = fields.String(metadata={"description": "A keyed hash: not the user id."})
    status = fields.String(
        metadata={"description": "running, done, failed (retryable) or interrupted "
                  "(retryable)."}
    )
    retryable = fields.Boolean()
    step = fields.String(metadata={"description": "The last step finished."})
    current_step = fields.String(
        metadata={"description": "The step a running erasure is on (empty once it ended): "
                  + ", ".join(STEPS) + ", then finishing."})
    steps_done = fields.Integer(metadata={"description": "Steps finished of steps_total."})
    steps_total = fields.Integer()
    attempts = fields.Integer()
    started_at = fields.String(allow_none=True)
    finished_at = fields.String(allow_none=True)
    updated_at = fields.String(allow_none=True)
    counts = fields.Dict(
        keys=fields.String(), values=fields.Integer(),
        metadata={"description": "What the erasure removed: " + ", ".join(KINDS) + "."},
    )
    census = fields.Nested(CensusAnswer, allow_none=True)
    aof_rewrite = fields.String(
        metadata={"description": "off, scheduled or failed (LOOM_ERASURE_REWRITE_AOF)."}
    )
    error = fields.String()


class SubjectExport(Answer):
    format = fields.String()
    org = fields.String()
    namespace = fields.String()
    user_id = fields.String()
    exported_at = fields.String()
    memory_rows = fields.List(fields.Dict(), metadata={"description": "Rows with versions."})
    profile_sections = fields.List(fields.Dict())
    profile_section_vectors = fields.List(fields.Dict(), metadata={
        "description": "The vectors loom_search's profile leg keeps of the sections: "
                       "memory_id, fingerprint and vector."})
    structured_profile = fields.Dict(allow_none=True)
    working_memory = fields.List(fields.Dict())
    agent_states = fields.List(fields.Dict(), metadata={"description": "By declared field."})
    profile_reads = fields.List(fields.Dict())
    counts = fields.Dict(keys=fields.String(), values=fields.Integer())


def _store(call: Call) -> ErasureStore:
    return call.services.store(ErasureStore)


def _handles_in_reach(call: Call, user_id: str) -> list[str]:
    """The body's handles; a token pinned to a user may name only that user's own id.

    An end user's token proves who they are, not which emails or phones are theirs: a handle
    other than their own id could be anyone's, so only a token that is not pinned names them."""
    handles: list[str] = call.args["handles"]
    if call.principal.read_user_id is None:
        return handles
    identity = call.identity
    store = _store(call)
    own = {digest for _h, digest in store.subject_digests(identity.org, identity.namespace,
                                                          user_id)}
    for i, handle in enumerate(handles):
        digest = store.agent_states.subject_digest(identity.org, identity.namespace, handle,
                                                   path=f"handles.{i}")
        if digest not in own:
            raise AuthInsufficient("a token pinned to a user names no other handle than its "
                                   "user's id", field=f"handles.{i}")
    return handles


def _named_user(call: Call) -> str:
    user_id = call.identity.user_id
    if user_id == "-":
        raise IdentityIncomplete("user_id is required: the user whose data this is",
                                 field="user_id")
    return user_id


@op("user.erase", role="admin", kind="idempotent", listed=False, mcp=False,
    raises=("ERASURE_RUNNING",),
    args=UserEraseArgs, answer=ErasureReceipt, needs_agent=False, needs_user=True, example=_WHO,
    reruns=True)
def user_erase(call: Call) -> dict[str, Any]:
    """Erase everything of one user of a namespace in the background; answers at once (running).

    A worker runs the saga and its census; follow it with erasure.status."""
    identity = call.identity
    user_id = _named_user(call)
    return _store(call).start(
        identity.org, identity.namespace, user_id,
        actor=call.principal.actor, handles=_handles_in_reach(call, user_id),
    )


@op("erasure.status", role="admin", kind="read", listed=False, mcp=False,
    raises=("ERASURE_NOT_FOUND",),
    args=ErasureStatusArgs, answer=ErasureReceipt, needs_agent=False,
    needs_user="erasure_id", example=_WHO)
def erasure_status(call: Call) -> dict[str, Any]:
    """Read an erasure's receipt, by user_id or erasure_id: progress, counts, census, times."""
    identity = call.identity
    given = call.args["erasure_id"]
    store = _store(call)
    if given is None:
        given = store.erasure_id(identity.org, identity.namespace, _named_user(call))
    elif identity.user_id != "-" and given != store.erasure_id(
        identity.org, identity.namespace, identity.user_id
    ):
        # Both name a user: an id that is not this user's erasure names none of theirs.
        raise ErasureNotFound("no erasure of this user_id has this erasure_id",
                              erasure_id=given)
    return store.status(identity.org, identity.namespace, given)


@op("subject.export", role="viewer", kind="read", listed=False, mcp=False,
    args=SubjectExportArgs, answer=SubjectExport, needs_agent=False, needs_user=True, example=_WHO)
def subject_export(call: Call) -> dict[str, Any]:
    """The user's data package: rows with versions, blocks, profiles, agent states by field."""
    principal, identity = call.principal, call.identity
    user_id = _named_user(call)
    if principal.session_id:
        raise AuthInsufficient("a data package spans the user's sessions; a token bound to "
                               "one session cannot read it", field="session_id")
    if not principal.reaches_role("admin") and principal.read_user_id != user_id:
        raise AuthInsufficient("subject.export needs the admin role or a token pinned to "
                               "this user", required_role="admin")
    store = _store(call)
    handles = _handles_in_reach(call, user_id)
    subjects = [handle for handle, _digest in
                store.subject_digests(identity.org, identity.namespace, user_id, handles)]
    package = call.services.store(SubjectExportStore).export(
        identity.org, identity.namespace, user_id, subjects=subjects)
    if not (principal.reaches_role("writer") and principal.has_scope("agent_state")):
        # Agent-state content is read with the writer role and the agent_state scope, through
        # the export as directly; without them the package lists the states, not their values.
        for state in package["agent_states"]:
            for spec in state["fields"].values():
                spec.pop("value", None)
    return package
