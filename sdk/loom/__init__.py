"""Loom's Python SDK: async on ``httpx``, sync on ``requests``, one ``Agent`` for both.

::

    from loom import Agent

    async with Agent(org="acme", namespace="support", agent="triage-bot") as bot:
        await bot.working_memory.set("cursor: ticket 4812", block_key="state", run_id="run-7")
        print(await bot.working_memory.render(run_id="run-7"))

    with Agent(org="acme", namespace="support", agent="triage-bot") as bot:
        bot.working_memory.set("cursor: ticket 4812", block_key="state", run_id="run-7")
        print(bot.working_memory.render(run_id="run-7"))

Answers are typed (``loom.answers``, generated from the server's registry); reads and
idempotent writes are retried where that is safe (``loom.retry``).

Errors are ``loom.errors.LoomError`` subclasses, one per code (hierarchy in
``loom.error_classes``'s docstring). The package imports neither Flask nor the server's code:
``loom.ops_manifest`` and ``loom.error_classes`` are generated from the server's registry and
error catalogue and committed. ``loom.mcp_server`` is the MCP server (the ``mcp``
extra: ``pip install 'loom[mcp]'``).
"""

from loom import errors
from loom._version import __version__
from loom.agent import Agent, AsyncAgent
from loom.agent_state import DELETE, AgentState, AgentStateWritten
from loom.errors import LoomAPIError, LoomConnectionError, LoomError, LoomTimeout
from loom.planes import Rendered
from loom.retry import Retry

__all__ = [
    "DELETE",
    "Agent",
    "AgentState",
    "AsyncAgent",
    "AgentStateWritten",
    "LoomAPIError",
    "LoomConnectionError",
    "LoomError",
    "LoomTimeout",
    "Rendered",
    "Retry",
    "__version__",
    "errors",
]
