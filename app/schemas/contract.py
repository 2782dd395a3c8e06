"""The OpenAPI document as a check on what Loom sends (``LOOM_VALIDATE_ANSWERS``).

With the setting on, every op's answer (``run_op``: HTTP, console and CLI alike) and every
error body (``app.api.error_response``) is validated against the schema the served document
declares for that op and status, and an error status the op does not list, or a code it does
not list for that status (its ``x-error-codes``, from ``app.error_catalogue.codes_for_op``), is
a mismatch too.
A mismatch is never sent as if it were fine: it becomes a ``500 ANSWER_CONTRACT_VIOLATION``
naming what differs, is logged, and is kept in ``VIOLATIONS`` (the test suite fails any test
that leaves one). The document is the one ``/openapi.json`` serves, turned from OpenAPI 3.0
(``nullable``) into plain JSON Schema, so the check says what a client's validator would say.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import jsonschema
from flask import Flask, current_app, has_app_context, has_request_context, request
from flask_smorest import Api

from app.errors import LoomError
from app.schemas.common import is_version_field

log = logging.getLogger("loom.contract")

# Every mismatch this process has found, for the test suite to fail on (bounded).
VIOLATIONS: list[str] = []
_MAX_KEPT = 100


class AnswerContractViolation(LoomError):
    """What Loom was about to send does not match its own OpenAPI document."""

    code = "ANSWER_CONTRACT_VIOLATION"
    status = 500


def _version_texts(properties: Any) -> dict[str, list[str]]:
    """Each integer version property with its ``<name>_text`` beside it: an answer that
    carries the one carries the other (``app.schemas.common.VersionText``)."""
    if not isinstance(properties, dict):
        return {}
    return {
        name: [f"{name}_text"] for name, prop in properties.items()
        if is_version_field(name) and isinstance(prop, dict) and prop.get("type") == "integer"
        and f"{name}_text" in properties
    }


def _json_schema(node: Any) -> Any:
    """An OpenAPI 3.0 schema as JSON Schema: ``nullable: true`` becomes a ``null`` type, and a
    version property makes its text required beside it."""
    if isinstance(node, list):
        return [_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: _json_schema(value) for key, value in node.items() if key != "nullable"}
    version_texts = _version_texts(node.get("properties"))
    if version_texts:
        converted["dependencies"] = {**version_texts, **converted.get("dependencies", {})}
    if node.get("nullable"):
        if isinstance(converted.get("type"), str) and "$ref" not in converted:
            converted["type"] = [converted["type"], "null"]
            if "enum" in converted:
                converted["enum"] = [*converted["enum"], None]
        else:
            converted = {"anyOf": [converted, {"type": "null"}]}
    return converted


class AnswerContract:
    """Validators for each op's documented answers, built from the document on first use."""

    def __init__(self, app: Flask, api: Api) -> None:
        self._app = app
        self._api = api
        self._lock = threading.Lock()
        self._responses: dict[str, dict[str, Any]] | None = None
        self._error_validator: jsonschema.Draft4Validator | None = None
        # Each op's error codes by status, and every code of the catalogue: an error answer
        # with a code its op does not list is a mismatch like a wrong shape.
        self._codes: dict[str, dict[str, frozenset[str]]] = {}
        self._catalogue: frozenset[str] = frozenset()

    def _load(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            if self._responses is None:
                self._build(self._api.spec.to_dict())
        assert self._responses is not None
        return self._responses

    def _build(self, document: dict[str, Any]) -> None:
        components = {"schemas": _json_schema(document["components"]["schemas"])}

        def validator(schema: dict[str, Any]) -> jsonschema.Draft4Validator:
            return jsonschema.Draft4Validator({**_json_schema(schema), "components": components})

        responses: dict[str, dict[str, Any]] = {}
        codes: dict[str, dict[str, frozenset[str]]] = {}
        for methods in document["paths"].values():
            for operation in methods.values():
                if not isinstance(operation, dict) or "operationId" not in operation:
                    continue
                responses[operation["operationId"]] = {
                    status: validator(answer["content"]["application/json"]["schema"])
                    for status, answer in operation["responses"].items()
                }
                codes[operation["operationId"]] = {
                    status: frozenset(answer.get("x-error-codes", ()))
                    for status, answer in operation["responses"].items() if status != "200"
                }
        self._error_validator = validator({"$ref": "#/components/schemas/ErrorAnswer"})
        self._codes = codes
        self._catalogue = frozenset(entry["code"] for entry in document["x-error-catalogue"])
        self._responses = responses

    def mismatch(self, op_name: str | None, status: int, body: Any) -> str | None:
        """What is wrong with sending ``body`` as ``status`` for ``op_name``, or None.

        ``op_name`` None is a route outside the ops (an unknown path, a method the route does
        not take): its error body still has to be Loom's error shape."""
        responses = self._load()
        if op_name is None:
            validator = self._error_validator
        else:
            validator = responses[op_name].get(str(status))
            if validator is None:
                return f"{op_name} answered {status}, a status its document does not list"
        assert validator is not None
        # What the client receives: the body as JSON, not the Python objects behind it.
        sent = json.loads(self._app.json.dumps(body))
        problems = sorted(
            f"{'/'.join(map(str, error.absolute_path)) or '(body)'}: {error.message}"
            for error in validator.iter_errors(sent)
        )
        if status != 200 and not problems:
            problems = self._code_problems(op_name, status, sent)
        if not problems:
            return None
        where = op_name or (request.path if has_request_context() else "(no route)")
        return f"{where} {status} does not match its schema: " + "; ".join(
            problems[:5]
        )

    def _code_problems(self, op_name: str | None, status: int, sent: Any) -> list[str]:
        """An error's code that the document does not list: for the op at that status (its
        ``x-error-codes``), or, outside the ops, anywhere in its ``x-error-catalogue``."""
        code = sent["error"]["code"]
        if op_name is None:
            listed = self._catalogue
        else:
            listed = self._codes[op_name].get(str(status), frozenset())
        if code in listed:
            return []
        return [f"code {code!r} is not one the document lists for {status}"]

    def violation(
        self, op_name: str | None, status: int, body: Any
    ) -> AnswerContractViolation | None:
        found = self.mismatch(op_name, status, body)
        if found is None:
            return None
        log.error("answer contract violation: %s", found)
        if len(VIOLATIONS) < _MAX_KEPT:
            VIOLATIONS.append(found)
        return AnswerContractViolation(found)


def install(app: Flask, api: Api) -> None:
    app.extensions["loom_contract"] = AnswerContract(app, api)


def check_answer(op_name: str, answer: dict[str, Any]) -> None:
    """Raise ``AnswerContractViolation`` unless ``answer`` is what ``op_name`` documents."""
    found = current_app.extensions["loom_contract"].violation(op_name, 200, answer)
    if found is not None:
        raise found


def checked_error(error: LoomError, op_name: str | None = None) -> LoomError:
    """``error``, or the violation to answer instead when its body is not what the document
    declares for the op (``op_name``, else the Flask request's) and the error's status. A 500
    is never checked: it is a failure already, and the violation's own answer is one."""
    # Outside an app context (a command's own call) there is no contract to check.
    if not has_app_context():
        return error
    contract: AnswerContract | None = current_app.extensions.get("loom_contract")
    if contract is None or error.status == 500:
        return error
    if op_name is None and has_request_context() and request.url_rule is not None:
        op_name = current_app.extensions["loom_ops_by_endpoint"].get(request.url_rule.endpoint)
    return contract.violation(op_name, error.status, {"error": error.to_dict()}) or error
