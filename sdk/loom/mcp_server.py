"""Loom's MCP server: every Loom op as the MCP tool ``loom_<op with . as _>`` (or the name the
registry declares where the seed gives one: ``loom_search`` is memory.unified_search).

The tools, their input JSON Schemas and their listing come from the committed manifest
(``loom.ops_manifest``), so this process imports neither Flask nor the server's code. A
tool call is a call of the HTTP API (``LOOM_API_URL``) through the SDK's transport, with the
caller's token: ``LOOM_API_KEY``, or over Streamable HTTP the ``Authorization`` header the
MCP client sent, when it sent one. Auth, validation and identity stay in the API; an API
error comes back as an ``isError`` result whose text is the error object with its code.

Toolsets (``LOOM_MCP_TOOLSETS`` or ``--toolsets``, comma-separated):

- ``all`` (default): the ops the registry lists under the MCP ``all`` toolset;
- ``full``: every op that is an MCP tool;
- a plane name (``working_memory``): every MCP op of that plane.

Ops declared ``mcp=False`` (agent state) are never tools. A tool outside the chosen toolsets
is neither listed nor served.

``LOOM_MCP_ORG``, ``LOOM_MCP_NAMESPACE`` and ``LOOM_MCP_AGENT`` fill those identity fields
when a call leaves them out, so a desktop client need not repeat them on every call.

Run ``loom-mcp stdio`` (or ``python -m loom.mcp_server stdio``) for a desktop client, or
``loom-mcp http --host 0.0.0.0 --port 8001`` for Streamable HTTP at ``/mcp`` (stateless,
JSON answers) on another machine than the API. The web process serves the same tools at its
own ``/mcp`` (``app.mcp_web``, through ``LoomMCP`` with an in-process transport).

Over HTTP, whoever reaches the port is a caller: each call carries the caller's own token.
``LOOM_API_KEY`` is sent for a caller without one only when ``LOOM_MCP_HTTP_SERVER_KEY`` is on
(on stdio the desktop user who started the process is the caller, and it is always sent);
with ``LOOM_AUTH=on`` and no opt-in, a request without a bearer token is refused with 401
before it reaches the MCP layer. Every bind checks ``Host`` and ``Origin`` (the MCP SDK's
``TransportSecuritySettings``) against the loopback names and ``LOOM_ALLOWED_HOSTS``, so a web
page that rebinds a name to this machine cannot call the tools.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
import anyio.to_thread

# The ``mcp`` extra brings these; ``pip install ./sdk`` alone does not, and ``mypy --strict -p
# loom`` must pass there too (tests/test_sdk_distribution.py), so a missing module is no
# error (and where the extra is installed the ignore is unused, which is no error either).
import mcp_types as types  # type: ignore[import-not-found, unused-ignore]
from mcp.server.lowlevel import Server  # type: ignore[import-not-found, unused-ignore]
from mcp.server.stdio import stdio_server  # type: ignore[import-not-found, unused-ignore]
from mcp.server.transport_security import TransportSecuritySettings  # type: ignore[import-not-found, unused-ignore]
from starlette.datastructures import Headers  # type: ignore[import-not-found, unused-ignore]
from starlette.responses import JSONResponse  # type: ignore[import-not-found, unused-ignore]
from starlette.types import ASGIApp, Receive, Scope, Send  # type: ignore[import-not-found, unused-ignore]

from loom._version import __version__
from loom.calls import Call
from loom.errors import LoomError
from loom.ops_manifest import OPS
from loom.transport import DEFAULT_TIMEOUT, Transport

TOOLSETS_ENV = "LOOM_MCP_TOOLSETS"
DEFAULT_TOOLSETS = ("all",)
IDENTITY_ENV = {
    "org": "LOOM_MCP_ORG",
    "namespace": "LOOM_MCP_NAMESPACE",
    "agent": "LOOM_MCP_AGENT",
}
ALLOWED_HOSTS_ENV = "LOOM_ALLOWED_HOSTS"
SERVER_KEY_ENV = "LOOM_MCP_HTTP_SERVER_KEY"
# The names a client on this machine reaches it by; what LOOM_ALLOWED_HOSTS adds to.
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
CLIENT_NAME = f"loom-mcp/{__version__}"
INSTRUCTIONS = (
    "Loom holds the context an agent is told every time: working-memory blocks (leases, "
    "cursors, checkpoints, 'where was I') and profile sections. Write a block with "
    "loom_working_memory_set or loom_working_memory_append; read the blocks in scope with "
    "loom_working_memory_render."
)


def tool_name(op: str) -> str:
    return "loom_" + op.replace(".", "_")


@dataclass(frozen=True)
class LoomTool:
    op: str
    entry: Mapping[str, Any]
    # Identity fields this server fills when a call leaves them out (LOOM_MCP_NAMESPACE, ...).
    filled: frozenset[str] = frozenset()

    @property
    def name(self) -> str:
        return str(self.entry.get("tool") or tool_name(self.op))

    def call_schema(self) -> dict[str, Any]:
        """What a call's arguments must be (checked before the call is sent)."""
        return call_schema(self.entry, self.filled)

    def describe(self) -> types.Tool:
        kind = self.entry["kind"]
        return types.Tool(
            name=self.name,
            title=self.op,
            description=(
                f"{self.entry['summary']} (Loom op {self.op}; role {self.entry['role']}, {kind})"
            ),
            input_schema=portable_schema(self.call_schema()),
            annotations=types.ToolAnnotations(
                read_only_hint=kind == "read",
                idempotent_hint=kind in ("read", "idempotent"),
                open_world_hint=False,
            ),
        )


