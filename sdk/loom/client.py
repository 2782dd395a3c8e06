"""``bot.client.<plane>.<op>(body)``: every op of the manifest as a method, built on demand.

Nothing here is written per op. A plane and its methods are looked up in the committed
manifest (``loom.ops_manifest``), so ``dir(bot.client.working_memory)`` lists the ops and
their docstrings carry the summary and fields. A name the manifest lacks is resolved like this:

- close to a known name (a typo such as ``working_memory.sett``): ``AttributeError`` naming
  the known one;
- anything else: sent as it is, so an op the server gained after this SDK was built works
  without an upgrade (the server answers ``UNKNOWN_OP``, raised as ``loom.errors.UnknownOp``,
  when it has no such op). ``bot.client.call("plane.op", body)`` does the same by string.
"""

from __future__ import annotations

import difflib
import keyword
from collections.abc import Awaitable, Mapping
from typing import Any, ClassVar, Generic, Protocol, TypeVar, overload

from loom.calls import Async, Call, Face, M, Runner, Sync, single
from loom.ops_manifest import OPS

T_co = TypeVar("T_co", covariant=True)
T = TypeVar("T")


def known_planes() -> dict[str, dict[str, dict[str, Any]]]:
    """The manifest's ops grouped by plane: ``{"working_memory": {"set": {...}}, ...}``."""
    grouped: dict[str, dict[str, dict[str, Any]]] = {}
    for name, entry in sorted(OPS.items()):
        plane, method = name.split(".", 1)
        grouped.setdefault(plane, {})[method] = entry
    return grouped


# A name must be this close to a known one to be read as a typo of it (difflib ratio).
TYPO_CUTOFF = 0.8


def _check_name(owner: str, name: str, known: list[str]) -> None:
    """Refuse private names and typos of known names; let other new names through."""
    if name.startswith("_") or not name.isidentifier() or keyword.iskeyword(name):
        raise AttributeError(name)
    if name in known:
        return
    close = difflib.get_close_matches(name, known, n=1, cutoff=TYPO_CUTOFF)
    if close:
        raise AttributeError(f"{owner} has no {name!r}; did you mean {close[0]!r}?")


def op_call(
    name: str, identity: Mapping[str, str], body: Mapping[str, Any] | None,
    timeout: float | None, entry: Mapping[str, Any] | None = None,
) -> Call[Any]:
    """The ``Call`` of op ``name`` with ``body``: identity merged under it, ``None`` left out
    (the server reads null as absent), kind and route from the manifest."""
    if body is not None and not isinstance(body, Mapping):
        raise TypeError(f"{name} takes a dict body, not {type(body).__name__}")
    merged = {**identity, **{k: v for k, v in (body or {}).items() if v is not None}}
    entry = entry if entry is not None else OPS.get(name) or {}
    return Call(
        name, merged, kind=entry.get("kind", "write"),
        http_method=entry.get("http_method", "POST"), path=entry.get("path"), timeout=timeout,
    )


class SyncOp(Protocol[T_co]):
    """The type of ``bot.client.<plane>.<op>`` in the sync form."""

    def __call__(
        self, body: Mapping[str, Any] | None = None, /, *, timeout: float | None = None
    ) -> T_co: ...


class AsyncOp(Protocol[T_co]):
    """The type of ``bot.client.<plane>.<op>`` in the async form."""

    def __call__(
        self, body: Mapping[str, Any] | None = None, /, *, timeout: float | None = None
    ) -> Awaitable[T_co]: ...


class OpMethod:
    """One op, callable with its body: ``method({"block_key": "state"})`` returns the answer
    (an awaitable of it in the async form).

    The caller's identity (org, namespace, agent) is merged under the body, so a body field of
    the same name wins. A field set to ``None`` is left out (the server reads null as absent).
    """

    def __init__(
        self, runner: Runner[Any], identity: Mapping[str, str], name: str,
        entry: Mapping[str, Any] | None,
    ) -> None:
        self.name = name
        self.entry = dict(entry) if entry is not None else None
        self._runner = runner
        self._identity = identity
        self.__doc__ = _describe(name, entry)

    def __call__(
        self, body: Mapping[str, Any] | None = None, /, *, timeout: float | None = None
    ) -> Any:
        call = op_call(self.name, self._identity, body, timeout, self.entry or {})
        return self._runner.run(single(call))

    def __repr__(self) -> str:
        known = "" if self.entry is not None else " (not in this SDK's manifest)"
        return f"<loom op {self.name}{known}>"


