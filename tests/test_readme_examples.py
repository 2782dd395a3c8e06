"""The Python examples of the README and of the documentation site run as written, in order,
against a live gunicorn on a fresh install (auth off): each ```python block is taken from the
README, then from the site's pages in the order of mkdocs.yml's nav, so an example that stops
working fails here rather than in a newcomer's first hour.

The blocks share one namespace, as a reader's would. What the README's prose asks
for around a block, and no block shows, is done before it (``PRELUDES``): a ``bot`` to call
with, and for agent state an admin turning the feature on and declaring the agent's type, as
the section's first paragraph says. memory.ask "needs LOOM_LLM_BASE_URL and LOOM_LLM_MODEL",
so the server runs with a scripted model that answers as the example's comment shows.
Deployment files (a ``wsgi.py`` with OpenTelemetry) are not SDK examples and are left out
(``NOT_EXAMPLES``).
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_EXAMPLES = ("from opentelemetry",)


def example_pages() -> list[Path]:
    """The README, then every page of the site in the order its nav lists them."""
    nav = re.findall(r"^\s+- (?:[^:\n]+: )?(\S+\.md)$", (ROOT / "mkdocs.yml").read_text(),
                     flags=re.MULTILINE)
    return [ROOT / "README.md", *(ROOT / "docs" / page for page in nav)]


def readme_python_blocks() -> list[tuple[str, str]]:
    """Every ```python block of the README and the site, with the file and line it starts on."""
    blocks = []
    for page in example_pages():
        text = page.read_text()
        for found in re.finditer(r"^```python\n(.*?)^```", text,
                                 flags=re.DOTALL | re.MULTILINE):
            line = text.count("\n", 0, found.start()) + 2
            blocks.append((f"{page.relative_to(ROOT)}:{line}", found.group(1)))
    return blocks


def _agent_state_prelude(namespace: dict[str, Any]) -> None:
    """"An admin turns it on for a namespace (features.set), declares the agent's type
    (object_types.set)": the README's own words before the agent-state example."""
    from loom import Agent

    with Agent(org="acme", namespace="support", agent="ops") as admin:
        admin.client.features.set({"features": {"agent_state": True}})
        admin.client.object_types.set({"types": [{
            "type": "triage_state", "ownership": "agent",
            "fields": {"step": {"type": "string"}, "offer": {"type": "string"}},
            "agent_state": {"scope": "conversation", "max_bytes": 16384, "write": "both"},
        }]})


PRELUDES = {"bot.conversation(": _agent_state_prelude}


def _run(source: str, where: str, namespace: dict[str, Any]) -> None:
    code = compile(source, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, namespace)  # the README's own examples
    if inspect.iscoroutine(result):
        asyncio.run(result)


@pytest.fixture
def live_server_with_model(redis_url: str, tmp_path: Path):
    """The suite's gunicorn, with the model settings the README's memory.ask section names."""
    from tests.conftest import TEST_SECRET
    from tests.support.live_server import LiveServer
    from tests.support.model_server import ScriptedModelServer

    answer = {"answer": "Use EUR.", "citations": []}
    with ScriptedModelServer(default=answer) as model:
        env = {"REDIS_URL": redis_url, "LOOM_SECRET_KEY": TEST_SECRET,
               "LOOM_DATA_DIR": str(tmp_path), "LOOM_LLM_BASE_URL": model.base_url,
               "LOOM_LLM_MODEL": "scripted-model"}
        with LiveServer(env) as server:
            yield server


@pytest.mark.slow
def test_every_python_example_of_the_readme_runs_as_written(live_server_with_model,
                                                             monkeypatch):
    from loom import Agent

    live_server = live_server_with_model

    monkeypatch.setenv("LOOM_API_URL", live_server.url)
    monkeypatch.delenv("LOOM_API_KEY", raising=False)
    blocks = [(line, source) for line, source in readme_python_blocks()
              if not any(marker in source for marker in NOT_EXAMPLES)]
    assert len(blocks) >= 8, "the examples were not found"
    pages = {line.split(":", 1)[0] for line, _ in blocks}
    assert {"README.md", "docs/guides/sdk-python.md", "docs/concepts/recall.md"} <= pages
    namespace: dict[str, Any] = {
        "__name__": "readme",
        # Auth off: the install takes no token, so the admin examples run with none.
        "ADMIN_TOKEN": None,
        "note": "step 4 done",
        "bot": Agent(org="acme", namespace="support", agent="triage-bot"),
    }
    ran = []
    for line, source in blocks:
        for marker, prelude in PRELUDES.items():
            if marker in source:
                prelude(namespace)
        _run(source, line, namespace)
        ran.append(line)
    assert ran == [line for line, _ in blocks]
    # What the fixed examples promise: the pack carries the block written for its identity,
    # and the budget snippet sizes a fresh namespace without dividing by its zero calls.
    assert "cursor: ticket 4812" in namespace["system_prompt"]
    assert namespace["per_call"] == 750
    assert namespace["written"].stored is not None
