"""Typed faces of the planes, in the seeds' positional forms: ``bot.working_memory.set(text)``.

Each method builds the op's ``Call`` from its arguments (an argument left as ``None`` is left
out, so the server's default applies); ``@sends`` makes it a method of both forms
(``loom.calls``): the sync face answers at once, the async face answers an awaitable. The
render methods answer ``Rendered``: the rendered text as a ``str`` (so
``print(await bot.working_memory.render(...))`` prints the XML, as in the seed) that also
carries the whole answer on ``.answer``. Every other method answers the op's ``TypedDict``
(``loom.answers``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from loom.answers import (
    MemoryDeleteAnswer,
    MemoryGetAnswer,
    MemoryListAnswer,
    ProfileActivityAnswer,
    ProfileAppendAnswer,
    ProfileReplaceAnswer,
    ProfileSetAnswer,
    ProfileStructuredAnswer,
    WorkingMemoryAppendAnswer,
    WorkingMemoryDeleteAnswer,
    WorkingMemoryGetAnswer,
    WorkingMemoryReplaceAnswer,
    WorkingMemorySetAnswer,
)
from loom.calls import Call, Face, M, Runner, sends
from loom.client import op_call

DEFAULT_BLOCK_KEY = "scratchpad"


class Rendered(str):
    """A render's ``rendered`` text; ``.answer`` is the whole answer (blocks, counts, ...)."""

    answer: dict[str, Any]

    def __new__(cls, answer: Mapping[str, Any]) -> Rendered:
        text = super().__new__(cls, answer.get("rendered", ""))
        text.answer = dict(answer)
        return text


def _present(fields: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if value is not None}


def _rendered(call: Call[Any]) -> Call[Rendered]:
    return Call(call.op, call.body, kind=call.kind, http_method=call.http_method,
                path=call.path, timeout=call.timeout, then=Rendered)


class PlaneFace(Face[M]):
    """A hand-written plane: it builds ``Call``s of the Agent's identity."""

    def __init__(self, runner: Runner[M], identity: Mapping[str, str]) -> None:
        self._runner = runner
        self._identity = identity

    def _call(self, op: str, timeout: float | None, fields: dict[str, Any]) -> Call[Any]:
        return op_call(op, self._identity, _present(fields), timeout)