# What a JSON value may be, spelled with one ``type`` per branch.
ANY_JSON_VALUE: dict[str, Any] = {
    "anyOf": [{"type": kind} for kind in ("string", "number", "boolean", "object", "array")]
}
# JavaScript reads integers exactly up to 2^53 - 1 (Number.MAX_SAFE_INTEGER).
MAX_SAFE_INTEGER = 2**53 - 1
SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
# Keywords that describe a schema without constraining it.
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "deprecated",
                         "readOnly", "writeOnly", "$comment"})


# A property that may be any JSON object (a JSON Schema document, a row's value) also has a
# companion ``<name>_json`` taking it as JSON text: a strict-mode client (every object closed
# and fully declared) cannot send an open object, but it can send a string.
JSON_TEXT_SUFFIX = "_json"


def call_schema(entry: Mapping[str, Any], filled: Iterable[str] = ()) -> dict[str, Any]:
    """The op's input schema as this server takes a call: the identity the op needs is
    required unless the server fills it, and an open-object property may come as JSON text."""
    schema = copy.deepcopy(dict(entry["input_schema"]))
    properties: dict[str, Any] = schema.setdefault("properties", {})
    required: list[str] = list(schema.get("required", []))
    for name in entry.get("identity_required", ()):
        if name in filled or name not in properties or name in required:
            continue
        required.append(name)
        properties[name] = _without_null(properties[name])  # null would be "left out"
    rules: list[dict[str, Any]] = []
    for name in [name for name, sub in properties.items() if _may_be_open_object(sub)]:
        properties[name + JSON_TEXT_SUFFIX] = {
            "type": "string", "minLength": 1,
            "description": f"{name} as JSON text, for a client that cannot send an object; "
                           f"give {name} or this, not both.",
        }
        both = [_given(name), _given(name + JSON_TEXT_SUFFIX)]
        rules.append({"not": {"allOf": both}})
        if name in required:
            required.remove(name)
            rules.append({"anyOf": both})
    if required:
        schema["required"] = required
    if rules:
        schema["allOf"] = [*schema.get("allOf", []), *rules]
    return schema


def _given(name: str) -> dict[str, Any]:
    """The property is there and not null (a null is one left out)."""
    return {"required": [name], "properties": {name: {"not": {"type": "null"}}}}


