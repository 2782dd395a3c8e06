"""Typed faces of the planes, in the seeds' positional forms: ``bot.working_memory.set(text)``.

Each method builds the op's body from its arguments (an argument left as ``None`` is left out,
so the server's default applies) and calls it through ``bot.client``. The render methods return
``Rendered``: the rendered text as a ``str`` (so ``print(bot.working_memory.render(...))``
prints the XML, as in the seed) that also carries the whole answer on ``.answer``. Every other
method returns the answer dict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loom.client import OpsClient

DEFAULT_BLOCK_KEY = "scratchpad"


class Rendered(str):
    """A render's ``rendered`` text; ``.answer`` is the whole answer (blocks, counts, ...)."""

    answer: dict[str, Any]

    def __new__(cls, answer: dict[str, Any]) -> Rendered:
        text = super().__new__(cls, answer.get("rendered", ""))
        text.answer = dict(answer)
        return text


def _present(fields: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if value is not None}


class WorkingMemory:
    """``bot.working_memory``: small named blocks the agent is told every time (seed 004)."""

    def __init__(self, client: OpsClient) -> None:
        self._client = client

    def _call(self, op: str, timeout: float | None, fields: dict[str, Any]) -> dict[str, Any]:
        return self._client.call(f"working_memory.{op}", _present(fields), timeout=timeout)

    def set(
        self, content: str, block_key: str = DEFAULT_BLOCK_KEY, *, char_limit: int | None = None,
        run_id: str | None = None, session_id: str | None = None, user_id: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Replace a block's content; over ``char_limit`` raises WorkingMemoryLimitExceeded."""
        return self._call("set", timeout, {
            "content": content, "block_key": block_key, "char_limit": char_limit,
            "run_id": run_id, "session_id": session_id, "user_id": user_id,
        })

    def append(
        self, addition: str, block_key: str = DEFAULT_BLOCK_KEY, *, separator: str = "\n",
        run_id: str | None = None, session_id: str | None = None, user_id: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Append ``addition`` after ``separator``; a missing block is created."""
        return self._call("append", timeout, {
            "addition": addition, "block_key": block_key, "separator": separator,
            "run_id": run_id, "session_id": session_id, "user_id": user_id,
        })

    def replace(
        self, old: str, new: str = "", *, block_key: str = DEFAULT_BLOCK_KEY,
        run_id: str | None = None, session_id: str | None = None, user_id: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Replace every ``old`` with ``new`` in a block (SubstringNotFound when absent)."""
        return self._call("replace", timeout, {
            "old": old, "new": new, "block_key": block_key,
            "run_id": run_id, "session_id": session_id, "user_id": user_id,
        })

    def delete(
        self, block_key: str = DEFAULT_BLOCK_KEY, *,
        run_id: str | None = None, session_id: str | None = None, user_id: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Delete a block; ``deleted`` is False when there was none."""
        return self._call("delete", timeout, {
            "block_key": block_key,
            "run_id": run_id, "session_id": session_id, "user_id": user_id,
        })

    def get(
        self, block_key: str = DEFAULT_BLOCK_KEY, *,
        run_id: str | None = None, session_id: str | None = None, user_id: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Read one block; ``found`` is False when it is missing."""
        return self._call("get", timeout, {
            "block_key": block_key,
            "run_id": run_id, "session_id": session_id, "user_id": user_id,
        })

    def render(
        self, *, run_id: str | None = None, format: str = "xml",
        block_keys: Sequence[str] | None = None, limit: int = 20,
        session_id: str | None = None, user_id: str | None = None,
        timeout: float | None = None,
    ) -> Rendered:
        """The blocks in scope as one XML or Markdown text (see ``Rendered``)."""
        return Rendered(self._call("render", timeout, {
            "run_id": run_id, "format": format,
            "block_keys": list(block_keys) if block_keys is not None else None,
            "limit": limit, "session_id": session_id, "user_id": user_id,
        }))


class Profile:
    """``bot.profile``: always-loaded sections about the user or the agent (seeds 000, 003).

    ``get``, ``list`` and ``delete`` are SDK methods over ``memory.get``, ``memory.list`` and
    ``memory.delete`` with ``memory_type="profile"`` and the label as the key (seed 000).
    """

    def __init__(self, client: OpsClient) -> None:
        self._client = client

    def _call(self, op: str, timeout: float | None, fields: dict[str, Any]) -> dict[str, Any]:
        return self._client.call(op, _present(fields), timeout=timeout)

    def set(
        self, label: str, value: str, *, char_limit: int | None = None,
        if_match_sha256: str | None = None, source_trace: str | None = None,
        user_id: str | None = None, session_id: str | None = None, run_id: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Create or replace the section at ``label`` (HashMismatch on a stale if_match)."""
        return self._call("profile.set", timeout, {
            "label": label, "value": value, "char_limit": char_limit,
            "if_match_sha256": if_match_sha256, "source_trace": source_trace,
            "user_id": user_id, "session_id": session_id, "run_id": run_id,
        })

    def append(
        self, label: str, addition: str, *, separator: str = "\n",
        user_id: str | None = None, session_id: str | None = None, run_id: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Append to a section; a missing section is created."""
        return self._call("profile.append", timeout, {
            "label": label, "addition": addition, "separator": separator,
            "user_id": user_id, "session_id": session_id, "run_id": run_id,
        })

    def replace(
        self, label: str, old: str, new: str, *,
        user_id: str | None = None, session_id: str | None = None, run_id: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Rewrite ``old`` to ``new`` inside a section (SubstringNotFound when absent)."""
        return self._call("profile.replace", timeout, {
            "label": label, "old": old, "new": new,
            "user_id": user_id, "session_id": session_id, "run_id": run_id,
        })

    def render(
        self, *, user_id: str | None = None, read_scope: str | None = None,
        labels: Sequence[str] | None = None, format: str = "xml", scope: str | None = None,
        session_id: str | None = None, run_id: str | None = None,
        timeout: float | None = None,
    ) -> Rendered:
        """Every section (or ``labels``, in that order) as one prompt fragment."""
        return Rendered(self._call("profile.render", timeout, {
            "user_id": user_id, "read_scope": read_scope,
            "labels": list(labels) if labels is not None else None,
            "format": format, "scope": scope, "session_id": session_id, "run_id": run_id,
        }))

    def activity(
        self, lookback_days: int = 7, *,
        user_id: str | None = None, session_id: str | None = None, run_id: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Which clients read the profile, and when (the server caps the window at 30 days)."""
        return self._call("profile.activity", timeout, {
            "lookback_days": lookback_days,
            "user_id": user_id, "session_id": session_id, "run_id": run_id,
        })

    def structured(
        self, *, user_id: str | None = None, read_scope: str | None = None,
        session_id: str | None = None, run_id: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """One user's structured profile with its ``status``; never calls a model."""
        return self._call("profile.structured", timeout, {
            "user_id": user_id, "read_scope": read_scope,
            "session_id": session_id, "run_id": run_id,
        })

    def get(
        self, label: str, *, read_scope: str | None = None,
        user_id: str | None = None, session_id: str | None = None, run_id: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """One section: ``memory.get`` with the label as the key."""
        return self._call("memory.get", timeout, {
            "memory_type": "profile", "key": label, "read_scope": read_scope,
            "user_id": user_id, "session_id": session_id, "run_id": run_id,
        })

    def list(
        self, *,
        user_id: str | None = None, session_id: str | None = None, run_id: str | None = None,
        timeout: float | None = None, **fields: Any,
    ) -> dict[str, Any]:
        """Every section: ``memory.list`` of profile rows (other fields pass through)."""
        return self._call("memory.list", timeout, {
            **fields, "memory_type": "profile",
            "user_id": user_id, "session_id": session_id, "run_id": run_id,
        })

    def delete(
        self, label: str, *,
        user_id: str | None = None, session_id: str | None = None, run_id: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Delete a section: ``memory.delete`` with the label as the key."""
        return self._call("memory.delete", timeout, {
            "memory_type": "profile", "key": label,
            "user_id": user_id, "session_id": session_id, "run_id": run_id,
        })


class KeywordOp:
    """An op called with keyword fields: ``bot.memory.set(key="k", value="v")``."""

    def __init__(self, method: Any) -> None:
        self._method = method
        self.__doc__ = method.__doc__

    def __call__(self, *, timeout: float | None = None, **fields: Any) -> dict[str, Any]:
        return self._method(fields, timeout=timeout)

    def __repr__(self) -> str:
        return repr(self._method)


class KeywordPlane:
    """A plane whose ops take keyword fields (``bot.memory``, ``bot.context``).

    Names resolve as on ``bot.client`` (see ``loom.client``): typos of known ops raise
    ``AttributeError``; other names are sent to the server.
    """

    def __init__(self, client: OpsClient, plane: str) -> None:
        self._plane = getattr(client, plane)

    def __getattr__(self, method: str) -> KeywordOp:
        return KeywordOp(getattr(self._plane, method))

    def __dir__(self) -> list[str]:
        return dir(self._plane)

    def __repr__(self) -> str:
        return repr(self._plane)