class WorkingMemory(PlaneFace[M]):
    """``bot.working_memory``: small named blocks the agent is told every time (seed 004)."""

    def _call(self, op: str, timeout: float | None, fields: dict[str, Any]) -> Call[Any]:
        return super()._call(f"working_memory.{op}", timeout, fields)

    @sends
    def set(
        self, content: str, block_key: str = DEFAULT_BLOCK_KEY, *, char_limit: int | None = None,
        run_id: str | None = None, session_id: str | None = None, user_id: str | None = None,
        timeout: float | None = None,
    ) -> Call[WorkingMemorySetAnswer]:
        """Replace a block's content; over ``char_limit`` raises WorkingMemoryLimitExceeded."""
        return self._call("set", timeout, {
            "content": content, "block_key": block_key, "char_limit": char_limit,
            "run_id": run_id, "session_id": session_id, "user_id": user_id,
        })

    @sends
    def append(
        self, addition: str, block_key: str = DEFAULT_BLOCK_KEY, *, separator: str = "\n",
        run_id: str | None = None, session_id: str | None = None, user_id: str | None = None,
        timeout: float | None = None,
    ) -> Call[WorkingMemoryAppendAnswer]:
        """Append ``addition`` after ``separator``; a missing block is created."""
        return self._call("append", timeout, {
            "addition": addition, "block_key": block_key, "separator": separator,
            "run_id": run_id, "session_id": session_id, "user_id": user_id,
        })

    @sends
    def replace(
        self, old: str, new: str = "", *, block_key: str = DEFAULT_BLOCK_KEY,
        run_id: str | None = None, session_id: str | None = None, user_id: str | None = None,
        timeout: float | None = None,
    ) -> Call[WorkingMemoryReplaceAnswer]:
        """Replace every ``old`` with ``new`` in a block (SubstringNotFound when absent)."""
        return self._call("replace", timeout, {
            "old": old, "new": new, "block_key": block_key,
            "run_id": run_id, "session_id": session_id, "user_id": user_id,
        })

    @sends
    def delete(
        self, block_key: str = DEFAULT_BLOCK_KEY, *,
        run_id: str | None = None, session_id: str | None = None, user_id: str | None = None,
        timeout: float | None = None,
    ) -> Call[WorkingMemoryDeleteAnswer]:
        """Delete a block; ``deleted`` is False when there was none."""
        return self._call("delete", timeout, {
            "block_key": block_key,
            "run_id": run_id, "session_id": session_id, "user_id": user_id,
        })

    @sends
    def get(
        self, block_key: str = DEFAULT_BLOCK_KEY, *,
        run_id: str | None = None, session_id: str | None = None, user_id: str | None = None,
        timeout: float | None = None,
    ) -> Call[WorkingMemoryGetAnswer]:
        """Read one block; ``found`` is False when it is missing."""
        return self._call("get", timeout, {
            "block_key": block_key,
            "run_id": run_id, "session_id": session_id, "user_id": user_id,
        })

    @sends
    def render(
        self, *, run_id: str | None = None, format: str = "xml",
        block_keys: Sequence[str] | None = None, limit: int = 20,
        session_id: str | None = None, user_id: str | None = None,
        timeout: float | None = None,
    ) -> Call[Rendered]:
        """The blocks in scope as one XML or Markdown text (see ``Rendered``)."""
        return _rendered(self._call("render", timeout, {
            "run_id": run_id, "format": format,
            "block_keys": list(block_keys) if block_keys is not None else None,
            "limit": limit, "session_id": session_id, "user_id": user_id,
        }))


