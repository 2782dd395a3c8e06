"""The Python examples of seed 000, as the seed writes them, and their sync forms.

``ASYNC`` holds each example exactly as the seed prints it (its lines and their order; the
seed's text lost its indentation, restored here). ``SYNC`` is the same example without
``async``/``await``. Nothing is added for the test: the server address and token come from
``LOOM_API_URL`` and ``LOOM_API_KEY``, and ``ADMIN_TOKEN`` from ``LOOM_ADMIN_TOKEN``, the way
a user's environment supplies them. ``run`` executes one with top-level ``await`` allowed,
as an asyncio REPL or a notebook does, and answers the names it left behind.

This module imports nothing of the server, so the fresh-venv test runs it with only
``pip install ./sdk``.
"""

from __future__ import annotations

import ast
import asyncio
import os
import sys
from typing import Any

ASYNC: dict[str, str] = {
    "working_memory": '''\
from loom import Agent
async with Agent(org="acme", namespace="support", agent="triage-bot") as bot:
    await bot.working_memory.set(
        "cursor: ticket 4812\\nlease: holds refunds queue", block_key="state", run_id="run-7"
    )
    await bot.working_memory.append("step 3 done", block_key="state", run_id="run-7")
    print(await bot.working_memory.render(run_id="run-7"))
    # <working-memory block="state">cursor: ticket 4812 ...</working-memory>
''',
    "profiles": '''\
async with Agent(org="acme", namespace="support", agent="triage-bot") as bot:
    await bot.profile.set("persona", "Terse. Cite ticket ids. Never promise refunds.")
    await bot.profile.append("preferences", "Prefers EUR invoices.", user_id="u-42")
    system = await bot.profile.render(user_id="u-42", read_scope="own_user")
''',
    "structured_profiles": '''\
schema = {
    "type": "object",
    "properties": {
        "preferred_name": {"type": "string", "description": "What the user asks to be called"},
        "timezone": {"type": "string", "description": "IANA time zone, e.g. Europe/Berlin"},
        "languages": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Languages they speak",
        },
    },
}
async with Agent(org="acme", namespace="support", agent="chat", api_key=ADMIN_TOKEN) as admin:
    await admin.client.profile_schema.set({"json_schema": schema})
async with Agent(org="acme", namespace="support", agent="chat") as bot:
    out = await bot.client.profile.structured({"user_id": "u-42"})
    # {"status": "ready", "profile": {"preferred_name": "Sam", "timezone": "Europe/Berlin",
    # "languages": ["en", "de"]}, "built_at": "...", ...}
''',
}


def sync_form(example: str) -> str:
    """The example without ``async`` and ``await``: the sync SDK's form of it."""
    return example.replace("async with ", "with ").replace("await ", "")


SYNC: dict[str, str] = {name: sync_form(text) for name, text in ASYNC.items()}

# The examples follow each other in the seed: the later ones use the earlier ones' import.
ORDER = ("working_memory", "profiles", "structured_profiles")


def run(source: str, names: dict[str, Any] | None = None) -> dict[str, Any]:
    """Execute one example (top-level ``await`` allowed); answers its global names."""
    scope: dict[str, Any] = {"__name__": "__seed_example__"}
    if os.environ.get("LOOM_ADMIN_TOKEN"):
        scope["ADMIN_TOKEN"] = os.environ["LOOM_ADMIN_TOKEN"]
    scope.update(names or {})
    code = compile(source, "<seed example>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    pending = eval(code, scope)  # a coroutine when the example awaits
    if pending is not None:
        asyncio.run(pending)
    return scope


def run_all(examples: dict[str, str]) -> dict[str, Any]:
    """Run the examples in the seed's order in one namespace, as a reader would."""
    scope: dict[str, Any] = {}
    for name in ORDER:
        scope = run(examples[name], scope)
    return scope


if __name__ == "__main__":
    # python tests/support/seed_examples.py async|sync: what the fresh-venv test runs.
    form = sys.argv[1] if len(sys.argv) > 1 else "async"
    done = run_all(ASYNC if form == "async" else SYNC)
    print("structured:", done["out"]["status"])
    print("profile:", str(done["system"]).replace("\n", " "))
