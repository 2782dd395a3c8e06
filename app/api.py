"""The HTTP face of the registry: one route per op, the OpenAPI document, one error shape.

Every op in ``REGISTRY`` becomes ``POST /v1/<op>`` (or the path it declares), a view in a
Flask blueprint per plane, and an operation in flask-smorest's document (``api.spec.path``)
built from its schemas. Every op is served by its view, inside Flask's request cycle, so a
deployer's hooks, extensions and tracing see each one. A request goes: principal (401) ->
request budget (429) -> body read (413 past ``LOOM_MAX_BODY_BYTES``, chunked or not; 400 for
a wrong content type or malformed JSON) -> role (403) -> input schema (422 naming each
field) -> identity (403 outside the token's reach, 422 when incomplete) -> handler. Every
failure, ours or werkzeug's, leaves as ``{"error": {"code", "message", ...}}``.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable
from typing import Any

from flask import Blueprint, Flask, Response, current_app, got_request_exception, jsonify, request
from flask_smorest import Api
from marshmallow import Schema, ValidationError
from werkzeug.exceptions import HTTPException
from werkzeug.wsgi import get_content_length

from app import idempotency, logs, metrics
from app.auth import Principal, resolve_identity
from app.error_catalogue import ErrorSpec, codes_for_op, example_error
from app.errors import (
    AuthInsufficient,
    BodyTooLarge,
    InternalError,
    LoomError,
    MalformedJson,
    MethodNotAllowed,
    RouteNotFound,
    UnknownOp,
    UnsupportedContentType,
    ValidationFailed,
)
from app.registry import Call, Op, OpRegistry
from app.schemas import contract, openapi
from app.schemas.common import ErrorAnswer, without_absent_nulls
from app.schemas.fastload import compile_loader
from app.services import Services
from app.store.connection import UNAVAILABLE_ERRORS, store_unavailable

log = logging.getLogger("loom.api")

IDEMPOTENCY_NOTE = (
    f"\n\nSend an `{idempotency.HEADER}` header (1 to {idempotency.MAX_KEY_LENGTH} printable "
    "ASCII characters) to make a retry safe: a repeat within a day answers the first answer "
    "and applies nothing; the same key with another body is 422 `IDEMPOTENCY_KEY_REUSED`, "
    "and a repeat while the first call runs is 409 `IDEMPOTENCY_IN_PROGRESS`."
)


def error_responses(op: Op) -> dict[str, list[ErrorSpec]]:
    """The catalogue's entries an op can answer (``codes_for_op``), by status."""
    by_status: dict[str, list[ErrorSpec]] = {}
    for entry in codes_for_op(op):
        by_status.setdefault(str(entry.status), []).append(entry)
    return dict(sorted(by_status.items()))


def error_response_doc(entries: list[ErrorSpec]) -> dict[str, Any]:
    """One status's response: its codes in the description, one example per code, and the
    codes as ``x-error-codes`` for a client that reads them."""
    return {
        "description": " · ".join(f"`{entry.code}`: {entry.meaning}" for entry in entries),
        "x-error-codes": [entry.code for entry in entries],
        "content": {"application/json": {
            "schema": ErrorAnswer,
            "examples": {entry.code: {"summary": entry.meaning,
                                      "value": {"error": example_error(entry)}}
                         for entry in entries},
        }},
    }


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# json.loads builds a new decoder for every call that passes options; one is enough.
_decode_body = json.JSONDecoder(parse_constant=_reject_constant).decode


