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
from collections.abc import Mapping
from typing import Any

from loom.ops_manifest import OPS
from loom.transport import Transport


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


class OpMethod:
    """One op, callable with its body: ``method({"block_key": "state"})`` returns the answer.

    The caller's identity (org, namespace, agent) is merged under the body, so a body field of
    the same name wins. A field set to ``None`` is left out (the server reads null as absent).
    """

    def __init__(
        self, transport: Transport, identity: Mapping[str, str], name: str,
        entry: Mapping[str, Any] | None,
    ) -> None:
        self.name = name
        self.entry = dict(entry) if entry is not None else None
        self._transport = transport
        self._identity = identity
        self.__doc__ = _describe(name, entry)

    def __call__(
        self, body: Mapping[str, Any] | None = None, /, *, timeout: float | None = None
    ) -> dict[str, Any]:
        if body is not None and not isinstance(body, Mapping):
            raise TypeError(f"{self.name} takes a dict body, not {type(body).__name__}")
        merged = {**self._identity, **{k: v for k, v in (body or {}).items() if v is not None}}
        entry = self.entry or {}
        return self._transport.call(
            self.name,
            merged,
            http_method=entry.get("http_method", "POST"),
            path=entry.get("path"),
            timeout=timeout,
        )

    def __repr__(self) -> str:
        known = "" if self.entry is not None else " (not in this SDK's manifest)"
        return f"<loom op {self.name}{known}>"


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


class Plane:
    """The ops of one plane as attributes: ``plane.set``, ``plane.get``, ..."""

    def __init__(
        self, transport: Transport, identity: Mapping[str, str], name: str,
        ops: Mapping[str, Mapping[str, Any]],
    ) -> None:
        self._transport = transport
        self._identity = identity
        self._name = name
        self._ops = ops

    def __getattr__(self, method: str) -> OpMethod:
        _check_name(f"plane {self._name}", method, sorted(self._ops))
        full = f"{self._name}.{method}"
        return OpMethod(self._transport, self._identity, full, self._ops.get(method))

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._ops))

    def __repr__(self) -> str:
        return f"<loom plane {self._name}: {', '.join(sorted(self._ops)) or 'no known ops'}>"


class OpsClient:
    """``bot.client``: the planes of the manifest as attributes, and ``call`` by op name."""

    def __init__(self, transport: Transport, identity: Mapping[str, str]) -> None:
        self._transport = transport
        self._identity = identity
        self._planes = known_planes()

    def __getattr__(self, plane: str) -> Plane:
        _check_name("bot.client", plane, sorted(self._planes))
        return Plane(self._transport, self._identity, plane, self._planes.get(plane, {}))

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._planes))

    def call(
        self, op: str, body: Mapping[str, Any] | None = None, /, *, timeout: float | None = None
    ) -> dict[str, Any]:
        """Call an op by its full name, ``"working_memory.set"``; no name check."""
        if op.count(".") != 1:
            raise ValueError(f"an op name is '<plane>.<op>', not {op!r}")
        entry = OPS.get(op)
        return OpMethod(self._transport, self._identity, op, entry)(body, timeout=timeout)

    def ops(self) -> list[str]:
        """Every op name this SDK's manifest knows."""
        return sorted(OPS)
