"""MCP Streamable HTTP at ``/mcp`` on the web process (``app.mcp_web``), driven by the official
MCP client against a real gunicorn alone (no MCP process, no ``LOOM_API_URL``), with auth off
and on; and the transport's refusals through the Flask app.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import requests
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from app import logs
from loom.mcp_server import select_tools
from tests.conftest import TEST_SECRET
from tests.support.live_server import LiveServer

WHO = {"namespace": "support", "agent": "triage-bot"}
ADMIN_TOKEN = "admin-token-for-the-mcp-web-tests"
HEADERS = {"Accept": "application/json, text/event-stream"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "probe", "version": "1"}}}


def payload(result: Any) -> dict[str, Any]:
    assert len(result.content) == 1 and result.content[0].type == "text"
    decoded: dict[str, Any] = json.loads(result.content[0].text)
    return decoded


async def write_and_read(client: Client) -> None:
    """List the tools, write a block, read it back: through one connected client."""
    names = [tool.name for tool in (await client.list_tools()).tools]
    assert names == sorted(select_tools(["all"]))
    written = await client.call_tool(
        "loom_working_memory_set", {**WHO, "block_key": "state", "content": "ticket 4812"})
    assert not written.is_error, written.content
    assert payload(written)["value_length"] == len("ticket 4812")
    rendered = await client.call_tool("loom_working_memory_render", WHO)
    assert [block["content"] for block in payload(rendered)["blocks"]] == ["ticket 4812"]
    refused = await client.call_tool(
        "loom_working_memory_set", {**WHO, "block_key": "state", "content": "x" * 50,
                                    "char_limit": 10})
    assert refused.is_error
    assert payload(refused)["error"]["status"] == 422


def web(redis_url: str, tmp_path: Path, **env: str) -> LiveServer:
    return LiveServer({"REDIS_URL": redis_url, "LOOM_SECRET_KEY": TEST_SECRET,
                       "LOOM_DATA_DIR": str(tmp_path), **env}, workers=1)


@pytest.mark.slow
def test_auth_off_the_official_client_lists_and_calls_tools_on_the_web_port(
        redis_url: str, tmp_path: Path):
    with web(redis_url, tmp_path) as server:
        url = server.url + "/mcp"

        async def go() -> None:
            async with Client(url) as client:
                await write_and_read(client)

        anyio.run(go)
        # No event stream: GET is 405 at once, as on the MCP process.
        answer = requests.get(url, headers={"Accept": "text/event-stream"}, timeout=10)
        assert answer.status_code == 405 and answer.headers["Allow"] == "POST"
        # A page of another site is refused; this server's own pages are not.
        assert requests.post(url, json=INITIALIZE, timeout=10, headers={
            **HEADERS, "Origin": "http://attacker.example"}).status_code == 403
        assert requests.post(url, json=INITIALIZE, timeout=10, headers={
            **HEADERS, "Origin": f"http://localhost:{server.port}"}).status_code == 200
        # The loopback bind's Host check covers /mcp as it covers the API.
        assert requests.post(url, json=INITIALIZE, timeout=10, headers={
            **HEADERS, "Host": "attacker.example"}).status_code == 421


async def connect_with(url: str, token: str) -> Any:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            await write_and_read(client)
            # A token that reaches one namespace is held to it, as the API holds it.
            elsewhere = await client.call_tool(
                "loom_working_memory_render", {**WHO, "namespace": "billing"})
            return payload(elsewhere)


@pytest.mark.slow
def test_auth_on_the_web_port_takes_the_apis_tokens_and_refuses_others(
        redis_url: str, tmp_path: Path):
    with web(redis_url, tmp_path, LOOM_AUTH="on", LOOM_ADMIN_TOKEN=ADMIN_TOKEN,
             LOOM_ALLOWED_HOSTS="loom.example") as server:
        url = server.url + "/mcp"
        minted = requests.post(server.url + "/v1/token.create", timeout=10,
                               json={"namespace": "support", "role": "writer"},
                               headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert minted.status_code == 200, minted.text

        elsewhere = anyio.run(connect_with, url, minted.json()["token"])
        assert elsewhere["error"]["code"] == "AUTH_INSUFFICIENT"

        for headers in ({}, {"Authorization": "Bearer not-a-token"},
                        {"Authorization": f"Basic {ADMIN_TOKEN}"}):
            refused = requests.post(url, json=INITIALIZE, headers={**HEADERS, **headers},
                                    timeout=10)
            assert refused.status_code == 401, refused.text
            assert refused.headers["WWW-Authenticate"].startswith("Bearer")
            assert refused.json()["error"]["data"]["code"] in ("AUTH_REQUIRED", "AUTH_INVALID")

        async def with_a_bad_token() -> None:
            async with httpx2.AsyncClient(headers={"Authorization": "Bearer wrong"}) as http:
                async with Client(streamable_http_client(url, http_client=http)) as client:
                    await client.list_tools()

        with pytest.raises(Exception):  # noqa: B017 - the client's own refusal, whatever its type
            anyio.run(with_a_bad_token)

        admin = {**HEADERS, "Authorization": f"Bearer {ADMIN_TOKEN}"}
        assert requests.post(url, json=INITIALIZE, headers=admin, timeout=10).status_code == 200
        assert requests.post(url, json=INITIALIZE, timeout=10, headers={
            **admin, "Origin": "http://attacker.example"}).status_code == 403
        assert requests.post(url, json=INITIALIZE, timeout=10, headers={
            **admin, "Host": "loom.example", "Origin": "https://loom.example"}).status_code == 200
        assert requests.post(url, json=INITIALIZE, timeout=10, headers={
            **admin, "Host": "attacker.example"}).status_code == 421


# --- the transport, through the Flask app ------------------------------------------------------


def post(client: Any, message: Any, **headers: str) -> Any:
    return client.post("/mcp", data=json.dumps(message),
                       headers={**HEADERS, "Content-Type": "application/json", **headers})


def test_initialize_agrees_a_handshake_version_and_lists_only_tools(client):
    answer = post(client, INITIALIZE)
    assert answer.status_code == 200
    result = answer.json["result"]
    assert result["protocolVersion"] == "2025-06-18"
    assert result["capabilities"] == {"tools": {"listChanged": False}}
    assert result["serverInfo"]["name"] == "loom"
    newer = {**INITIALIZE, "params": {**INITIALIZE["params"], "protocolVersion": "2099-01-01"}}
    assert post(client, newer).json["result"]["protocolVersion"] == "2025-11-25"
    assert "Mcp-Session-Id" not in answer.headers


def test_notifications_are_accepted_and_unknown_methods_are_json_rpc_errors(client):
    accepted = post(client, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert accepted.status_code == 202 and accepted.get_data() == b""
    for method in ("server/discover", "resources/list"):
        unknown = post(client, {"jsonrpc": "2.0", "id": 7, "method": method})
        assert unknown.status_code == 200
        assert unknown.json["id"] == 7 and unknown.json["error"]["code"] == -32601
    assert post(client, {"jsonrpc": "2.0", "id": 8, "method": "ping"}).json["result"] == {}


def test_malformed_messages_are_refused_with_the_transports_statuses(client):
    broken = client.post("/mcp", data=b"{not json", headers={
        **HEADERS, "Content-Type": "application/json"})
    assert broken.status_code == 400 and broken.json["error"]["code"] == -32700
    assert post(client, {"id": 1}).status_code == 400
    wrong_type = client.post("/mcp", data=json.dumps(INITIALIZE),
                             headers={**HEADERS, "Content-Type": "text/plain"})
    assert wrong_type.status_code == 415
    assert post(client, INITIALIZE, Accept="text/html").status_code == 406
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    unknown_version = post(client, listing, **{"MCP-Protocol-Version": "1999-01-01"})
    assert unknown_version.status_code == 400
    bad_call = post(client, {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                             "params": {"arguments": {}}})
    assert bad_call.json["error"]["code"] == -32602


def test_an_unknown_tool_and_an_open_object_as_json_text_answer_as_on_the_mcp_process(client):
    unknown = post(client, {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                            "params": {"name": "loom_nothing", "arguments": {}}}).json
    assert unknown["result"]["isError"] is True
    assert unknown["result"]["structuredContent"]["error"]["code"] == "UNKNOWN_TOOL"
    bad_json = post(client, {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "loom_memory_set",
        "arguments": {**WHO, "value_json": "{not json"}}}).json
    assert bad_json["result"]["structuredContent"]["error"]["code"] == "VALIDATION_ERROR"


class BoundFields(logging.Handler):
    """Each access line with the log fields bound when it was written."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[str, object]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.getMessage(), logs.bound().get("request_id")))


def test_an_op_called_through_mcp_logs_under_the_mcp_requests_id(client):
    access = logging.getLogger("loom.access")
    handler = BoundFields()
    access.addHandler(handler)
    try:
        answer = post(client, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "loom_working_memory_render", "arguments": WHO}},
            **{"X-Request-Id": "mcp-call-7"})
    finally:
        access.removeHandler(handler)
    assert answer.json["result"]["isError"] is False
    assert answer.headers["X-Request-Id"] == "mcp-call-7"
    lines = handler.lines
    # The op's own line, then the /mcp request's: one id, and each its own label.
    assert lines == [("POST working_memory.render 200", "mcp-call-7"),
                     ("POST mcp 200", "mcp-call-7")]
