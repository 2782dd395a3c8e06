"""Type-checked, not run: each form of the SDK answers the generated types (mypy --strict)."""

from __future__ import annotations

from typing import assert_type

from loom import Agent, AsyncAgent, Rendered
from loom.agent_state import AgentState, AgentStateWritten
from loom.answers import (
    MemoryGetAnswer,
    ProfileSchemaSetAnswer,
    ProfileStructuredAnswer,
    WorkingMemoryAppendAnswer,
    WorkingMemorySetAnswer,
)


def sync_form() -> None:
    with Agent(org="acme", namespace="support", agent="triage-bot") as bot:
        assert_type(bot, Agent)
        assert_type(bot.working_memory.set("x", block_key="state"), WorkingMemorySetAnswer)
        assert_type(bot.working_memory.append("y", block_key="state"), WorkingMemoryAppendAnswer)
        assert_type(bot.working_memory.render(run_id="run-7"), Rendered)
        assert_type(bot.profile.get("persona"), MemoryGetAnswer)
        assert_type(bot.client.profile.structured({"user_id": "u-42"}), ProfileStructuredAnswer)
        assert_type(bot.client.profile_schema.set({"json_schema": {}}), ProfileSchemaSetAnswer)
        assert_type(bot.conversation("c-1").agent_state.get(), AgentState)
        assert_type(bot.conversation("c-1").agent_state.put({"a": 1}), AgentStateWritten)
        assert_type(bot.flush(), int)
        version: int = bot.working_memory.set("x")["version"]
        print(version)


async def async_form() -> None:
    async with Agent(org="acme", namespace="support", agent="triage-bot") as bot:
        assert_type(bot, AsyncAgent)
        assert_type(await bot.working_memory.set("x", block_key="state"), WorkingMemorySetAnswer)
        assert_type(await bot.working_memory.render(run_id="run-7"), Rendered)
        assert_type(await bot.profile.get("persona"), MemoryGetAnswer)
        assert_type(await bot.client.profile.structured({"user_id": "u-42"}),
                    ProfileStructuredAnswer)
        assert_type(await bot.conversation("c-1").agent_state.get(), AgentState)
        assert_type(await bot.flush(), int)
