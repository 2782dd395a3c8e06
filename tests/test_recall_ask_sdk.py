"""memory.ask and loom_search end to end: the Python SDK's two faces and the MCP server over
stdio, against a real gunicorn whose model and embeddings calls reach the scripted server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from mcp import Client

from loom import Agent, AsyncAgent
from tests.conftest import TEST_SECRET
from tests.support.live_server import LiveServer
from tests.support.model_server import ScriptedModelServer
from tests.test_mcp import payload, stdio_params

pytestmark = pytest.mark.slow

WHO = {"org": "acme", "namespace": "sdk-ask", "agent": "bot"}


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(synonyms={"food": "vegetarian"}) as server:
        yield server


@pytest.fixture(scope="module")
def api(redis_server_url: str, tmp_path_factory: pytest.TempPathFactory,
        model: ScriptedModelServer) -> Iterator[LiveServer]:
    env = {"REDIS_URL": redis_server_url, "LOOM_SECRET_KEY": TEST_SECRET,
           "LOOM_DATA_DIR": str(tmp_path_factory.mktemp("ask-api")),
           "LOOM_LLM_BASE_URL": model.base_url, "LOOM_LLM_MODEL": "scripted-model"}
    with LiveServer(env) as server:
        yield server


def test_ask_and_unified_search_from_both_faces(api: LiveServer, redis_url: str,
                                                model: ScriptedModelServer):
    with Agent(**WHO, base_url=api.url) as bot:
        fact = bot.memory.set(user_id="u-1", key="currency", value="Invoices go out in EUR.")
        bot.profile.set("diet", "Vegetarian, no meat.", user_id="u-1")
        model.script({"answer": "EUR.", "citations": [fact["memory_id"]]})
        asked = bot.memory.ask(user_id="u-1", query="which currency on invoices",
                               read_scope="own_user")
        assert asked["answer"] == "EUR." and asked["citations"] == [fact["memory_id"]]
        found = bot.memory.unified_search(user_id="u-1", query="is meat in my diet",
                                          read_scope="own_user")
        assert [hit["label"] for hit in found["profile"]] == ["diet"]
        assert found["profile_leg"] == "lexical" and found["hits"] == []

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with AsyncAgent(**WHO, base_url=api.url) as bot:
            model.script({"answer": "In EUR.", "citations": [fact["memory_id"], "m-x"]})
            asked = await bot.memory.ask(user_id="u-1", query="invoices currency",
                                         read_scope="own_user")
            found = await bot.memory.unified_search(user_id="u-1", query="currency invoices",
                                                    read_scope="own_user")
            return asked, found

    asked, found = asyncio.run(scenario())
    assert asked["citations"] == [fact["memory_id"]] and asked["uncited_ids"] == ["m-x"]
    assert [hit["key"] for hit in found["hits"]] == ["currency"] and found["profile"] == []


def test_loom_search_is_listed_and_answers_over_stdio(api: LiveServer, redis_url: str):
    with Agent(**WHO, base_url=api.url) as bot:
        bot.profile.set("preferences", "Prefers EUR invoices.", user_id="u-2")

    async def go() -> None:
        params = stdio_params(api.url, LOOM_MCP_ORG="acme", LOOM_MCP_NAMESPACE="sdk-ask",
                              LOOM_MCP_AGENT="bot")
        async with Client(params) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert "loom_search" in tools and "loom_memory_ask" in tools
            assert "loom_memory_unified_search" not in tools
            assert tools["loom_search"].title == "memory.unified_search"
            result = await client.call_tool("loom_search", {
                "user_id": "u-2", "query": "what currency do I prefer for invoices",
                "read_scope": "own_user"})
            assert not result.is_error, result.content
            answer = payload(result)
            assert [hit["label"] for hit in answer["profile"]] == ["preferences"]
            bad = await client.call_tool("loom_search", {"user_id": "u-2", "query": ""})
            assert bad.is_error and payload(bad)["error"]["code"] == "VALIDATION_ERROR"

    anyio.run(go)