class Profile(PlaneFace[M]):
    """``bot.profile``: always-loaded sections about the user or the agent (seeds 000, 003).

    ``get``, ``list`` and ``delete`` are SDK methods over ``memory.get``, ``memory.list`` and
    ``memory.delete`` with ``memory_type="profile"`` and the label as the key (seed 000).
    """

    @sends
    def set(
        self, label: str, value: str, *, char_limit: int | None = None,
        if_match_sha256: str | None = None, source_trace: str | None = None,
        user_id: str | None = None, session_id: str | None = None, run_id: str | None = None,
        timeout: float | None = None,
    ) -> Call[ProfileSetAnswer]:
        """Create or replace the section at ``label`` (HashMismatch on a stale if_match)."""
        return self._call("profile.set", timeout, {
            "label": label, "value": value, "char_limit": char_limit,
            "if_match_sha256": if_match_sha256, "source_trace": source_trace,
            "user_id": user_id, "session_id": session_id, "run_id": run_id,
        })

    @sends
    def append(
        self, label: str, addition: str, *, separator: str = "\n",
        user_id: str | None = None, session_id: str | None = None, run_id: str | None = None,
        timeout: float | None = None,
    ) -> Call[ProfileAppendAnswer]:
        """Append to a section; a missing section is created."""
        return self._call("profile.append", timeout, {
            "label": label, "addition": addition, "separator": separator,
            "user_id": user_id, "session_id": session_id, "run_id": run_id,
        })

    @sends
    def replace(
        self, label: str, old: str, new: str, *,
        user_id: str | None = None, session_id: str | None = None, run_id: str | None = None,
        timeout: float | None = None,
    ) -> Call[ProfileReplaceAnswer]:
        """Rewrite ``old`` to ``new`` inside a section (SubstringNotFound when absent)."""
        return self._call("profile.replace", timeout, {
            "label": label, "old": old, "new": new,
            "user_id": user_id, "session_id": session_id, "run_id": run_id,
        })

    @sends
    def render(
        self, *, user_id: str | None = None, read_scope: str | None = None,
        labels: Sequence[str] | None = None, format: str = "xml", scope: str | None = None,
        session_id: str | None = None, run_id: str | None = None,
        timeout: float | None = None,
    ) -> Call[Rendered]:
        """Every section (or ``labels``, in that order) as one prompt fragment."""
        return _rendered(self._call("profile.render", timeout, {
            "user_id": user_id, "read_scope": read_scope,
            "labels": list(labels) if labels is not None else None,
            "format": format, "scope": scope, "session_id": session_id, "run_id": run_id,
        }))

    @sends
    def activity(
        self, lookback_days: int = 7, *,
        user_id: str | None = None, session_id: str | None = None, run_id: str | None = None,
        timeout: float | None = None,
    ) -> Call[ProfileActivityAnswer]:
        """Which clients read the profile, and when (the server caps the window at 30 days)."""
        return self._call("profile.activity", timeout, {
            "lookback_days": lookback_days,
            "user_id": user_id, "session_id": session_id, "run_id": run_id,
        })

    @sends
    def structured(
        self, *, user_id: str | None = None, read_scope: str | None = None,
        session_id: str | None = None, run_id: str | None = None,
        timeout: float | None = None,
    ) -> Call[ProfileStructuredAnswer]:
        """One user's structured profile with its ``status``; never calls a model."""
        return self._call("profile.structured", timeout, {
            "user_id": user_id, "read_scope": read_scope,
            "session_id": session_id, "run_id": run_id,
        })

    @sends
    def get(
        self, label: str, *, read_scope: str | None = None,
        user_id: str | None = None, session_id: str | None = None, run_id: str | None = None,
        timeout: float | None = None,
    ) -> Call[MemoryGetAnswer]:
        """One section: ``memory.get`` with the label as the key."""
        return self._call("memory.get", timeout, {
            "memory_type": "profile", "key": label, "read_scope": read_scope,
            "user_id": user_id, "session_id": session_id, "run_id": run_id,
        })

    @sends
    def list(
        self, /, *,
        user_id: str | None = None, session_id: str | None = None, run_id: str | None = None,
        timeout: float | None = None, **fields: Any,
    ) -> Call[MemoryListAnswer]:
        """Every section: ``memory.list`` of profile rows (other fields pass through)."""
        return self._call("memory.list", timeout, {
            **fields, "memory_type": "profile",
            "user_id": user_id, "session_id": session_id, "run_id": run_id,
        })

    @sends
    def delete(
        self, label: str, *,
        user_id: str | None = None, session_id: str | None = None, run_id: str | None = None,
        timeout: float | None = None,
    ) -> Call[MemoryDeleteAnswer]:
        """Delete a section: ``memory.delete`` with the label as the key."""
        return self._call("memory.delete", timeout, {
            "memory_type": "profile", "key": label,
            "user_id": user_id, "session_id": session_id, "run_id": run_id,
        })


class KeywordPlane(Face[M]):
    """A plane whose ops take keyword fields (``bot.memory``, ``bot.context``):
    ``bot.memory.set(key="k", value="v")`` is ``bot.client.memory.set({"key": "k", ...})``.

    Names resolve as on ``bot.client`` (see ``loom.client``): typos of known ops raise
    ``AttributeError``; other names are sent to the server.
    """

    def __init__(self, plane: Any) -> None:
        self._plane = plane
        self._runner = plane._runner

    def __getattr__(self, method: str) -> Any:
        op = getattr(self._plane, method)

        def call(*, timeout: float | None = None, **fields: Any) -> Any:
            return op(fields, timeout=timeout)

        call.__doc__ = op.__doc__
        call.__name__ = method
        return call

    def __dir__(self) -> list[str]:
        return dir(self._plane)

    def __repr__(self) -> str:
        return repr(self._plane)
