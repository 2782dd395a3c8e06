"""The op registry: ``@op``, through which each Loom op is declared exactly once, and the
``REGISTRY`` the declarations fill.

The op modules (``app/ops/<plane>.py``) declare the ops and import this module; it imports none
of them (``app.ops.load_ops`` imports them all and answers the complete registry). A declaration
carries the op's name, role, kind, whether the MCP ``all`` toolset lists it, its
input and output schemas and its handler. The HTTP routes and OpenAPI document
(``app.api``), the MCP server (``loom.mcp_server``) and the SDK's generated methods
(``loom.client``) are all derived from ``REGISTRY``, so adding an op touches one place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from marshmallow import Schema

from app.error_catalogue import BY_CODE as ERROR_CODES
from app.principal import ROLE_RANK, Principal, Role

if TYPE_CHECKING:
    from app.services import Services
    from app.store.idempotency import HeldKey
    from app.store.identity import Identity

Kind = Literal["read", "write", "idempotent"]


@dataclass
class Call:
    """One invocation of an op, as a handler sees it: parsed args, resolved identity, services."""

    op: Op
    args: dict[str, Any]
    identity: Identity
    principal: Principal
    services: Services
    # The reading client's name (X-Loom-Client, else User-Agent); a callable is read only when
    # a handler asks, since most ops never do.
    client_source: str | Callable[[], str] = ""
    # Whether the console runs this call in its own process (``app.console.run``). Only the
    # server sets it: no header can, so no client can read a profile unrecorded.
    by_console: bool = False
    # What one step of the handler computed for a later one (the query's embedding, which
    # loom_search's fact and profile legs share): lives and dies with the call.
    memo: dict[str, Any] = field(default_factory=dict)
    # The Idempotency-Key this call holds, for an op with a ``replay``: its one write script
    # keeps the answer in the key's record in the same step (app/idempotency.py).
    held_key: HeldKey | None = None

    @property
    def client(self) -> str:
        if callable(self.client_source):
            self.client_source = self.client_source()
        return self.client_source


Handler = Callable[[Call], dict[str, Any]]


@dataclass(frozen=True)
class Op:
    name: str
    role: Role
    kind: Kind
    listed: bool
    args: type[Schema]
    answer: type[Schema]
    handler: Handler
    summary: str
    # Agent state keeps its REST paths and is never an MCP tool (seed 002).
    http_method: str = "POST"
    path: str | None = None
    mcp: bool = True
    # Namespace-wide ops (schemas, features) need no agent; org-wide ops (tokens, usage)
    # need no namespace either.
    needs_agent: bool = True
    needs_namespace: bool = True
    # Ops on one user's data (erasure, export, a structured profile) need a user_id other
    # than '-' (or, when a field's name is given, that field instead); the OpenAPI document
    # lists it as required where no token can fill it.
    needs_user: bool | str = False
    # An op on the whole org (its model-call switch) needs a token reaching every namespace.
    org_wide: bool = False
    # A valid body for this op: the OpenAPI example, and what the auth matrix sends.
    example: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    # Error codes this op answers beyond those every op (or every write) can meet, from
    # ``app.error_catalogue``; its OpenAPI responses list them with their statuses.
    raises: tuple[str, ...] = ()
    # For a write whose one script keeps its reply as the Idempotency-Key's answer in the same
    # step (the memory writes): the answer again from that reply. A try of such an op that
    # ended without an answer left either the reply or nothing applied, never a doubt.
    replay: Callable[[Call, str], dict[str, Any]] | None = None
    # What one call costs against the caller's request budget, in requests, for an op whose
    # Redis work grows with its body (a search: app.search_cost); None costs one request.
    cost: Callable[[Call], int] | None = None
    # The hash tag of the subject an Idempotency-Key's record of this op lives under, when it
    # is not the caller's identity's user (an agent-state scope): the slot of the write's keys.
    keyed_in: Callable[[Call], str] | None = None
    # For a write whose effect is one by construction, so that a try cut without an answer
    # is simply run again by its retry (user.erase starts, or finds, the user's one erasure,
    # and enqueues its job in the queue's Redis, outside any step of the data's).
    reruns: bool = False
    # The MCP tool's name where the seed gives one (memory.unified_search is ``loom_search``);
    # otherwise ``loom_<op with . as _>``.
    tool: str | None = None

    @property
    def plane(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def method(self) -> str:
        return self.name.split(".", 1)[1]

    @property
    def http_path(self) -> str:
        return self.path or f"/v1/{self.name}"

    @property
    def mcp_name(self) -> str:
        return self.tool or "loom_" + self.name.replace(".", "_")


class OpRegistry:
    def __init__(self) -> None:
        self._ops: dict[str, Op] = {}

    def add(self, declared: Op) -> Op:
        if declared.name in self._ops:
            raise ValueError(f"op {declared.name} is declared twice")
        if declared.role not in ROLE_RANK:
            raise ValueError(f"op {declared.name}: unknown role {declared.role}")
        if any(other.mcp_name == declared.mcp_name for other in self._ops.values()):
            raise ValueError(f"op {declared.name}: MCP tool {declared.mcp_name} is taken")
        unknown = sorted(set(declared.raises) - set(ERROR_CODES))
        if unknown:
            raise ValueError(f"op {declared.name} raises codes not in the catalogue: {unknown}")
        self._ops[declared.name] = declared
        return declared

    def get(self, name: str) -> Op | None:
        return self._ops.get(name)

    def __iter__(self) -> Iterator[Op]:
        return iter(sorted(self._ops.values(), key=lambda declared: declared.name))

    def __len__(self) -> int:
        return len(self._ops)

    def __contains__(self, name: object) -> bool:
        return name in self._ops

    def planes(self) -> dict[str, list[Op]]:
        grouped: dict[str, list[Op]] = {}
        for declared in self:
            grouped.setdefault(declared.plane, []).append(declared)
        return grouped


REGISTRY = OpRegistry()


def op(
    name: str,
    *,
    role: Role,
    kind: Kind,
    args: type[Schema],
    answer: type[Schema],
    listed: bool = True,
    **options: Any,
) -> Callable[[Handler], Handler]:
    """Declare an op; the handler's docstring first line becomes its summary."""

    def register(handler: Handler) -> Handler:
        summary = (handler.__doc__ or name).strip().splitlines()[0]
        REGISTRY.add(
            Op(
                name=name,
                role=role,
                kind=kind,
                listed=listed,
                args=args,
                answer=answer,
                handler=handler,
                summary=summary,
                **options,
            )
        )
        return handler

    return register