class Op(Generic[T]):
    """A typed op attribute of a generated plane (``loom.answers``): answers ``T``."""

    def __init__(self, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type[Any] | None = None) -> Op[T]: ...

    @overload
    def __get__(self, obj: Face[Sync], owner: type[Any] | None = None) -> SyncOp[T]: ...

    @overload
    def __get__(self, obj: Face[Async], owner: type[Any] | None = None) -> AsyncOp[T]: ...

    def __get__(self, obj: Face[Any] | None, owner: type[Any] | None = None) -> Any:
        if obj is None:
            return self
        assert isinstance(obj, Plane)
        return obj._method(self.name.split(".", 1)[1])


def _describe(name: str, entry: Mapping[str, Any] | None) -> str:
    if entry is None:
        return f"{name}: not in this SDK's manifest; the body is sent as it is."
    lines = [f"{name}: {entry['summary']}", "", f"Role {entry['role']}, {entry['kind']}."]
    lines.append("Fields:")
    for field, spec in entry["fields"].items():
        if spec.get("required"):
            lines.append(f"  {field} (required)")
        elif spec.get("computed"):
            lines.append(f"  {field} (default computed by the server)")
        else:
            lines.append(f"  {field} = {spec.get('default')!r}")
    return "\n".join(lines)


class Plane(Face[M]):
    """The ops of one plane as attributes: ``plane.set``, ``plane.get``, ...

    The generated subclasses (``loom.answers``) type each known op; a name they lack
    resolves as the module doc says.
    """

    def __init__(
        self, runner: Runner[M], identity: Mapping[str, str], name: str,
        ops: Mapping[str, Mapping[str, Any]],
    ) -> None:
        self._runner = runner
        self._identity = identity
        self._name = name
        self._ops = ops

    def _method(self, method: str) -> OpMethod:
        full = f"{self._name}.{method}"
        return OpMethod(self._runner, self._identity, full, self._ops.get(method))

    def __getattr__(self, method: str) -> Any:
        _check_name(f"plane {self._name}", method, sorted(self._ops))
        return self._method(method)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._ops))

    def __repr__(self) -> str:
        return f"<loom plane {self._name}: {', '.join(sorted(self._ops)) or 'no known ops'}>"


class BaseOpsClient(Face[M]):
    """``bot.client``: the planes of the manifest as attributes, and ``call`` by op name.

    ``loom.answers.OpsClient`` is this with each known plane typed.
    """

    # Each known plane's typed class, which the generated subclass names; this module stays
    # below the generated one, so a plane without one here is a plain ``Plane``.
    plane_types: ClassVar[Mapping[str, type[Plane[Any]]]] = {}

    def __init__(self, runner: Runner[M], identity: Mapping[str, str]) -> None:
        self._runner = runner
        self._identity = identity
        self._planes = known_planes()

    def __getattr__(self, plane: str) -> Any:
        _check_name("bot.client", plane, sorted(self._planes))
        kind = self.plane_types.get(plane, Plane)
        return kind(self._runner, self._identity, plane, self._planes.get(plane, {}))

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._planes))

    def call(
        self, op: str, body: Mapping[str, Any] | None = None, /, *, timeout: float | None = None
    ) -> Any:
        """Call an op by its full name, ``"working_memory.set"``; no name check."""
        if op.count(".") != 1:
            raise ValueError(f"an op name is '<plane>.<op>', not {op!r}")
        return OpMethod(self._runner, self._identity, op, OPS.get(op))(body, timeout=timeout)

    def ops(self) -> list[str]:
        """Every op name this SDK's manifest knows."""
        return sorted(OPS)
