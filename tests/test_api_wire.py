"""Wire conventions shared by every op: body parsing, error shape, unknown ops, OpenAPI."""

from __future__ import annotations

import re

import pytest

from app.registry import REGISTRY

OP = "/v1/working_memory.set"
BODY = {"namespace": "n", "agent": "a"}


def test_malformed_json_is_400(client):
    response = client.post(OP, data=b'{"namespace": ', content_type="application/json")
    assert response.status_code == 400
    assert response.get_json()["error"]["code"] == "MALFORMED_JSON"


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"text"', b"42", b"null"])
def test_a_body_that_is_not_an_object_is_400(client, raw):
    response = client.post(OP, data=raw, content_type="application/json")
    assert response.status_code == 400
    assert response.get_json()["error"]["code"] == "MALFORMED_JSON"


def test_wrong_content_type_is_400(client):
    response = client.post(OP, data=b'{"namespace": "n"}', content_type="text/plain")
    assert response.status_code == 400
    assert response.get_json()["error"]["code"] == "UNSUPPORTED_CONTENT_TYPE"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"namespace": "n", "agent": "a", "content": "\\ud800"}',
        b'{"namespace": "n", "agent": "a", "char_limit": NaN}',
        b'{"namespace": "n", "agent": "a", "content": "\xff"}',
    ],
)
def test_unstorable_text_and_non_json_numbers_are_400(client, raw):
    response = client.post(OP, data=raw, content_type="application/json")
    assert response.status_code == 400
    assert response.get_json()["error"]["code"] == "MALFORMED_JSON"


def test_deeply_nested_json_is_a_4xx_not_a_500(client):
    raw = b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    response = client.post(OP, data=raw, content_type="application/json")
    assert 400 <= response.status_code < 500


def test_an_oversized_body_is_413_and_writes_nothing(app_factory, redis_client):
    client = app_factory(max_body_bytes=2048).test_client()
    response = client.post(OP, json={**BODY, "content": "x" * 4000})
    assert response.status_code == 413
    assert response.get_json()["error"]["code"] == "BODY_TOO_LARGE"
    assert redis_client.dbsize() == 0


def test_unknown_op_is_404_with_a_code(client):
    response = client.post("/v1/working_memory.explode", json=BODY)
    assert response.status_code == 404
    assert response.get_json()["error"] == {
        "code": "UNKNOWN_OP",
        "message": "no op named 'working_memory.explode'",
        "op": "working_memory.explode",
    }


def test_unknown_path_and_wrong_method(client):
    assert client.get("/nowhere").get_json()["error"]["code"] == "NOT_FOUND"
    response = client.get(OP)
    assert response.status_code == 405
    assert response.get_json()["error"]["code"] == "METHOD_NOT_ALLOWED"


def test_an_empty_body_is_an_empty_object(client):
    response = client.post(OP)
    assert response.status_code == 422
    assert response.get_json()["error"]["code"] == "IDENTITY_INCOMPLETE"


def test_a_body_of_no_bytes_is_an_empty_object(client):
    response = client.post(OP, data=b"", content_type="application/json")
    assert response.status_code == 422
    assert response.get_json()["error"]["code"] == "IDENTITY_INCOMPLETE"


@pytest.mark.parametrize("blank", [b" ", b" \t\r\n ", b"\x0c", b" \x0b ", b"\x1c"])
def test_a_body_of_whitespace_alone_is_no_json(client, blank):
    response = client.post(OP, data=blank, content_type="application/json")
    assert response.status_code == 400
    assert response.get_json()["error"]["code"] == "MALFORMED_JSON"


def test_validation_names_every_bad_field(client):
    response = client.post(OP, json={**BODY, "content": 1, "char_limit": "x", "block_key": ""})
    error = response.get_json()["error"]
    assert response.status_code == 422
    assert set(error["fields"]) == {"content", "char_limit", "block_key"}
    assert "content" in error["message"]


def test_openapi_documents_every_op_from_the_registry(client):
    spec = client.get("/openapi.json").get_json()
    assert len(REGISTRY) > 0
    for declared in REGISTRY:
        # Flask writes a path parameter <name>, OpenAPI {name}.
        path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", declared.http_path)
        operation = spec["paths"][path][declared.http_method.lower()]
        assert operation["operationId"] == declared.name
        assert operation["summary"] == declared.summary
        assert "200" in operation["responses"] and "422" in operation["responses"]
        if declared.http_method == "POST":
            body_schema = operation["requestBody"]["content"]["application/json"]["schema"]
            assert "$ref" in body_schema
        if declared.http_method == "GET":
            documented = {p["name"] for p in operation["parameters"]}
            assert set(declared.args().load_fields) <= documented
    schemas = spec["components"]["schemas"]
    set_args = schemas["WorkingMemorySetArgs"]["properties"]
    assert {"org", "namespace", "agent", "block_key", "content", "char_limit"} <= set(set_args)


def test_docs_ui_is_served(client):
    response = client.get("/docs")
    assert response.status_code == 200 and b"swagger" in response.data.lower()


def test_auth_off_an_org_the_body_names_is_listed_in_ignored_args(live_server):
    """Auth off, every call acts in the install's org whatever the body says (seed 000); the
    answer says the body's org went unused, and the block is where a call naming no org finds
    it. The install's own org, or a null, is no ignored field."""
    import requests

    who = {"namespace": "wire-org", "agent": "a", "block_key": "k"}
    elsewhere = requests.post(f"{live_server.url}/v1/working_memory.set", timeout=10,
                              json={**who, "org": "acme", "content": "x"})
    assert elsewhere.status_code == 200
    assert elsewhere.json()["ignored_args"] == ["org"]
    found = requests.post(f"{live_server.url}/v1/working_memory.get", timeout=10,
                          json=who).json()
    assert found["found"] is True and found["content"] == "x"
    for org in ("default", None):
        own = requests.post(f"{live_server.url}/v1/working_memory.get", timeout=10,
                            json={**who, "org": org})
        assert own.json()["ignored_args"] == []
    unknown = requests.post(f"{live_server.url}/v1/working_memory.get", timeout=10,
                            json={**who, "org": "acme", "colour": "red"})
    assert unknown.json()["ignored_args"] == ["colour", "org"]
