"""The MCP server, driven by the ``mcp`` SDK's own client over stdio and Streamable HTTP.

The server runs as a child process (``python -m loom.mcp_server stdio|http``) in front of a
real gunicorn (``live_server``), so a tool call crosses both protocols end to end. The
Authorization forwarding test puts a recording HTTP server where the API would be, since the
test API runs with auth off and would not show which token arrived.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from app.local import free_port
from loom.mcp_server import (
    LoomMCP,
    parse_toolsets,
    portable_schema,
    select_tools,
    tool_name,
    with_exact_integers,
)
from loom.ops_manifest import OPS

ROOT = Path(__file__).resolve().parents[1]
# The SDK of this checkout, ahead of any copy pip installed.
PYTHONPATH = os.pathsep.join([str(ROOT / "sdk"), str(ROOT)])
WHO = {"namespace": "support", "agent": "triage-bot", "run_id": "run-7"}


def run(coroutine_function: Any, *args: Any) -> Any:
    return anyio.run(coroutine_function, *args)


def stdio_params(api_url: str, **env: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "loom.mcp_server", "stdio"],
        env={"PYTHONPATH": PYTHONPATH, "LOOM_API_URL": api_url, **env},
        cwd=str(ROOT),
    )


class HttpMCP:
    """``python -m loom.mcp_server http`` on a free loopback port."""

    def __init__(self, api_url: str, **env: str) -> None:
        self.port = free_port()
        self.env = {**os.environ, "PYTHONPATH": PYTHONPATH, "LOOM_API_URL": api_url, **env}
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def __enter__(self) -> HttpMCP:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "loom.mcp_server", "http",
             "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(self.process.stderr.read().decode())  # type: ignore[union-attr]
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the MCP HTTP server did not start")

    def __exit__(self, *exc: object) -> None:
        assert self.process is not None
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def payload(result: Any) -> dict[str, Any]:
    assert len(result.content) == 1 and result.content[0].type == "text"
    return json.loads(result.content[0].text)


async def exercise_working_memory(client: Client, expect_get: bool) -> None:
    """List the tools, write, read and overflow a block through one connected client."""
    names = {tool.name for tool in (await client.list_tools()).tools}
    assert {"loom_working_memory_set", "loom_working_memory_append",
            "loom_working_memory_render"} <= names
    assert ("loom_working_memory_get" in names) is expect_get
    assert not any(name.startswith("loom_agent_state") for name in names)

    written = await client.call_tool(
        "loom_working_memory_set",
        {**WHO, "block_key": "state", "content": "cursor: ticket 4812", "char_limit": 40},
    )
    assert not written.is_error, written.content
    assert payload(written)["value_length"] == len("cursor: ticket 4812")
    assert written.structured_content["char_limit"] == 40

    rendered = await client.call_tool("loom_working_memory_render", WHO)
    assert payload(rendered)["rendered"] == (
        '<working-memory block="state">cursor: ticket 4812</working-memory>'
    )
    if expect_get:
        got = await client.call_tool("loom_working_memory_get", {**WHO, "block_key": "state"})
        assert payload(got)["found"] is True
        assert payload(got)["content"] == "cursor: ticket 4812"

    over = await client.call_tool(
        "loom_working_memory_append", {**WHO, "block_key": "state", "addition": "x" * 40}
    )
    assert over.is_error is True
    assert "WORKING_MEMORY_LIMIT_EXCEEDED" in over.content[0].text
    error = payload(over)["error"]
    assert error["status"] == 422 and error["char_limit"] == 40
    assert error["value_length"] == len("cursor: ticket 4812") + 1 + 40

    invalid = await client.call_tool("loom_working_memory_set", {**WHO, "char_limit": 0})
    assert invalid.is_error and payload(invalid)["error"]["code"] == "VALIDATION_ERROR"


# --- toolsets and schemas ---------------------------------------------------------------------


def test_default_listing_is_the_all_toolset_and_full_adds_the_unlisted():
    default = select_tools(parse_toolsets(None))
    full = select_tools(parse_toolsets("full"))
    # The manifest mirrors the registry (tests/test_sdk.py checks that it is current).
    mcp_ops = {name: entry for name, entry in OPS.items() if entry["mcp"]}
    assert set(full) == {e["tool"] for e in mcp_ops.values()}
    assert set(default) == {e["tool"] for e in mcp_ops.values() if e["listed"]}
    # Every tool is loom_<op with . as _> but where the seed names it: memory.unified_search
    # is loom_search, in the default listing.
    assert {name: e["tool"] for name, e in mcp_ops.items() if e["tool"] != tool_name(name)} == {
        "memory.unified_search": "loom_search"}
    assert "loom_search" in default and "loom_memory_unified_search" not in full
    assert "loom_working_memory_get" not in default and "loom_working_memory_get" in full
    assert "loom_working_memory_set" in default
    planes = select_tools(parse_toolsets(" working_memory , all"))
    assert "loom_working_memory_get" in planes and "loom_working_memory_delete" in planes
    with pytest.raises(ValueError, match="unknown MCP toolset"):
        select_tools(["everything"])


def test_ops_outside_mcp_are_never_tools():
    ops = {
        "agent_state.put": {**OPS["working_memory.set"], "mcp": False, "listed": True},
        "working_memory.set": OPS["working_memory.set"],
    }
    for toolset in ("all", "full", "agent_state"):
        assert "loom_agent_state_put" not in select_tools([toolset], ops)


def test_tools_carry_the_registry_input_schema_in_one_type_per_field():
    tools = LoomMCP(toolsets=["full"]).tools
    described = tools["loom_working_memory_append"].describe()
    registry = OPS["working_memory.append"]["input_schema"]
    assert described.input_schema == portable_schema(
        {**registry, "required": ["addition", "namespace", "agent"]})
    assert set(described.input_schema["properties"]) == set(registry["properties"])
    # No default fills namespace or agent here, so the tool requires them ...
    assert described.input_schema["required"] == ["addition", "namespace", "agent"]
    # ... and where the server fills them (LOOM_MCP_NAMESPACE, LOOM_MCP_AGENT) it does not.
    filled = LoomMCP(toolsets=["full"], identity={"namespace": "n", "agent": "a"}).tools
    assert filled["loom_working_memory_append"].describe().input_schema["required"] == [
        "addition"]
    # Optional is absent, not null: one type, no null default; constraints kept.
    assert registry["properties"]["org"]["type"] == ["string", "null"]
    assert described.input_schema["properties"]["org"] == {
        "type": "string", "minLength": 1, "maxLength": 256, "description": "The tenant."}
    assert described.annotations.read_only_hint is False
    assert tools["loom_working_memory_get"].describe().annotations.read_only_hint is True


@pytest.mark.slow
def test_every_tool_converts_under_a_strict_mode_converter():
    """openai-agents lists the tools of ``loom-mcp stdio`` and turns each into a strict
    function tool (every object closed, every property declared, no anyOf at the root); a
    tool it cannot convert it serves non-strict, which a strict-only model endpoint refuses."""
    from agents.mcp import MCPServerStdio, MCPUtil

    async def go() -> list[Any]:
        env = {"PYTHONPATH": PYTHONPATH, "LOOM_API_URL": f"http://127.0.0.1:{free_port()}",
               "LOOM_MCP_TOOLSETS": "full", "PATH": os.environ.get("PATH", "")}
        params = {"command": sys.executable, "args": ["-m", "loom.mcp_server", "stdio"],
                  "env": env, "cwd": str(ROOT)}
        async with MCPServerStdio(params=params) as server:  # type: ignore[arg-type]
            listed = await server.list_tools()
            return [MCPUtil.to_function_tool(tool, server, True) for tool in listed]

    function_tools = asyncio.run(go())
    assert len(function_tools) == len([e for e in OPS.values() if e.get("mcp", True)])
    assert [tool.name for tool in function_tools if not tool.strict_json_schema] == []
    memory_set = next(tool for tool in function_tools if tool.name == "loom_memory_set")
    assert memory_set.params_json_schema["additionalProperties"] is False


def test_tool_schemas_state_one_of_groups_and_open_objects_as_json_text():
    import jsonschema

    tools = LoomMCP(toolsets=["full"], identity={"namespace": "n", "agent": "a"}).tools
    pin = tools["loom_memory_pin"]
    for schema in (pin.describe().input_schema, pin.call_schema()):
        valid = jsonschema.Draft202012Validator(schema).is_valid
        assert valid({"key": "k"}) and valid({"memory_id": "m-1"})
        assert not valid({}) and not valid({"key": "k", "memory_id": "m-1"})
    # A call may send null for what it leaves out (the listing, one type per field, does not
    # offer it).
    assert jsonschema.Draft202012Validator(pin.call_schema()).is_valid(
        {"key": "k", "memory_id": None, "session_id": None})
    memory_set = tools["loom_memory_set"]
    listed = memory_set.describe().input_schema
    assert {"type": "object"} not in listed["properties"]["value"]["anyOf"]
    for schema in (listed, memory_set.call_schema()):
        valid = jsonschema.Draft202012Validator(schema).is_valid
        assert valid({"key": "k", "value": "text"})
        assert valid({"key": "k", "value_json": '{"plan": "pro"}'})
        assert not valid({"key": "k"})
        assert not valid({"key": "k", "value": 1, "value_json": "1"})
    assert valid({"key": "k", "value": {"plan": "pro"}})  # a client that sends objects may
    schema_set = tools["loom_profile_schema_set"].describe().input_schema
    assert "json_schema" not in schema_set["properties"]
    assert "json_schema_json" in schema_set["required"]


@pytest.mark.slow
def test_json_text_arguments_and_nulls_reach_the_api_decoded(recording_api):
    """Over stdio, as a strict-mode client calls: every argument sent, null for the ones it
    leaves out, an object as JSON text."""
    api_url, seen = recording_api

    async def go() -> None:
        params = stdio_params(api_url, LOOM_MCP_TOOLSETS="full", LOOM_MCP_NAMESPACE="support",
                              LOOM_MCP_AGENT="desk")
        async with Client(params) as client:
            result = await client.call_tool("loom_memory_set", {
                "key": "plan", "value_json": '{"tier": "pro"}', "value": None,
                "namespace": None, "tags": None})
            assert payload(result) == {"recorded": True}
            bad = await client.call_tool("loom_memory_set",
                                         {"key": "plan", "value_json": "{not json"})
            assert bad.is_error and payload(bad)["error"]["code"] == "VALIDATION_ERROR"
            assert "value_json" in payload(bad)["error"]["message"]
            both = await client.call_tool("loom_memory_set",
                                          {"key": "plan", "value": 1, "value_json": "1"})
            assert both.is_error

    run(go)
    assert [call["body"] for call in seen] == [
        {"namespace": "support", "agent": "desk", "key": "plan", "value": {"tier": "pro"}}]


def test_an_unreachable_api_is_an_error_result_not_a_crash():
    loom = LoomMCP(api_url=f"http://127.0.0.1:{free_port()}", toolsets=["all"])

    async def go() -> None:
        async with Client(loom.server()) as client:
            result = await client.call_tool("loom_working_memory_set", {**WHO, "content": "x"})
            assert result.is_error and payload(result)["error"]["code"] == "CONNECTION_ERROR"
            hidden = await client.call_tool("loom_working_memory_get", WHO)
            assert hidden.is_error and payload(hidden)["error"]["code"] == "UNKNOWN_TOOL"

    run(go)


# --- stdio ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_stdio_full_toolset_against_gunicorn(live_server):
    async def go() -> None:
        params = stdio_params(live_server.url, LOOM_MCP_TOOLSETS="full")
        async with Client(params) as client:
            await exercise_working_memory(client, expect_get=True)

    run(go)


@pytest.mark.slow
def test_stdio_default_toolset_and_identity_defaults(live_server):
    async def go() -> None:
        params = stdio_params(
            live_server.url, LOOM_MCP_NAMESPACE="support", LOOM_MCP_AGENT="desk-client"
        )
        async with Client(params) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert "loom_working_memory_get" not in names
            written = await client.call_tool(
                "loom_working_memory_set", {"block_key": "note", "content": "from MCP"}
            )
            assert not written.is_error, written.content
            other = await client.call_tool(
                "loom_working_memory_render", {"agent": "someone-else"}
            )
            assert payload(other)["rendered"] == ""  # the call's own agent wins
            mine = await client.call_tool("loom_working_memory_render", {})
            assert "from MCP" in payload(mine)["rendered"]

    run(go)


# --- Streamable HTTP --------------------------------------------------------------------------


@pytest.mark.slow
def test_http_default_and_full_toolsets_against_gunicorn(live_server):
    with HttpMCP(live_server.url) as default, HttpMCP(
        live_server.url, LOOM_MCP_TOOLSETS="full"
    ) as full:

        async def go() -> None:
            async with Client(default.url) as client:
                await exercise_working_memory(client, expect_get=False)
            async with Client(full.url) as client:
                got = await client.call_tool(
                    "loom_working_memory_get", {**WHO, "block_key": "state"}
                )
                assert payload(got)["content"] == "cursor: ticket 4812"
                deleted = await client.call_tool(
                    "loom_working_memory_delete", {**WHO, "block_key": "state"}
                )
                assert payload(deleted)["deleted"] is True

        run(go)


def test_http_get_answers_405_at_once_and_clients_still_call_tools(recording_api):
    """A GET asking for an event stream used to be held open with nothing ever sent: a client
    waited for its own timeout. Now it is 405 with Allow: POST, well within a client's read
    timeout, and the SDK's client (which tries that GET after initialising) goes on."""
    api_url, seen = recording_api
    with HttpMCP(api_url) as mcp_http:
        for accept in ("text/event-stream", "application/json, text/event-stream"):
            answer = httpx2.get(mcp_http.url, headers={"Accept": accept}, timeout=10)
            assert answer.status_code == 405
            assert answer.headers["Allow"] == "POST"
            assert "no event stream" in answer.json()["error"]["message"]
        assert httpx2.head(mcp_http.url, timeout=10).status_code == 405
        # POST is served as before.
        initialised = httpx2.post(mcp_http.url, json=INITIALIZE, headers=MCP_HEADERS, timeout=10)
        assert initialised.status_code == 200
        assert initialised.json()["result"]["serverInfo"]["name"]

        async def go() -> None:
            async with Client(mcp_http.url) as client:
                result = await client.call_tool("loom_working_memory_render", WHO)
                assert payload(result) == {"recorded": True}

        run(go)
    assert [call["path"] for call in seen] == ["/v1/working_memory.render"]