def _body_bytes(environ: dict[str, Any], max_bytes: int) -> bytes:
    """At most ``max_bytes`` of body; 413 past it, whether or not a Content-Length says so.

    A chunked body has no length: werkzeug's own stream stops quietly at the limit (the cut
    text then reads as malformed JSON), so the server's terminated input is read here, never
    more than the limit and one byte."""
    length = get_content_length(environ)
    if length is not None and length > max_bytes:
        raise BodyTooLarge(f"body of {length} bytes is over {max_bytes}", max_bytes=max_bytes)
    if length is None:
        if environ.get("wsgi.input_terminated"):
            raw = environ["wsgi.input"].read(max_bytes + 1)
            if len(raw) > max_bytes:
                raise BodyTooLarge(f"body is over {max_bytes} bytes", max_bytes=max_bytes)
            return bytes(raw)
        # No length and an input the server does not end: there is no body to read safely
        # (werkzeug's get_input_stream answers an empty stream here too).
        return b""
    if not length:
        return b""
    # The length is known and within the limit: one read of the server's input, without the
    # stream werkzeug would build around it for this single use.
    raw = environ["wsgi.input"].read(length)
    if len(raw) < length:
        raise MalformedJson(f"the body ended after {len(raw)} of its {length} bytes")
    return bytes(raw)


def _mimetype(environ: dict[str, Any]) -> str:
    return str(environ.get("CONTENT_TYPE", "")).partition(";")[0].strip().lower()


def _is_json(mimetype: str) -> bool:
    # werkzeug's Request.is_json rule: application/json or application/*+json.
    return mimetype == "application/json" or (
        mimetype.startswith("application/") and mimetype.endswith("+json"))


