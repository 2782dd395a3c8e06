"""Loom's Python SDK: sync, on ``requests``.

::

    from loom import Agent

    with Agent(org="acme", namespace="support", agent="triage-bot") as bot:
        bot.working_memory.set("cursor: ticket 4812", block_key="state", run_id="run-7")
        print(bot.working_memory.render(run_id="run-7"))

Errors are ``loom.errors.LoomError`` subclasses (hierarchy in that module's docstring). The
package imports neither Flask nor the server's code: ``loom.ops_manifest`` is generated from
the server's registry and committed. ``loom.mcp_server`` is the MCP server (the ``mcp``
extra: ``pip install 'loom[mcp]'``).
"""

from loom import errors
from loom._version import __version__
from loom.agent import Agent
from loom.agent_state import DELETE, AgentState, AgentStateWritten
from loom.errors import LoomAPIError, LoomConnectionError, LoomError, LoomTimeout
from loom.planes import Rendered

__all__ = [
    "DELETE",
    "Agent",
    "AgentState",
    "AgentStateWritten",
    "LoomAPIError",
    "LoomConnectionError",
    "LoomError",
    "LoomTimeout",
    "Rendered",
    "__version__",
    "errors",
]