class Recording(BaseHTTPRequestHandler):
    seen: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.seen.append({
            "path": self.path,
            "authorization": self.headers.get("Authorization"),
            "client": self.headers.get("X-Loom-Client"),
            "body": json.loads(self.rfile.read(length) or b"{}"),
        })
        answer = json.dumps({"recorded": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def recording_api() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []
    handler = type("Handler", (Recording,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


async def _render_with_and_without_a_token(url: str) -> None:
    headers = {"Authorization": "Bearer caller-token"}
    async with httpx2.AsyncClient(headers=headers) as http:
        async with Client(streamable_http_client(url, http_client=http)) as c:
            result = await c.call_tool("loom_working_memory_render", WHO)
            assert payload(result) == {"recorded": True}
    async with Client(url) as client:
        await client.call_tool("loom_working_memory_render", WHO)


@pytest.mark.slow
def test_http_forwards_the_callers_authorization_and_never_lends_the_env_key(recording_api):
    api_url, seen = recording_api
    with HttpMCP(api_url, LOOM_API_KEY="env-key") as mcp_http:
        run(_render_with_and_without_a_token, mcp_http.url)
    assert [call["authorization"] for call in seen] == ["Bearer caller-token", None]
    assert seen[0]["path"] == "/v1/working_memory.render"
    assert seen[0]["body"] == WHO
    assert seen[0]["client"].startswith("loom-mcp/")


@pytest.mark.slow
def test_http_lends_the_env_key_only_when_the_operator_opts_in(recording_api):
    api_url, seen = recording_api
    with HttpMCP(api_url, LOOM_API_KEY="env-key", LOOM_AUTH="on",
                 LOOM_MCP_HTTP_SERVER_KEY="true") as mcp_http:
        run(_render_with_and_without_a_token, mcp_http.url)
    assert [call["authorization"] for call in seen] == ["Bearer caller-token", "Bearer env-key"]


# --- loom-mcp http on a wide bind with auth on: who may call, by which Host and Origin ----------

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "probe", "version": "1"}}}
MCP_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


class ProcfileMCP:
    """The separate MCP server's command line (``loom-mcp http``; the web serves ``/mcp`` itself,
    so the Procfile has no line for it), through a shell, with auth on and no ``HOST`` (so on
    0.0.0.0), reached here through loopback."""

    def __init__(self, api_url: str, **env: str) -> None:
        self.port = free_port()
        self.command = "python -m loom.mcp_server http --port ${MCP_PORT}"
        self.env = {key: value for key, value in os.environ.items()
                    if key not in ("HOST", "LOOM_ALLOWED_HOSTS", "LOOM_MCP_HTTP_SERVER_KEY")}
        self.env.update(PYTHONPATH=PYTHONPATH, LOOM_API_URL=api_url, LOOM_AUTH="on",
                        LOOM_API_KEY="env-key", MCP_PORT=str(self.port),
                        PATH=os.path.dirname(sys.executable) + os.pathsep
                        + os.environ.get("PATH", ""), **env)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def __enter__(self) -> ProcfileMCP:
        self.process = subprocess.Popen(self.command, shell=True, cwd=ROOT, env=self.env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(self.process.stderr.read().decode())  # type: ignore[union-attr]
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the MCP HTTP server did not start")

    def __exit__(self, *exc: object) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, 15)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)
            self.process.wait()

    def post(self, **headers: str) -> httpx2.Response:
        return httpx2.post(self.url, json=INITIALIZE, headers={**MCP_HEADERS, **headers},
                           timeout=10)