def read_json_body(environ: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    """The request body as a JSON object; an empty body is ``{}``."""
    raw = _body_bytes(environ, max_bytes)
    # No bytes at all is no body (the document's optional one); whitespace alone is a body,
    # and no JSON text (RFC 8259 needs a value), so it is refused below like any other.
    if not raw:
        return {}
    mimetype = _mimetype(environ)
    if not _is_json(mimetype):
        raise UnsupportedContentType(
            "the body must be sent as application/json", content_type=mimetype
        )
    try:
        # Strict UTF-8 first: json.loads on bytes would let surrogates through to Redis.
        text = raw.decode("utf-8")
        body = _decode_body(text)
        if "\\ud" in text or "\\uD" in text:
            # An escaped lone surrogate parses, but cannot be stored or answered.
            json.dumps(body, ensure_ascii=False).encode("utf-8")
    except (ValueError, RecursionError) as exc:
        raise MalformedJson(f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise MalformedJson("the body must be a JSON object")
    return body


def load_args(schema_class: type[Schema], body: dict[str, Any]) -> dict[str, Any]:
    try:
        return _loader(schema_class)(without_absent_nulls(schema_class, body))
    except ValidationError as exc:
        messages = exc.messages if isinstance(exc.messages, dict) else {"_body": exc.messages}
        raise ValidationFailed(messages) from None


def _client_name(headers: Any) -> str:
    return str(headers.get("X-Loom-Client") or headers.get("User-Agent", ""))


def run_op(
    op: Op,
    body: dict[str, Any],
    principal: Principal,
    services: Services,
    client: str | Callable[[], str] = "",
    by_console: bool = False,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """Run one op for a principal: role, input schema, identity, handler, ``ignored_args``;
    with ``LOOM_VALIDATE_ANSWERS`` on, the answer is checked against the op's answer schema.
    A write op with an ``idempotency_key`` runs once per key (``app.idempotency``).

    The HTTP views and the ``flask loom`` commands both come through here, so an op behaves
    the same whichever way it is called.
    """
    if not principal.reaches_role(op.role):
        raise AuthInsufficient(
            f"{op.name} needs the {op.role} role; this token has {principal.role}",
            required_role=op.role,
        )
    args = load_args(op.args, body)
    identity = resolve_identity(op, principal, args)
    logs.bind(org=identity.org, namespace=identity.namespace)
    call = Call(op, args, identity, principal, services, client, by_console)
    if op.cost is not None and services.settings.request_budget is not None:
        services.charge_cost(principal, op.cost(call))

    def completed(result: dict[str, Any]) -> dict[str, Any]:
        known = _known_fields(op.args)
        ignored = [name for name in body if name not in known]
        if principal.single_user and args.get("org") not in (None, identity.org):
            # Auth off: every call acts in the install's org (seed 000), so an org the body
            # names is not used, and the answer says so rather than act elsewhere silently.
            ignored.append("org")
        result["ignored_args"] = ignored
        return result

    def answer() -> dict[str, Any]:
        return completed(op.handler(call))

    if idempotency_key is not None and op.kind != "read":
        result = idempotency.run_once(call, idempotency_key, body, answer, completed)
    else:
        result = answer()
    if services.settings.validate_answers:
        contract.check_answer(op.name, result)
    return result


@functools.cache
def _loader(schema_class: type[Schema]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return compile_loader(schema_class())


@functools.cache
def _known_fields(schema_class: type[Schema]) -> frozenset[str]:
    fields = schema_class().load_fields
    return frozenset(field.data_key or name for name, field in fields.items())


_NO_HEADERS: dict[str, str] = {}
_IDEMPOTENCY_KEY = "HTTP_" + idempotency.HEADER.upper().replace("-", "_")


def make_view(op: Op, services: Services) -> Callable[..., Any]:
    """The op's Flask view: from the request to its answer (or a LoomError for the handlers).

    Who calls and whether their budget allows it come before any work on the body: a bad
    token or a spent budget costs no parse, and every such request is counted."""
    authenticate = services.authenticate
    check_budget = services.check_budget
    max_bytes = services.settings.max_body_bytes
    is_get = op.http_method == "GET"

    def view(**path_args: Any) -> dict[str, Any]:
        environ = request.environ
        # The request itself from its environ, where werkzeug's Request puts it: a read
        # through ``flask.request`` costs a proxy lookup each time.
        current = environ.get("werkzeug.request") or request
        headers = current.headers
        # A header the request lacks costs werkzeug's headers a raised KeyError: the two that
        # are often absent are read from the environ (authenticate reads only Authorization).
        principal: Principal = authenticate(
            headers if "HTTP_AUTHORIZATION" in environ else _NO_HEADERS)
        check_budget(principal)
        body = read_json_body(environ, max_bytes)
        if path_args:
            body = {**body, **path_args}
        if is_get and current.args:
            body = {**current.args.to_dict(), **body}
        return run_op(op, body, principal, services, lambda: _client_name(headers),
                      idempotency_key=environ.get(_IDEMPOTENCY_KEY))

    view.__name__ = op.name.replace(".", "_")
    view.__doc__ = op.summary
    return view


def operation_doc(op: Op, api: Api, auth_on: bool) -> dict[str, Any]:
    """The op's OpenAPI operation, with its schemas as classes (the marshmallow plugin turns
    them into components when the operation is given to ``spec.path``)."""
    responses: dict[str, Any] = {
        "200": {"description": "OK", "content": {"application/json": {"schema": op.answer}}}
    }
    for status, entries in error_responses(op).items():
        responses[status] = error_response_doc(entries)
    doc: dict[str, Any] = {
        "summary": op.summary,
        "tags": [op.plane],
        "description": (
            f"Role `{op.role}` · {op.kind}"
            + ("" if not op.mcp else f" · MCP `{op.mcp_name}`")
            + ("" if op.listed or not op.mcp else " · not listed under the MCP all toolset")
            + ("" if op.kind == "read" else IDEMPOTENCY_NOTE)
        ),
        "operationId": op.name,
        "responses": responses,
    }
    if op.http_method != "GET":
        content: dict[str, Any] = {"schema": op.args}
        if op.example:
            content["example"] = op.example
        doc["requestBody"] = {"required": openapi.body_required(op, auth_on),
                              "content": {"application/json": content}}
    else:
        in_path = set(re.findall(r"<(?:\w+:)?(\w+)>", op.http_path))
        doc["parameters"] = openapi.get_parameters(api, op, in_path, auth_on)
    return doc


def register_ops(app: Flask, api: Api, registry: OpRegistry, services: Services) -> None:
    """A Flask blueprint per plane serving its ops, and each op's operation in the document
    (``api.spec.path``), tagged with its plane."""
    ops_by_endpoint = app.extensions.setdefault("loom_ops_by_endpoint", {})
    auth_on = services.settings.auth == "on"
    for plane, ops in registry.planes().items():
        blueprint = Blueprint(plane, __name__)
        endpoints = {}
        for declared in ops:
            endpoint = declared.name.replace(".", "_")
            blueprint.add_url_rule(declared.http_path, endpoint=endpoint,
                                   view_func=make_view(declared, services),
                                   methods=[declared.http_method])
            endpoints[declared.name] = f"{plane}.{endpoint}"
            ops_by_endpoint[f"{plane}.{endpoint}"] = declared.name
        app.register_blueprint(blueprint)
        for declared in ops:
            rule = next(app.url_map.iter_rules(endpoints[declared.name]))
            api.spec.path(rule=rule, operations={
                declared.http_method.lower(): operation_doc(declared, api, auth_on)})
        api.spec.tag({"name": plane, "description": f"The {plane} plane"})


def error_answer(error: LoomError, op_name: str | None = None
                 ) -> tuple[int, dict[str, Any], list[tuple[str, str]]]:
    """The status, body and headers (``Retry-After``) of an error in Loom's one shape."""
    error = contract.checked_error(error, op_name)
    headers = []
    retry_after = error.details.get("retry_after")
    if retry_after is not None:
        headers.append(("Retry-After", str(retry_after)))
    return error.status, {"error": error.to_dict()}, headers


def error_response(error: LoomError) -> Response:
    status, body, headers = error_answer(error)
    response = jsonify(body)
    response.status_code = status
    for name, value in headers:
        response.headers[name] = value
    return response


def unavailable_error(error: Exception, path: str) -> LoomError:
    """The 503 for a store that is down, logged once and short: the failure is Redis's."""
    log.warning("store unavailable on %s: %s: %s", path, type(error).__name__, error)
    metrics.note_exception(error)
    return store_unavailable(error)


def internal_error(error: Exception, where: Any) -> LoomError:
    """The 500 for an error nothing expected, logged with its traceback."""
    metrics.note_exception(error)
    log.exception("unexpected error on %s", where)
    return InternalError("internal error; it has been logged")


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(LoomError)
    def handle_loom_error(error: LoomError) -> Response:
        if error.status >= 500:
            got_request_exception.send(app, exception=error)
        return error_response(error)

    # Flask sends got_request_exception only for an exception no handler takes; Loom's
    # handlers take every one, so they send it for the failures that are the server's (a
    # store down, a bug), as Flask would: error trackers and tracing hear of them. A refusal
    # of the caller's request (4xx) is an answer, not a failure, and sends nothing.
    def handle_store_unavailable(error: Exception) -> Response:
        got_request_exception.send(app, exception=error)
        return error_response(unavailable_error(error, request.path))

    for unavailable in UNAVAILABLE_ERRORS:
        app.register_error_handler(unavailable, handle_store_unavailable)

    @app.errorhandler(HTTPException)
    def handle_http_exception(error: HTTPException) -> Response:
        if error.code == 404:
            if request.path.startswith("/v1/"):
                name = request.path[len("/v1/"):]
                return error_response(UnknownOp(f"no op named {name!r}", op=name))
            return error_response(RouteNotFound(f"no route {request.path}"))
        if error.code == 405:
            response = error_response(
                MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
            )
            # RFC 9110: a 405 names the methods the resource does allow.
            allowed = getattr(error, "valid_methods", None) or []
            response.headers["Allow"] = ", ".join(sorted(allowed))
            return response
        if error.code == 413:
            max_bytes = current_app.config["MAX_CONTENT_LENGTH"]
            return error_response(BodyTooLarge(f"body is over {max_bytes} bytes"))
        if error.code == 400:
            return error_response(MalformedJson(error.description or "bad request"))
        generic = LoomError(error.description or error.name)
        generic.code = error.name.upper().replace(" ", "_")
        generic.status = error.code or 500
        return error_response(generic)

    @app.errorhandler(Exception)
    def handle_unexpected(error: Exception) -> Response:
        got_request_exception.send(app, exception=error)
        return error_response(internal_error(error, request.url_rule or "an unmatched route"))
