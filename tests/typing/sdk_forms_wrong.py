"""Type-checked, not run: two mistakes mypy must catch (a missing and a wrong await)."""

from __future__ import annotations

from loom import Agent


async def mistakes() -> None:
    async with Agent(org="acme") as bot:
        text: str = bot.working_memory.render()  # forgot the await
        print(text)
    with Agent(org="acme") as sync_bot:
        await sync_bot.working_memory.set("x")  # a sync answer is not awaitable