@pytest.mark.slow
def test_auth_on_the_mcp_command_refuses_a_call_without_a_caller_token(recording_api):
    api_url, seen = recording_api
    with ProcfileMCP(api_url) as mcp_http:
        refused = mcp_http.post()
        assert refused.status_code == 401
        assert refused.headers["WWW-Authenticate"].startswith("Bearer")
        assert "AUTH_REQUIRED" in refused.json()["error"]["message"]
        assert mcp_http.post(Authorization="Basic ZW52LWtleQ==").status_code == 401

        async def go() -> None:
            headers = {"Authorization": "Bearer caller-token"}
            async with httpx2.AsyncClient(headers=headers) as http:
                async with Client(streamable_http_client(mcp_http.url, http_client=http)) as c:
                    result = await c.call_tool("loom_working_memory_render", WHO)
                    assert payload(result) == {"recorded": True}

        run(go)
    # The server's own key never left it: the one call made carried the caller's token.
    assert [call["authorization"] for call in seen] == ["Bearer caller-token"]


@pytest.mark.slow
def test_the_mcp_command_checks_host_and_origin_on_a_wide_bind(recording_api):
    api_url, _ = recording_api
    token = {"Authorization": "Bearer caller-token"}
    with ProcfileMCP(api_url) as mcp_http:
        assert mcp_http.post(**token).status_code == 200
        rebound = mcp_http.post(**token, Host=f"attacker.example:{mcp_http.port}")
        assert rebound.status_code == 421
        cross_site = mcp_http.post(**token, Origin="http://attacker.example")
        assert cross_site.status_code == 403
        assert mcp_http.post(**token, Origin=f"http://localhost:{mcp_http.port}"
                             ).status_code == 200
    with ProcfileMCP(api_url, LOOM_ALLOWED_HOSTS="loom.example, 10.0.0.7") as mcp_http:
        assert mcp_http.post(**token, Host="loom.example").status_code == 200
        assert mcp_http.post(**token, Host=f"10.0.0.7:{mcp_http.port}",
                             Origin="https://loom.example").status_code == 200
        assert mcp_http.post(**token, Host="attacker.example").status_code == 421


