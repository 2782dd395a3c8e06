"""MCP Streamable HTTP at ``/mcp`` on the web process: the tools of ``loom.mcp_server`` served
on the port the platform routes, with no second process.

The transport is the specification's stateless JSON-response mode: each JSON-RPC request is
one ``POST`` answered by one JSON object; a notification or a response is ``202`` with no
body; ``GET`` is ``405`` (no server-initiated stream: the spec's answer for a server that
offers none); no ``Mcp-Session-Id`` is issued, and one a client sends is not required. The
messages are checked with the MCP SDK's own types (``mcp_types``), and the tool listing and
the tool calls are ``loom.mcp_server.LoomMCP``'s, so the tools, their schemas and their
answers are the ones the separate MCP server gives.

Who may call, checked before any message is read:

- ``Host``: the app's own check (``app.host_guard``), which runs before every view;
- ``Origin``, when a browser sends one: a loopback name, a name in ``LOOM_ALLOWED_HOSTS``, or
  this request's own ``Host`` (a page of another site is refused with 403, as the MCP
  transport asks of every server);
- the bearer token, as the API reads it (``Services.authenticate``): with auth on, a request
  without a known token is refused with 401 before the MCP layer, and with auth off a token
  that is sent is still held to.

A tool call is then a request of the op's own route, handed to this app in-process (a
``requests`` adapter on the SDK transport's session) with the caller's ``Authorization``,
``Host`` and address: the op runs through the same Flask path as an API call, with its auth,
budget, validation, idempotency and error shape.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import flask
import mcp_types as types
import requests
from flask import Blueprint, Flask, Response, request
from mcp.server.streamable_http import check_accept_headers
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION
from pydantic import ValidationError
from requests.adapters import BaseAdapter
from requests.structures import CaseInsensitiveDict
from werkzeug.test import EnvironBuilder, run_wsgi_app

from app import logs
from app.errors import LoomError
from app.host_guard import LOOPBACK_NAMES, host_name
from app.operate import REQUEST_ID_HEADER
from app.services import Services
from loom._version import __version__
from loom.mcp_server import INSTRUCTIONS, LoomMCP, parse_toolsets
from loom.transport import Transport

MCP_PATH = "/mcp"
# The base URL of the in-process calls: never resolved, only matched to the adapter.
IN_PROCESS_URL = "http://loom.in-process"
PROTOCOL_VERSION_HEADER = "MCP-Protocol-Version"
# JSON-RPC's "server error" range: the codes today's MCP server refuses a request with.
REFUSED = -32001


class InProcessAdapter(BaseAdapter):
    """Hands each request of the SDK transport to this app's WSGI callable, as a request from
    the caller of the current ``/mcp`` request: its ``Host``, scheme and client address."""

    def __init__(self, app: Flask) -> None:
        super().__init__()
        self.app = app

    def send(self, request: requests.PreparedRequest, stream: bool = False,
             timeout: float | tuple[float, float] | tuple[float, None] | None = None,
             verify: bool | str = True, cert: Any = None,
             proxies: Mapping[str, str] | None = None) -> requests.Response:
        """The request run by this app, in this greenlet: no socket, so the transport's
        timeout, TLS and proxy options have nothing to apply to."""
        prepared = request
        outer = flask.request.environ
        parts = urlsplit(prepared.url or "")
        body = prepared.body.encode() if isinstance(prepared.body, str) else prepared.body
        # The op's lines carry the /mcp request's id, and the /mcp request's own lines keep
        # their fields once the op's request has ended (it binds, then forgets, its own).
        outer_fields = logs.bound()
        headers = list(prepared.headers.items())
        if outer_fields.get("request_id"):
            headers.append((REQUEST_ID_HEADER, outer_fields["request_id"]))
        environ = EnvironBuilder(
            path=parts.path, query_string=parts.query, method=prepared.method or "GET",
            headers=headers, data=body or b"",
            base_url=f"{outer.get('wsgi.url_scheme', 'http')}://{flask.request.host}",
            environ_base={"REMOTE_ADDR": outer.get("REMOTE_ADDR", "")},
        ).get_environ()
        try:
            app_iter, status, answer_headers = run_wsgi_app(self.app.wsgi_app, environ,
                                                            buffered=True)
        finally:
            logs.bind_fresh(**outer_fields)
        response = requests.Response()
        response.status_code = int(status.split(" ", 1)[0])
        response.reason = status.split(" ", 1)[1] if " " in status else ""
        response.headers = CaseInsensitiveDict(dict(answer_headers))
        response._content = b"".join(app_iter)
        response.encoding = "utf-8"
        response.url = prepared.url or ""
        response.request = prepared
        return response

    def close(self) -> None:
        pass


class WebMCP(LoomMCP):
    """``LoomMCP`` whose calls go to this app in-process, never lending a key of its own."""

    def __init__(self, app: Flask, services: Services) -> None:
        settings = services.settings
        super().__init__(
            api_url=IN_PROCESS_URL, api_key="",
            toolsets=parse_toolsets(settings.mcp_toolsets),
            identity={"org": settings.mcp_org, "namespace": settings.mcp_namespace,
                      "agent": settings.mcp_agent},
        )
        self.adapter = InProcessAdapter(app)

    def new_transport(self) -> Transport:
        transport = super().new_transport()
        transport.session.trust_env = False  # no proxy settings apply to an in-process call
        transport.session.mount(IN_PROCESS_URL, self.adapter)
        return transport


def _jsonrpc(message_id: Any, *, result: Any = None, error: types.ErrorData | None = None,
             status: int = 200, headers: dict[str, str] | None = None) -> Response:
    if error is not None:
        answer: Any = types.JSONRPCError(jsonrpc="2.0", id=message_id, error=error)
    else:
        answer = types.JSONRPCResponse(jsonrpc="2.0", id=message_id, result=result)
    response = Response(answer.model_dump_json(by_alias=True, exclude_none=True), status=status,
                        mimetype="application/json")
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def _refusal(code: int, message: str, status: int, headers: dict[str, str] | None = None,
             data: Any = None) -> Response:
    """A request refused before any message is read: a JSON-RPC error with no id."""
    return _jsonrpc(None, error=types.ErrorData(code=code, message=message, data=data),
                    status=status, headers=headers)


def _result(model: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


def origin_allowed(origin: str, allowed_hosts: tuple[str, ...]) -> bool:
    """Whether a browser page of ``origin`` may call: a loopback name, an allowed name, or the
    name this request was sent to (the page is this server's own)."""
    if "*" in allowed_hosts:
        return True
    name = host_name(urlsplit(origin).netloc)
    if not name:
        return False  # "null" (a sandboxed or file page), or not a URL
    return (name in LOOPBACK_NAMES or name in allowed_hosts
            or name == host_name(request.host))


class MCPEndpoint:
    """The ``/mcp`` views over one ``WebMCP``."""

    def __init__(self, app: Flask, services: Services) -> None:
        self.services = services
        self.mcp = WebMCP(app, services)
        self.initialize_result = _result(types.InitializeResult(
            protocol_version=LATEST_HANDSHAKE_VERSION,
            capabilities=types.ServerCapabilities(tools=types.ToolsCapability(list_changed=False)),
            server_info=types.Implementation(name="loom", title="Loom", version=__version__),
            instructions=INSTRUCTIONS,
        ))
        self.tools_result = _result(types.ListToolsResult(
            tools=[tool.describe() for tool in self.mcp.tools.values()]))

    def refuse_caller(self) -> Response | None:
        """The 403 for another site's page, or the 401 for a missing or unknown token."""
        origin = request.headers.get("Origin", "").strip()
        if origin and not origin_allowed(origin, self.services.settings.allowed_hosts):
            return _refusal(REFUSED, "Forbidden: this server does not answer pages of that "
                            "Origin; add its name to LOOM_ALLOWED_HOSTS", 403)
        try:
            self.services.authenticate(request.headers)
        except LoomError as error:
            if error.status != 401:
                raise
            return _refusal(REFUSED, f"{error.code}: {error.message}", 401,
                            {"WWW-Authenticate": 'Bearer realm="loom"'}, data=error.to_dict())
        return None

    def post(self) -> Response:
        refused = self.refuse_caller()
        if refused is not None:
            return refused
        has_json, _ = check_accept_headers(request)  # type: ignore[arg-type]
        if not has_json:
            return _refusal(types.INVALID_REQUEST,
                            "Not Acceptable: the client must accept application/json", 406)
        if request.mimetype != "application/json":
            return _refusal(types.INVALID_REQUEST,
                            "Unsupported Media Type: Content-Type must be application/json", 415)
        version = request.headers.get(PROTOCOL_VERSION_HEADER)
        try:
            raw = json.loads(request.get_data())
        except ValueError as exc:
            return _refusal(types.PARSE_ERROR, f"Parse error: {exc}", 400)
        try:
            message = types.jsonrpc_message_adapter.validate_python(raw, by_name=False)
        except ValidationError as exc:
            return _refusal(types.INVALID_REQUEST, f"Validation error: {exc}", 400)
        if not isinstance(message, types.JSONRPCRequest):
            return Response(status=202)  # a notification or a response: nothing to answer
        if (version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS
                and message.method != "server/discover"):
            return _refusal(types.INVALID_REQUEST,
                            f"Bad Request: unsupported protocol version {version!r}; supported: "
                            + ", ".join(HANDSHAKE_PROTOCOL_VERSIONS), 400)
        return self.answer(message)

    def answer(self, message: types.JSONRPCRequest) -> Response:
        method, params = message.method, message.params or {}
        if method == "initialize":
            try:
                asked = types.InitializeRequestParams.model_validate(params).protocol_version
            except ValidationError as exc:
                return _jsonrpc(message.id, error=types.ErrorData(
                    code=types.INVALID_PARAMS, message=f"Invalid params: {exc}"))
            agreed = asked if asked in HANDSHAKE_PROTOCOL_VERSIONS else LATEST_HANDSHAKE_VERSION
            return _jsonrpc(message.id, result={**self.initialize_result,
                                                "protocolVersion": agreed})
        if method == "ping":
            return _jsonrpc(message.id, result={})
        if method == "tools/list":
            return _jsonrpc(message.id, result=self.tools_result)
        if method == "tools/call":
            try:
                call = types.CallToolRequestParams.model_validate(params)
            except ValidationError as exc:
                return _jsonrpc(message.id, error=types.ErrorData(
                    code=types.INVALID_PARAMS, message=f"Invalid params: {exc}"))
            result = self.mcp.call(call.name, call.arguments,
                                   request.headers.get("Authorization") or None)
            return _jsonrpc(message.id, result=_result(result))
        # server/discover (the 2026 era's probe) among them: a client falls back to initialize.
        return _jsonrpc(message.id, error=types.ErrorData(
            code=types.METHOD_NOT_FOUND, message=f"Method not found: {method}"))

    def no_stream(self) -> Response:
        refused = self.refuse_caller()
        if refused is not None:
            return refused
        return _refusal(-32000, "Method Not Allowed: this server offers no event stream; send "
                        "each request with POST", 405, {"Allow": "POST"})


def register_mcp(app: Flask, services: Services) -> None:
    """``/mcp`` on ``app``: POST for messages; GET, HEAD and DELETE answer 405."""
    endpoint = MCPEndpoint(app, services)
    blueprint = Blueprint("mcp", __name__)
    blueprint.add_url_rule(MCP_PATH, "post", endpoint.post, methods=["POST"])
    blueprint.add_url_rule(MCP_PATH, "no_stream", endpoint.no_stream,
                           methods=["GET", "DELETE"])
    app.register_blueprint(blueprint)
