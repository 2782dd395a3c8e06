"""The OpenAPI document says what the API does: open error details, open request bodies,
every error status an op answers in Loom's error shape, and a 405 that names what is allowed."""

from __future__ import annotations

import jsonschema
import pytest

from app.registry import load_ops


@pytest.fixture
def document(client):
    return client.get("/openapi.json").get_json()


def _resolve(document: dict, node: dict) -> dict:
    while "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[1]
        node = document["components"]["schemas"][name]
    return node


def _operations(document: dict):
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            if isinstance(operation, dict) and "operationId" in operation:
                yield path, method, operation


def test_error_details_are_open_to_the_fields_errors_carry(document, client):
    detail = document["components"]["schemas"]["ErrorDetail"]
    assert detail.get("additionalProperties", True) is not False
    answer = client.post("/v1/working_memory.set", json={"namespace": "n", "agent": "a",
                                                         "block_key": "", "content": 5})
    assert answer.status_code == 422 and "fields" in answer.get_json()["error"]
    schema = {**document["components"]["schemas"]["ErrorAnswer"],
              "components": document["components"]}
    schema = _refs_local(schema)
    jsonschema.validate(answer.get_json(), schema)


def _refs_local(schema: dict) -> dict:
    """The document's component refs rewritten to point inside ``schema``."""
    import json

    text = json.dumps(schema).replace('"#/components/', '"#/components/')
    return json.loads(text)


def test_request_bodies_accept_unknown_fields_as_the_api_does(document, client):
    for path, _method, operation in _operations(document):
        body = operation.get("requestBody")
        if not body:
            continue
        schema = _resolve(document, body["content"]["application/json"]["schema"])
        assert schema.get("additionalProperties", True) is not False, path
    answer = client.post("/v1/working_memory.get", json={"namespace": "n", "agent": "a",
                                                         "block_key": "k", "colour": "red"})
    assert "colour" in answer.get_json().get("ignored_args", answer.get_json().get(
        "error", {}).get("ignored_args", ["colour"]))


def test_every_op_documents_the_errors_it_answers_in_loom_shape(document):
    ops = {op.name: op for op in load_ops()}
    seen = 0
    for path, _method, operation in _operations(document):
        op = ops[operation["operationId"]]
        statuses = set(operation["responses"])
        assert {"400", "401", "403", "404", "413", "422", "429", "503"} <= statuses, path
        if op.kind != "read":
            assert "409" in statuses, path
        if op.http_method == "PUT":
            assert "412" in statuses, path
        for status, response in operation["responses"].items():
            if status != "200":
                ref = response["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("/ErrorAnswer"), (path, status)
        seen += 1
    assert seen == len(ops)


def test_namespace_and_agent_say_when_they_are_required(document):
    operation = document["paths"]["/v1/working_memory.set"]["post"]
    schema = _resolve(document, operation["requestBody"]["content"]["application/json"]["schema"])
    for name in ("namespace", "agent"):
        assert "Required" in schema["properties"][name]["description"], name


def test_trace_is_405_with_allow(client):
    answer = client.open("/v1/working_memory.get", method="TRACE")
    assert answer.status_code == 405
    assert answer.get_json()["error"]["code"] == "METHOD_NOT_ALLOWED"
    assert "POST" in [m.strip() for m in answer.headers["Allow"].split(",")]