@pytest.mark.slow
def test_stdio_sends_the_env_key(recording_api):
    api_url, seen = recording_api

    async def go() -> None:
        async with Client(stdio_params(api_url, LOOM_API_KEY="env-key")) as client:
            await client.call_tool("loom_working_memory_append", {**WHO, "addition": "a"})

    run(go)
    assert seen == [{
        "path": "/v1/working_memory.append", "authorization": "Bearer env-key",
        "client": seen[0]["client"], "body": {**WHO, "addition": "a"},
    }]


# --- entry points -----------------------------------------------------------------------------


def test_the_console_script_runs_this_module_and_no_procfile_line_does(
        capsys: pytest.CaptureFixture[str]):
    from loom import mcp_server

    pyproject = (ROOT / "sdk" / "pyproject.toml").read_text()
    assert 'loom-mcp = "loom.mcp_server:main"' in pyproject
    # The web serves MCP at /mcp (tests/test_mcp_web.py): a platform routes only its port, so
    # a Procfile line for this server would be a process nobody reaches.
    procfile = (ROOT / "Procfile").read_text()
    assert "loom.mcp_server" not in procfile and "mcp:" not in procfile
    with pytest.raises(SystemExit) as done:
        mcp_server.main(["http", "--help"])
    assert done.value.code == 0 and "--port" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        mcp_server.main(["--toolsets", "nonsense", "stdio"])
    assert refused.value.code == 2 and "unknown MCP toolset" in capsys.readouterr().err


def test_no_listed_schema_has_a_type_array_or_a_value_without_a_type():
    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            assert not isinstance(node.get("type"), list), path
            assert node.get("default", 0) is not None, path
            if path.count(".properties.") and not ({"type", "anyOf", "$ref", "enum"} & set(node)):
                raise AssertionError(f"{path} constrains nothing")
            for key, value in node.items():
                walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for item in node:
                walk(item, path)

    for name, tool in LoomMCP(toolsets=["full"]).tools.items():
        walk(tool.describe().input_schema, name)


def test_integers_past_2_53_also_travel_as_exact_text():
    big = 1796126408740198319
    answer = {"version": big, "small": 7, "blocks": [{"version": big}], "versions": [big, 1],
              "profile": {"version": big, "version_text": "kept"}, "flag": True}
    assert with_exact_integers(answer) == {
        **answer, "version_text": str(big), "blocks": [{"version": big, "version_text": str(big)}],
        "versions_text": [str(big), "1"]}
