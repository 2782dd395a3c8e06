"""memory.search and context.pack's query from the Python SDK, both faces, over a real gunicorn."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from loom import Agent, AsyncAgent
from tests.conftest import TEST_SECRET
from tests.support.live_server import LiveServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def api(redis_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {"REDIS_URL": redis_server_url, "LOOM_SECRET_KEY": TEST_SECRET,
           "LOOM_DATA_DIR": str(tmp_path_factory.mktemp("recall-api"))}
    with LiveServer(env) as server:
        yield server


def test_search_and_pack_from_both_faces(api: LiveServer, redis_url: str):
    with Agent(org="acme", namespace="sdk-recall", agent="bot", base_url=api.url) as bot:
        bot.memory.set(user_id="u-1", key="currency", value="Prefers EUR invoices.",
                       memory_type="preference")
        bot.memory.set(user_id="u-1", key="pet", value="Has a cat named Miso.")
        found = bot.memory.search(user_id="u-1", query="which currency on invoices",
                                  read_scope="own_user")
        assert [hit["key"] for hit in found["hits"]] == ["currency"]
        assert found["hits"][0]["legs"] == ["lexical"]
        packed = bot.context.pack(user_id="u-1", query="cat name", read_scope="own_user")
        assert "Miso" in packed["pack"] and packed["stable_prefix_chars"] == 0

    async def scenario() -> dict[str, Any]:
        async with AsyncAgent(org="acme", namespace="sdk-recall", agent="bot",
                              base_url=api.url) as bot:
            return await bot.memory.search(user_id="u-1", query="Miso the cat",
                                           read_scope="own_user", limit=1)

    answer = asyncio.run(scenario())
    assert [hit["key"] for hit in answer["hits"]] == ["pet"] and answer["count"] == 1