def _without_null(prop: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(prop)
    kinds = out.get("type")
    if isinstance(kinds, list):
        kinds = [kind for kind in kinds if kind != "null"]
        out["type"] = kinds[0] if len(kinds) == 1 else kinds
    if isinstance(out.get("enum"), list):
        out["enum"] = [item for item in out["enum"] if item is not None]
    if out.get("default", 0) is None:
        del out["default"]
    return out


def _may_be_open_object(prop: Mapping[str, Any]) -> bool:
    """Whether ``prop`` admits a JSON object with properties it does not declare, at its top
    or inside it (a JSON Schema document's ``properties``: names of the caller's choosing)."""
    if "$ref" in prop:
        return False  # a nested schema of the registry declares its properties
    if set(prop) <= ANNOTATIONS:
        return True  # any JSON value
    kinds = prop.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    return "object" in kinds and not _declares_every_key(prop)


def _declares_every_key(schema: Mapping[str, Any]) -> bool:
    """An object schema that names each key its instances may hold, and whose nested object
    schemas do too: what a strict-mode client can send as it is."""
    if (not schema.get("properties") or schema.get("additionalProperties", True) is not False
            or "patternProperties" in schema):
        return False
    nested: list[Any] = [*schema["properties"].values(), schema.get("items")]
    while nested:
        sub = nested.pop()
        if not isinstance(sub, Mapping) or "$ref" in sub:
            continue
        for keyword in ("anyOf", "oneOf", "allOf"):
            nested.extend(sub.get(keyword, ()))
        kinds = sub.get("type")
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if "object" in kinds and not _declares_every_key(sub):
            return False
        if "array" in kinds:
            nested.append(sub.get("items"))
    return True


def decode_json_text(
    arguments: Mapping[str, Any], properties: Iterable[str]
) -> dict[str, Any]:
    """``arguments`` with each ``<name>_json`` given decoded into ``<name>`` (ValueError when
    it is not JSON); a null argument is one left out."""
    decoded = {key: value for key, value in arguments.items() if value is not None}
    for name in properties:
        text = decoded.pop(name + JSON_TEXT_SUFFIX, None)
        if text is not None:
            if name in decoded:
                raise ValueError(f"give {name} or {name}{JSON_TEXT_SUFFIX}, not both")
            try:
                decoded[name] = json.loads(text)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{name}{JSON_TEXT_SUFFIX} is not JSON text: {exc}") from None
    return decoded


def portable_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A tool input schema that clients with a single-``type`` dialect accept as it is.

    The registry's schemas are JSON Schema from OpenAPI 3.1, where an optional field reads
    ``{"type": ["string", "null"], "default": null}``. For a tool, null means "left out", so an
    optional field is simply one that is not required: its type loses ``"null"`` (and an enum
    its ``null``), and a ``null`` default is dropped. A schema that allows anything (``{}``,
    or only a description) says so in one-type branches. Validation of a call still uses the
    registry's schema, so a client that sends ``null`` for a field it leaves out is not
    refused.
    """
    listed = copy.deepcopy(dict(schema))
    properties: dict[str, Any] = listed.get("properties", {})
    for name in [name for name in properties if name + JSON_TEXT_SUFFIX in properties]:
        kept = _closed_branches(properties[name])
        if kept is None:
            del properties[name]  # an object only: it comes as JSON text
        else:
            properties[name] = kept
    rules = list(listed.pop("allOf", []))
    for keyword in ("oneOf", "anyOf"):
        if keyword in listed:
            rules.append({keyword: listed.pop(keyword)})
    rules = [_as_conditional(rule) for rule in
             (_listed_rule(rule, properties, listed) for rule in rules) if rule]
    portable: dict[str, Any] = _portable(listed, top=True)
    # Rules over several fields stay exact, as if/then/else and not, which a strict-mode
    # converter (every property required, no anyOf at the root) leaves as they are.
    if len(rules) == 1:
        portable.update(rules[0])
    elif rules:
        portable["allOf"] = rules
    return portable


def _closed_branches(prop: Mapping[str, Any]) -> dict[str, Any] | None:
    """``prop`` without its open-object branch; None when an object is all it may be."""
    described = {key: value for key, value in prop.items() if key in ANNOTATIONS}
    if set(prop) <= ANNOTATIONS:
        branches = [{"type": kind} for kind in ("string", "number", "boolean", "array")]
        return {**described, "anyOf": branches}
    kinds = prop.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    others = [kind for kind in kinds if kind not in ("object", "null")]
    if not others:
        return None
    return {**described, "type": others[0] if len(others) == 1 else others}


def _as_conditional(rule: Mapping[str, Any]) -> dict[str, Any]:
    """A oneOf or anyOf of branches as nested if/then/else: the same instances pass."""
    if "oneOf" in rule:
        first, *rest = rule["oneOf"]
        if not rest:
            return dict(first)
        return {"if": first, "then": {"not": {"anyOf": rest}},
                "else": _as_conditional({"oneOf": rest})}
    if "anyOf" in rule:
        first, *rest = rule["anyOf"]
        if not rest:
            return dict(first)
        return {"if": first, "else": _as_conditional({"anyOf": rest})}
    return dict(rule)


def _listed_rule(rule: dict[str, Any], properties: Mapping[str, Any],
                 listed: dict[str, Any]) -> dict[str, Any]:
    """A rule naming a property the listing dropped (an object only, which comes as JSON
    text): "not both" goes, "one of the two" becomes the JSON text required."""
    text = json.dumps(rule)
    dropped = [
        name[: -len(JSON_TEXT_SUFFIX)] for name in properties
        if name.endswith(JSON_TEXT_SUFFIX) and name[: -len(JSON_TEXT_SUFFIX)] not in properties]
    for name in dropped:
        if f'"{name}"' not in text:
            continue
        if "not" in rule:
            return {}
        listed.setdefault("required", []).append(name + JSON_TEXT_SUFFIX)
        return {}
    stated: dict[str, Any] = _without_not_null(rule)
    return stated


def _without_not_null(node: Any) -> Any:
    """A rule as the listing says it: the listing offers no null, so "given and not null"
    is "given"."""
    if isinstance(node, list):
        return [_without_not_null(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _without_not_null(value) for key, value in node.items()}
    if isinstance(out.get("properties"), dict):
        out["properties"] = {key: value for key, value in out["properties"].items()
                             if value != {"not": {"type": "null"}}}
        if not out["properties"]:
            del out["properties"]
    return out


def _portable(node: Any, *, top: bool = False) -> Any:
    if isinstance(node, list):
        return [_portable(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    if not top and set(node) <= ANNOTATIONS:
        out.update(ANY_JSON_VALUE)  # "any value", said in a way every client reads
    for key, value in node.items():
        if key.startswith("x-"):
            continue  # an OpenAPI extension (x-loom-rules): the op checks it, no client need
        if key == "type" and isinstance(value, list):
            kinds = [kind for kind in value if kind != "null"]
            if len(kinds) == 1:
                out[key] = kinds[0]
            elif kinds:
                out.setdefault("anyOf", []).extend({"type": kind} for kind in kinds)
        elif key == "default" and value is None:
            continue
        elif key == "enum" and isinstance(value, list):
            out[key] = [item for item in value if item is not None]
        elif key in SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _portable(sub) for name, sub in value.items()}
        elif key in ("additionalProperties", "items") and value == {}:
            out[key] = True if key == "additionalProperties" else dict(ANY_JSON_VALUE)
        else:
            out[key] = _portable(value)
    return out



def with_exact_integers(value: Any) -> Any:
    """``value`` with each integer past 2^53 also carried as a decimal string.

    A key ``version`` holding such a number gains ``version_text`` (the way
    ``profile.structured`` carries it, seed 003), unless the answer has one already; a list of
    them gains ``<key>_text`` as a list of strings. JavaScript clients round the number; the
    string is exact.
    """
    if isinstance(value, list):
        return [with_exact_integers(item) for item in value]
    if not isinstance(value, dict):
        return value
    out = {key: with_exact_integers(item) for key, item in value.items()}
    for key, item in value.items():
        text_key = f"{key}_text"
        if text_key in value:
            continue
        if _unsafe(item):
            out[text_key] = str(item)
        elif isinstance(item, list) and any(_unsafe(element) for element in item):
            out[text_key] = [str(element) if _is_int(element) else element for element in item]
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _unsafe(value: Any) -> bool:
    return _is_int(value) and abs(value) > MAX_SAFE_INTEGER


def parse_toolsets(text: str | None) -> tuple[str, ...]:
    names = tuple(part.strip() for part in (text or "").split(",") if part.strip())
    return names or DEFAULT_TOOLSETS


def select_tools(
    toolsets: Iterable[str], ops: Mapping[str, Mapping[str, Any]] = OPS,
    filled: Iterable[str] = (),
) -> dict[str, LoomTool]:
    """The tools the toolsets choose, by tool name; an unknown toolset is a ValueError.
    ``filled`` names the identity fields the server fills when a call leaves them out."""
    filled = frozenset(filled)
    planes = {name.split(".", 1)[0] for name in ops}
    chosen: dict[str, LoomTool] = {}
    for toolset in toolsets:
        if toolset not in ("all", "full") and toolset not in planes:
            known = ", ".join(["all", "full", *sorted(planes)])
            raise ValueError(f"unknown MCP toolset {toolset!r}; known: {known}")
        for op, entry in sorted(ops.items()):
            if not entry.get("mcp", True):
                continue  # agent state is never a tool
            if (
                toolset == "full"
                or (toolset == "all" and entry.get("listed", True))
                or op.split(".", 1)[0] == toolset
            ):
                tool = LoomTool(op, entry, filled)
                chosen[tool.name] = tool
    return dict(sorted(chosen.items()))


def _text_result(payload: dict[str, Any], *, is_error: bool) -> types.CallToolResult:
    payload = with_exact_integers(payload)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(payload, ensure_ascii=False))],
        structured_content=payload,
        is_error=is_error,
    )


def error_result(error: LoomError) -> types.CallToolResult:
    return _text_result({"error": error.to_dict()}, is_error=True)


class LoomMCP:
    """The MCP face of one Loom API: the chosen tools and the calls behind them."""

    def __init__(
        self,
        *,
        api_url: str | None = None,
        api_key: str | None = None,
        toolsets: Iterable[str] = DEFAULT_TOOLSETS,
        identity: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        ops: Mapping[str, Mapping[str, Any]] = OPS,
    ) -> None:
        self.identity = {k: v for k, v in (identity or {}).items() if v}
        self.tools = select_tools(toolsets, ops, filled=self.identity)
        self._api_url, self._api_key, self._timeout = api_url, api_key, timeout
        # requests.Session is not made for sharing across threads: one per worker thread.
        self._local = threading.local()

    @classmethod
    def from_env(cls, toolsets: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                 *, server_key: bool = True) -> LoomMCP:
        """From the environment; ``server_key=False`` never sends ``LOOM_API_KEY``."""
        return cls(
            api_key=None if server_key else "",
            toolsets=parse_toolsets(toolsets or os.environ.get(TOOLSETS_ENV)),
            identity={field: os.environ.get(env, "") for field, env in IDENTITY_ENV.items()},
            timeout=timeout,
        )

    def new_transport(self) -> Transport:
        """The SDK transport a thread's calls go through (the web process mounts an
        in-process adapter on its session)."""
        return Transport(
            self._api_url, self._api_key, timeout=self._timeout, client_name=CLIENT_NAME
        )

    def _transport(self) -> Transport:
        transport = getattr(self._local, "transport", None)
        if transport is None:
            transport = self._local.transport = self.new_transport()
        return transport

    def call(
        self, tool: str, arguments: Mapping[str, Any] | None, authorization: str | None = None
    ) -> types.CallToolResult:
        """One tool call, blocking: the op's HTTP call and its answer as a tool result."""
        found = self.tools.get(tool)
        if found is None:
            return _text_result(
                {"error": {"code": "UNKNOWN_TOOL", "message": f"no tool named {tool!r}",
                           "tools": sorted(self.tools)}},
                is_error=True,
            )
        entry = found.entry
        try:
            # A null argument is one left out (strict-mode clients send every argument), so
            # it never hides this server's identity defaults.
            given = decode_json_text(arguments or {}, found.call_schema()["properties"])
        except ValueError as exc:
            return _text_result(
                {"error": {"code": "VALIDATION_ERROR", "message": str(exc), "status": 422}},
                is_error=True,
            )
        body = {**self.identity, **given}
        call: Call[Any] = Call(
            found.op, body, kind=entry.get("kind", "write"),
            http_method=entry.get("http_method", "POST"), path=entry.get("path"),
        )
        try:
            answer = self._transport().send(call, authorization=authorization)
        except LoomError as error:
            return error_result(error)
        return _text_result(answer, is_error=False)

    async def on_list_tools(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool.describe() for tool in self.tools.values()])

    async def on_call_tool(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        authorization = _caller_authorization(ctx)
        return await anyio.to_thread.run_sync(
            partial(self.call, params.name, params.arguments, authorization)
        )

    def input_schema(self, name: str) -> Mapping[str, Any] | None:
        found = self.tools.get(name)
        return found.call_schema() if found is not None else None

    def server(self) -> Server[Any]:
        return Server(
            "loom",
            version=__version__,
            title="Loom",
            instructions=INSTRUCTIONS,
            get_tool_input_schema=self.input_schema,
            on_list_tools=self.on_list_tools,
            on_call_tool=self.on_call_tool,
        )


def _caller_authorization(ctx: Any) -> str | None:
    """The MCP client's own ``Authorization`` header (Streamable HTTP only; None on stdio)."""
    request = getattr(ctx, "request", None)
    headers = getattr(request, "headers", None)
    if headers is None:
        return None
    value = headers.get("authorization")
    return value or None


async def serve_stdio(loom: LoomMCP) -> None:
    server = loom.server()
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def listen_host(environ: Mapping[str, str]) -> str:
    """``HOST`` when set; else loopback unless ``LOOM_AUTH=on``: with auth off anyone who
    reaches the port can read and write everything, so an unprotected server stays local."""
    host = environ.get("HOST", "").strip()
    if host:
        return host
    return "0.0.0.0" if environ.get("LOOM_AUTH", "off").strip().lower() == "on" else "127.0.0.1"


def _on(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def auth_on(environ: Mapping[str, str]) -> bool:
    return environ.get("LOOM_AUTH", "off").strip().lower() == "on"


def sends_server_key_over_http(environ: Mapping[str, str]) -> bool:
    """Whether an HTTP caller without a token is given ``LOOM_API_KEY``: only by opt-in."""
    return _on(environ, SERVER_KEY_ENV)


def allowed_host_names(environ: Mapping[str, str]) -> tuple[str, ...] | None:
    """The Host names answered: loopback and ``LOOM_ALLOWED_HOSTS``; None when it lists ``*``.

    The web process reads the same setting through ``app.settings`` (which this process does
    not import); a test holds both to one rule.
    """
    extra = tuple(part.strip().lower()
                  for part in environ.get(ALLOWED_HOSTS_ENV, "").split(",") if part.strip())
    if "*" in extra:
        return None
    return tuple(dict.fromkeys((*LOOPBACK_NAMES, *extra)))


def transport_security(environ: Mapping[str, str]) -> TransportSecuritySettings:
    """Host and Origin checks for every bind, not only the loopback ones the SDK guards
    by itself: each allowed name on any port, and its http and https origins."""
    names = allowed_host_names(environ)
    if names is None:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[form for name in names for form in (name, f"{name}:*")],
        allowed_origins=[f"{scheme}://{name}{port}" for name in names
                         for scheme in ("http", "https") for port in ("", ":*")],
    )


async def _refuse(scope: Scope, receive: Receive, send: Send, code: int, message: str,
                  status: int, headers: dict[str, str]) -> None:
    """Answer an HTTP request before the MCP app sees it: a JSON-RPC error with no id (there
    is no request to answer yet) and the HTTP status and headers that say why."""
    refusal = JSONResponse({"jsonrpc": "2.0", "id": None,
                            "error": {"code": code, "message": message}},
                           status_code=status, headers=headers)
    await refusal(scope, receive, send)


class CallerTokenRequired:
    """ASGI: a request without ``Authorization: Bearer <token>`` answers 401, since with auth
    on and no server key a call could only fail, and the refusal should not wait for one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                await _refuse(
                    scope, receive, send, -32001,
                    "AUTH_REQUIRED: auth is on: send Authorization: Bearer <token> (this "
                    "server does not lend its own key)",
                    401, {"WWW-Authenticate": 'Bearer realm="loom"'})
                return
        await self.app(scope, receive, send)


class NoEventStream:
    """ASGI: ``GET`` on the MCP path answers 405 at once. The app is stateless with JSON
    answers, so it never sends a server-initiated message, and the SDK's own GET handler would
    hold an event stream open with nothing ever on it: a plain HTTP client waited forever.
    The Streamable HTTP transport allows exactly this answer ("405 Method Not Allowed,
    indicating that the server does not offer an SSE stream at this endpoint"), and clients
    read it as "no stream" and go on with POST."""

    def __init__(self, app: ASGIApp, path: str) -> None:
        self.app = app
        self.path = path.rstrip("/") or "/"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["method"] in ("GET", "HEAD")
                and (scope["path"].rstrip("/") or "/") == self.path):
            await _refuse(
                scope, receive, send, -32000,
                "Method Not Allowed: this server offers no event stream; send each request "
                "with POST",
                405, {"Allow": "POST"})
            return
        await self.app(scope, receive, send)


def http_app(loom: LoomMCP, *, host: str, path: str = "/mcp",
             environ: Mapping[str, str] | None = None) -> Any:
    """The Streamable HTTP app: stateless, JSON answers (no SSE streams to keep open: a GET is
    405 at once), Host and Origin checked, and with auth on a caller token required unless
    the operator lends the server's key (``LOOM_MCP_HTTP_SERVER_KEY``)."""
    environ = os.environ if environ is None else environ
    app = NoEventStream(loom.server().streamable_http_app(
        streamable_http_path=path, json_response=True, stateless_http=True, host=host,
        transport_security=transport_security(environ),
    ), path)
    if auth_on(environ) and not sends_server_key_over_http(environ):
        return CallerTokenRequired(app)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="loom-mcp", description="Loom's MCP server.")
    parser.add_argument(
        "--toolsets", default=None,
        help=f"comma-separated: all, full or plane names (default ${TOOLSETS_ENV} or 'all')",
    )
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT,
        help="seconds to wait for the Loom API on each call",
    )
    transports = parser.add_subparsers(dest="transport", required=True)
    transports.add_parser("stdio", help="serve one MCP client over stdin/stdout")
    http = transports.add_parser("http", help="serve Streamable HTTP (stateless, JSON)")
    http.add_argument(
        "--host", default=None,
        help="default: $HOST, else 127.0.0.1 unless LOOM_AUTH=on (then 0.0.0.0)",
    )
    http.add_argument("--port", type=int, default=8001)
    http.add_argument("--path", default="/mcp")
    args = parser.parse_args(argv)
    server_key = args.transport == "stdio" or sends_server_key_over_http(os.environ)
    try:
        loom = LoomMCP.from_env(args.toolsets, timeout=args.timeout, server_key=server_key)
    except ValueError as exc:
        parser.error(str(exc))
    if args.transport == "stdio":
        anyio.run(serve_stdio, loom)
        return 0
    import uvicorn  # type: ignore[import-not-found, unused-ignore]

    host = args.host or listen_host(os.environ)
    uvicorn.run(
        http_app(loom, host=host, path=args.path), host=host, port=args.port, log_level="warning",
        # One process, always: uvicorn would otherwise take WEB_CONCURRENCY (the web
        # process's setting) as its worker count, and refuses workers for an app object.
        workers=1,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
