"""The OpenAPI document says what the API does: open error details, open request bodies,
every error status an op answers in Loom's error shape, a 405 that names what is allowed, the
identity each op requires when no token can fill it, and the rules apispec cannot see.
schemathesis holds the whole API to it in CI (.ci/api_contract.py)."""

from __future__ import annotations

import jsonschema
import pytest

from app import error_catalogue as catalogue
from app.ops import load_ops


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
        # What every op meets (the body, the token, its budget, the store) is always listed.
        assert {"400", "401", "403", "413", "422", "429", "503"} <= statuses, path
        if op.kind != "read":
            assert "409" in statuses, path
        if op.http_method == "PUT":
            assert "412" in statuses, path
        listed = set()
        for status, response in operation["responses"].items():
            if status != "200":
                ref = response["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("/ErrorAnswer"), (path, status)
                codes = response["x-error-codes"]
                assert {catalogue.status_of(code) for code in codes} == {int(status)}, path
                examples = response["content"]["application/json"]["examples"]
                assert set(examples) == set(codes), (path, status)
                listed |= set(codes)
        assert listed == {entry.code for entry in catalogue.codes_for_op(op)}, path
        assert set(op.raises) <= listed, path
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


def _args_schema(document: dict, path: str) -> dict:
    operation = next(iter(document["paths"][path].values()))
    return _resolve(document, operation["requestBody"]["content"]["application/json"]["schema"])


def test_with_auth_off_the_identity_an_op_needs_is_required(document, client):
    wm_set = _args_schema(document, "/v1/working_memory.set")
    assert {"namespace", "agent"} <= set(wm_set["required"])
    assert "nullable" not in wm_set["properties"]["namespace"]
    features = _args_schema(document, "/v1/features.get")
    assert "namespace" in features["required"] and "agent" not in features["properties"]
    erase = _args_schema(document, "/v1/user.erase")
    assert "user_id" in erase["required"]
    assert erase["properties"]["user_id"]["pattern"].startswith("^(?!-$)")
    status = _args_schema(document, "/v1/erasure.status")
    assert "user_id" not in status.get("required", [])
    assert [branch["required"] for branch in status["anyOf"]] == [["user_id"], ["erasure_id"]]
    # What the document says is what the API does: leaving either out is a 422.
    answer = client.post("/v1/working_memory.set", json={"namespace": "n"})
    assert answer.status_code == 422 and list(answer.get_json()["error"]["fields"]) == ["agent"]


def test_with_auth_on_a_token_may_fill_the_identity(app_factory):
    document = app_factory(auth="on", admin_token="t" * 32).test_client().get(
        "/openapi.json").get_json()
    wm_set = _args_schema(document, "/v1/working_memory.set")
    assert "namespace" not in wm_set.get("required", [])
    assert "agent" not in wm_set.get("required", [])


def test_a_body_is_required_exactly_when_its_schema_requires_a_field(document, client):
    assert document["paths"]["/v1/token.list"]["post"]["requestBody"]["required"] is False
    assert client.post("/v1/token.list").status_code == 200
    assert document["paths"]["/v1/working_memory.set"]["post"]["requestBody"]["required"] is True


def test_rules_apispec_cannot_see_are_stated(document, client):
    wm_set = _args_schema(document, "/v1/working_memory.set")
    pattern = wm_set["properties"]["block_key"]["pattern"]
    assert pattern == r"^[^\x00-\x1f\x7f]*$"
    assert wm_set["properties"]["agent"]["pattern"].startswith(r"^(?!\*$)")
    target = _args_schema(document, "/v1/memory.pin")
    assert [branch["required"] for branch in target["oneOf"]] == [["key"], ["memory_id"]]
    parameters = document["paths"]["/v1/profiles/{profile_id}/agent-state"]["get"]["parameters"]
    org = next(p for p in parameters if p["name"] == "org")
    assert org["schema"]["minLength"] == 1 and "default" not in org["schema"]
    # and the API holds to each of them
    body = {"namespace": "n", "agent": "a"}
    assert client.post("/v1/working_memory.set",
                       json={**body, "block_key": "a\x01"}).status_code == 422
    assert client.post("/v1/working_memory.set", json={**body, "agent": "*"}).status_code == 422
    assert client.post("/v1/memory.pin", json=body).status_code == 422
    assert client.get("/v1/profiles/u-1/agent-state?namespace=n&org=").status_code == 422


def test_booleans_must_be_json_booleans(client):
    answer = client.post("/v1/memory.list", json={"namespace": "n", "agent": "a",
                                                  "include_deleted": 0})
    assert answer.status_code == 422
    assert "include_deleted" in answer.get_json()["error"]["fields"]
    answer = client.post("/v1/org.set_model_calls", json={"enabled": "yes"})
    assert answer.status_code == 422
    assert client.post("/v1/memory.list", json={"namespace": "n", "agent": "a",
                                                "include_deleted": True}).status_code == 200


def test_null_for_an_optional_argument_means_left_out(document, client):
    who = {"namespace": "n", "agent": "a"}
    written = client.post("/v1/working_memory.set", json={
        **who, "block_key": "plan", "content": "x", "session_id": None, "char_limit": None,
        "user_id": None, "run_id": None})
    assert written.status_code == 200, written.get_json()
    assert written.get_json()["char_limit"] == 4096  # the default, as if left out
    assert written.get_json()["ignored_args"] == []
    block = client.post("/v1/working_memory.get", json={**who, "block_key": "plan"}).get_json()
    assert block["found"] is True
    tags = client.post("/v1/memory.set", json={**who, "key": "k", "value": 1, "tags": None})
    assert tags.status_code == 200, tags.get_json()
    # A required field stays required, null or not; and the document says which take null.
    refused = client.post("/v1/memory.set", json={**who, "key": None, "value": 1})
    assert refused.status_code == 422 and "key" in refused.get_json()["error"]["fields"]
    wm_set = _args_schema(document, "/v1/working_memory.set")
    assert wm_set["properties"]["session_id"]["nullable"] is True
    assert "nullable" not in wm_set["properties"]["namespace"]
    erase = _args_schema(document, "/v1/user.erase")
    assert "nullable" not in erase["properties"]["user_id"]  # required with auth off
    mode = _args_schema(document, "/v1/agent-state")["properties"]["mode"]
    assert mode["nullable"] is True and None in mode["enum"]


def _admits(document: dict, path: str, body: dict) -> bool:
    """Whether the document's request schema for ``path`` admits ``body``, its patterns read
    as ECMA-262 regular expressions, as a client's validator (and schemathesis) reads them (no
    nulls in it: OpenAPI 3.0's ``nullable`` is no JSON Schema keyword)."""
    import jsonschema_rs

    schema = {**_args_schema(document, path), "components": document["components"]}
    return jsonschema_rs.Draft7Validator(schema).is_valid(body)


def test_a_version_is_named_one_way(document, client):
    """version or version_text, one of them: as a number and as text they name one number,
    and the document says a body gives one."""
    who = {"namespace": "n", "agent": "a"}
    for op in ("memory.delete_version", "memory.revert"):
        path = f"/v1/{op}"
        bodies = {"both": {"version": 5, "version_text": "5"}, "neither": {},
                  "number": {"version": 5}, "text": {"version_text": "5"}}
        admitted = {name: _admits(document, path, {**who, "key": "k", **body})
                    for name, body in bodies.items()}
        assert admitted == {"both": False, "neither": False, "number": True, "text": True}
    one = client.post("/v1/memory.set", json={**who, "key": "k", "value": 1}).get_json()
    two = client.post("/v1/memory.set", json={**who, "key": "k", "value": 2}).get_json()
    both = client.post("/v1/memory.revert", json={
        **who, "key": "k", "version": one["version"], "version_text": str(one["version"])})
    assert both.status_code == 422 and "version" in both.get_json()["error"]["fields"]
    assert client.post("/v1/memory.revert", json={
        **who, "key": "k", "version_text": str(one["version"])}).status_code == 200
    assert client.post("/v1/memory.delete_version", json={
        **who, "key": "k", "version": two["version"]}).status_code == 200


MOMENTS = {
    "2026-05-01T10:00:00Z": True, "2024-02-29T23:59:59.123456789+14:00": True,
    "1970-01-01T00:00:00Z": True, "1970-01-01T05:00:00+04:59": True,
    "9999-12-31T23:59:59-01:00": True,
    "2026-05-01T10:00:00": True, "1970-01-01T00:00:00.5": True,  # no offset: UTC
    "1969-12-31T23:59:59": False,
    "2023-02-29T00:00:00Z": False, "2026-04-31T00:00:00Z": False,
    "2026-05-01t10:00:00z": False, "2026-05-01 10:00:00Z": False,
    "2016-12-31T23:59:60Z": False,  # a leap second: no datetime holds it
    "0839-05-11T20:38:43.4-16:48": False,  # before 1970, as written and as an instant
    "1969-12-31T23:00:00-02:00": False, "1970-01-01T00:30:00+01:00": False,
}


def test_a_moment_is_the_text_the_document_states(document, client):
    """A fact's valid_at and valid_to: RFC 3339 with an offset or none (UTC), a real date, and
    nothing before 1970 (stored as nanoseconds since); the document's pattern and the op
    agree."""
    who = {"namespace": "n", "agent": "a"}
    for moment, valid in MOMENTS.items():
        for name in ("valid_at", "valid_to"):
            body = {**who, "key": "k", "value": 1, name: moment}
            assert _admits(document, "/v1/memory.set", body) is valid, (name, moment)
            answer = client.post("/v1/memory.set", json=body)
            assert (answer.status_code == 200) is valid, (name, moment, answer.get_json())
            if not valid:
                assert name in answer.get_json()["error"]["fields"]
    search = {**who, "query": "anything", "valid_at": "2023-02-29T00:00:00Z"}
    assert not _admits(document, "/v1/memory.search", search)
    assert client.post("/v1/memory.search", json=search).status_code == 422
    earlier = {**search, "valid_at": "1900-01-01T00:00:00Z"}  # a search may ask of any time
    assert _admits(document, "/v1/memory.search", earlier)
    assert client.post("/v1/memory.search", json=earlier).status_code == 200


def test_a_moment_without_an_offset_is_utc(document, client):
    """Plain Python's isoformat() of a naive datetime has no offset: the op reads it as UTC,
    the same instant as with Z, and the document admits it."""
    from datetime import datetime

    who = {"namespace": "n", "agent": "a"}
    naive = datetime(2026, 1, 1, 12, 30).isoformat()
    assert naive == "2026-01-01T12:30:00"
    body = {**who, "key": "k", "value": 1, "valid_at": naive}
    assert _admits(document, "/v1/memory.set", body)
    assert client.post("/v1/memory.set", json=body).status_code == 200
    read = client.post("/v1/memory.get", json={**who, "key": "k"}).get_json()
    assert datetime.fromisoformat(read["memory"]["valid_at"]) == datetime.fromisoformat(
        naive + "+00:00")
    # The same instant as with Z: a valid_to at it is not after it, a second later is.
    same = client.post("/v1/memory.set", json={**body, "valid_to": naive + "Z"})
    assert same.status_code == 422 and "valid_to" in same.get_json()["error"]["fields"]
    later = client.post("/v1/memory.set", json={**body, "valid_to": "2026-01-01T12:30:01Z"})
    assert later.status_code == 200


def test_an_erasure_id_of_another_user_is_not_found(document, client):
    """An erasure_id beside a user_id names an erasure of that user; another's is none of
    theirs (404, as for an id nobody has), not a body the document could have refused."""
    body = {"namespace": "n", "user_id": "u-1", "erasure_id": "0" * 64}
    assert _admits(document, "/v1/erasure.status", body)
    answer = client.post("/v1/erasure.status", json=body)
    assert answer.status_code == 404
    assert answer.get_json()["error"]["code"] == "ERASURE_NOT_FOUND"
    # A null user_id is one left out: it names nobody, and the document says so.
    branch = _args_schema(document, "/v1/erasure.status")["anyOf"][0]
    assert branch["properties"]["user_id"]["type"] == "string"
    refused = client.post("/v1/erasure.status", json={"namespace": "n", "user_id": None})
    assert refused.status_code == 422


def test_any_cursor_the_document_admits_is_a_place_to_start_after(document, client):
    """A next_cursor is a place in the key order: one this op did not give still names a
    place; one before the key_prefix's keys starts at their first, one after them ends."""
    import base64

    who = {"namespace": "n", "agent": "a"}
    for key in ("fact:a", "fact:b", "fact:c", "zeta"):
        assert client.post("/v1/memory.set", json={**who, "key": key, "value": 1}).status_code \
            == 200

    def place(text: str) -> str:
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    def keys(cursor: str, **more) -> list[str]:
        body = {**who, "cursor": cursor, **more}
        assert _admits(document, "/v1/memory.list", body), cursor
        answer = client.post("/v1/memory.list", json=body)
        assert answer.status_code == 200, answer.get_json()
        return [row["key"] for row in answer.get_json()["memories"]]

    assert keys(place("fact:a\x01")) == ["fact:b", "fact:c", "zeta"]
    assert keys(place("a"), key_prefix="fact:") == ["fact:a", "fact:b", "fact:c"]
    assert keys(place("g"), key_prefix="fact:") == []
    assert keys("__8") == []  # bytes that are not UTF-8 still name a place (past every key)
    for cursor in ("!!!", "////", "A", "AB=="):
        assert not _admits(document, "/v1/memory.list", {**who, "cursor": cursor})
        assert client.post("/v1/memory.list", json={**who, "cursor": cursor}).status_code \
            == 422


def _loom_rules(document: dict, path: str) -> list[dict]:
    return _args_schema(document, path).get("x-loom-rules", [])


def test_two_fields_compared_and_the_clock_are_stated_as_x_loom_rules(document, client):
    """What JSON Schema cannot say (a field against another, or against the clock) the
    document says in x-loom-rules, and a body keeps each rule exactly when the op takes it."""
    from app.schemas.rules import after, future, length_within, rule_holds

    who = {"namespace": "n", "agent": "a"}
    from app.store.memory_row import MAX_CHAR_LIMIT

    assert _loom_rules(document, "/v1/memory.set") == [
        after("valid_to", "valid_at"), length_within("value", "char_limit", MAX_CHAR_LIMIT, "json")]
    for start, end in (("2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"),
                       ("2026-01-02T00:00:00Z", "2026-01-01T00:00:00Z"),
                       ("2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z"),
                       ("2026-01-01T01:00:00+02:00", "2026-01-01T00:00:00Z")):
        body = {**who, "key": "k", "value": 1, "valid_at": start, "valid_to": end}
        kept = all(rule_holds(rule, body) for rule in _loom_rules(document, "/v1/memory.set"))
        assert (client.post("/v1/memory.set", json=body).status_code == 200) is kept, body

    assert _loom_rules(document, "/v1/working_memory.set") == [
        length_within("content", "char_limit", 4096, "characters")]
    for content, limit in (("é" * 10, 10), ("é" * 11, 10), ("x" * 4096, None),
                           ("x" * 4097, None), ("", 1)):
        body = {**who, "block_key": "b", "content": content}
        if limit is not None:
            body["char_limit"] = limit
        kept = rule_holds(_loom_rules(document, "/v1/working_memory.set")[0], body)
        answer = client.post("/v1/working_memory.set", json=body)
        assert (answer.status_code == 200) is kept, (len(content), limit, answer.get_json())
        if not kept:
            assert answer.get_json()["error"]["code"] == "WORKING_MEMORY_LIMIT_EXCEEDED"

    assert _loom_rules(document, "/v1/profile.set") == [
        length_within("value", "char_limit", 8192, "json")]
    for value, limit in (("é" * 8, 10), ("é" * 9, 10), ('"' * 4, 10), ('"' * 5, 10),
                         ("x" * 8190, None), ("x" * 8191, None)):
        body = {**who, "label": "persona", "value": value}
        if limit is not None:
            body["char_limit"] = limit
        kept = rule_holds(_loom_rules(document, "/v1/profile.set")[0], body)
        answer = client.post("/v1/profile.set", json=body)
        assert (answer.status_code == 200) is kept, (value[:12], limit, answer.get_json())
        if not kept:
            assert answer.get_json()["error"]["code"] == "CHAR_LIMIT_EXCEEDED"

    assert _loom_rules(document, "/v1/token.create") == [future("expires_at")]
    for moment in ("2001-01-01T00:00:00Z", "2999-01-01T00:00:00Z", "2999-01-01T00:00:00"):
        body = {"namespace": "n", "role": "viewer", "expires_at": moment}
        kept = rule_holds(_loom_rules(document, "/v1/token.create")[0], body)
        assert (client.post("/v1/token.create", json=body).status_code == 200) is kept, moment


def test_ci_draws_only_valid_cases_that_keep_the_stated_rules(document):
    """.ci/api_contract_hooks.py: a case schemathesis draws as valid that breaks an
    x-loom-rules rule is not drawn; a negative one, or one that keeps them, is."""
    import importlib.util
    from pathlib import Path
    from types import SimpleNamespace

    from schemathesis.generation import GenerationMode

    path = Path(__file__).resolve().parents[1] / ".ci" / "api_contract_hooks.py"
    spec = importlib.util.spec_from_file_location("api_contract_hooks", path)
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    operation = SimpleNamespace(
        definition=SimpleNamespace(raw=document["paths"]["/v1/working_memory.set"]["post"]),
        schema=SimpleNamespace(raw_schema=document))
    context = SimpleNamespace(operation=operation)

    def drawn(mode: GenerationMode, body: dict) -> bool:
        meta = SimpleNamespace(generation=SimpleNamespace(mode=mode))
        return hooks.filter_case(context, SimpleNamespace(meta=meta, body=body))

    over = {"namespace": "n", "agent": "a", "content": "xyz", "char_limit": 2}
    assert drawn(GenerationMode.POSITIVE, over) is False
    assert drawn(GenerationMode.NEGATIVE, over) is True
    assert drawn(GenerationMode.POSITIVE, {**over, "char_limit": 3}) is True


def test_a_session_token_names_its_user_where_no_token_can(document, client, app_factory):
    """token.create bound to a session pins a user; with auth off nothing else can give it,
    so the document requires read_user_id beside a session_id, and only then."""
    bodies = {"no session": ({"namespace": "n", "role": "viewer"}, True),
              "session, no user": ({"namespace": "n", "role": "viewer", "session_id": "s-1"},
                                   False),
              "session and user": ({"namespace": "n", "role": "viewer", "session_id": "s-1",
                                    "read_user_id": "u-1"}, True),
              "no session named": ({"namespace": "n", "role": "viewer", "session_id": "-"},
                                   True)}
    for name, (body, valid) in bodies.items():
        assert _admits(document, "/v1/token.create", body) is valid, name
        answer = client.post("/v1/token.create", json=body)
        assert (answer.status_code == 200) is valid, (name, answer.get_json())
    with_auth = app_factory(auth="on", admin_token="t" * 32).test_client().get(
        "/openapi.json").get_json()
    assert "anyOf" not in _args_schema(with_auth, "/v1/token.create")  # the token may pin it


def test_a_blank_scope_id_is_blank_as_python_reads_it(document, client):
    """A scope id is trimmed with str.strip(), whose whitespace holds U+001C to U+001F (not
    ECMA-262's \\s): the document spells it out, so "\\x1f" is refused by both."""
    for scope_id, valid in (("\x1f", False), (" \x1c ", False), ("\ufeff", True),
                            ("conv-1", True)):
        body = {"namespace": "n", "scope": {"kind": "conversation", "id": scope_id}}
        assert _admits(document, "/v1/agent_state.erase", body) is valid, repr(scope_id)
        answer = client.post("/v1/agent_state.erase", json=body)
        assert (answer.status_code != 422) is valid, (repr(scope_id), answer.get_json())


def test_a_profile_id_holds_no_control_character_even_among_spaces(document, client):
    """The profile id in the agent-state path is a handle with no control character: not in
    the spaces around it either (each space tested, not only the first)."""
    import urllib.parse

    import jsonschema_rs

    parameters = document["paths"]["/v1/profiles/{profile_id}/agent-state"]["get"]["parameters"]
    schema = next(p for p in parameters if p["name"] == "profile_id")["schema"]
    for profile_id, valid in (("\u2003\x1f cust-5", False), ("\u2003 cust-5\u2003", True)):
        assert jsonschema_rs.is_valid(schema, profile_id) is valid, repr(profile_id)
        answer = client.get(f"/v1/profiles/{urllib.parse.quote(profile_id)}/agent-state"
                            "?namespace=n")
        assert (answer.status_code != 422) is valid, (repr(profile_id), answer.get_json())


def _contract_hooks():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / ".ci" / "api_contract_hooks.py"
    spec = importlib.util.spec_from_file_location("api_contract_hooks", path)
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


def test_a_features_document_states_unique_names_and_patterns_that_compile(document, client):
    """features.set: rule names unique and patterns RE2 can run are x-loom-rules, and a body
    keeps them exactly when the op takes it."""
    from app.schemas.rules import rule_holds

    rules = _loom_rules(document, "/v1/features.set")
    assert {rule["rule"] for rule in rules} == {"unique_by", "re2_pattern"}
    bodies = {
        "fine": [{"name": "ticket", "pattern": "T-[0-9]+"}, {"name": "order", "pattern": "O\\d"}],
        "same name": [{"name": "ticket", "pattern": "T-1"}, {"name": "ticket", "pattern": "T-2"}],
        "no compile": [{"name": "ticket", "pattern": "T-("}],
        "lookahead": [{"name": "ticket", "pattern": "T(?=1)"}],
        "matches empty": [{"name": "ticket", "pattern": "x*"}],
    }
    for name, pii_rules in bodies.items():
        body = {"namespace": "n", "features": {"pii_rules": pii_rules}}
        assert _admits(document, "/v1/features.set", body), name
        kept = all(rule_holds(rule, body) for rule in rules)
        answer = client.post("/v1/features.set", json=body)
        assert (answer.status_code == 200) is kept, (name, answer.get_json())
        assert kept is (name == "fine")


def test_an_object_types_registry_states_unique_names_and_retention_within_the_state(
        document, client):
    """object_types.set: type names unique, retention naming declared fields and none longer
    than the state's are x-loom-rules; a body keeps them exactly when the op takes it."""
    from app.schemas.rules import rule_holds

    rules = _loom_rules(document, "/v1/object_types.set")
    assert {rule["rule"] for rule in rules} == {"unique_by", "retention_fits"}

    from app.ops.namespace_config import EXAMPLE_TYPE

    def kind(name: str, **retention: str) -> dict:
        declared = {key: value for key, value in EXAMPLE_TYPE.items() if key != "retention"}
        return {**declared, "type": name, **({"retention": retention} if retention else {})}

    bodies = {
        "fine": [kind("a_state", state="30d", step="7d"), kind("b_state")],
        "same name": [kind("a_state"), kind("a_state")],
        "undeclared field": [kind("a_state", state="30d", other="7d")],
        "longer than the state": [kind("a_state", state="7d", step="30d")],
    }
    for name, types in bodies.items():
        body = {"namespace": "n", "types": types}
        assert _admits(document, "/v1/object_types.set", body), name
        kept = all(rule_holds(rule, body) for rule in rules)
        answer = client.post("/v1/object_types.set", json=body)
        assert (answer.status_code == 200) is kept, (name, answer.get_json())
        assert kept is (name == "fine")


@pytest.mark.parametrize("path, body", [
    ("/v1/working_memory.replace", {"block_key": "state", "old": "EUR", "new": "CHF"}),
    ("/v1/working_memory.append", {"block_key": "state", "addition": "x" * 4096}),
    ("/v1/working_memory.append", {"block_key": "state", "addition": "x" * 5000}),
    ("/v1/profile.replace", {"label": "preferences", "old": "EUR", "new": "CHF"}),
    ("/v1/profile.append", {"label": "preferences", "addition": "x" * 9000}),
    ("/v1/memory.set", {"key": "k", "value": "x" * 9000}),
])
def test_ci_writes_the_stored_state_a_valid_case_needs(client, path, body):
    """.ci/api_contract_hooks.py's before_call: a case drawn as valid against the stored state
    it needs (the text to replace in the block, room for an addition, a row's cap) is sent
    after that state is written, so the op takes it; first the state is the opposite."""
    from types import SimpleNamespace

    from schemathesis.generation import GenerationMode

    who = {"namespace": "n", "agent": "a"}
    body = {**who, **body}
    op = path.rsplit("/", 1)[1]
    if op.startswith("working_memory"):
        client.post("/v1/working_memory.set", json={**who, "block_key": "state",
                                                    "content": "", "char_limit": 1})
    elif op.startswith("profile"):
        client.post("/v1/profile.set", json={**who, "label": "preferences", "value": "",
                                             "char_limit": 3})
    else:
        client.post("/v1/memory.set", json={**who, "key": "k", "value": 1, "char_limit": 8})
    assert client.post(path, json=body).status_code == 422  # against the state as it was
    hooks = _contract_hooks()
    hooks._SERVER = "http://loom.test"
    hooks._write = lambda name, prepared: client.post(f"/v1/{name}", json=prepared)
    meta = SimpleNamespace(generation=SimpleNamespace(mode=GenerationMode.POSITIVE))
    case = SimpleNamespace(meta=meta, body=body, operation=SimpleNamespace(path=path))
    hooks.before_call(None, case)
    answer = client.post(path, json=body)
    assert answer.status_code == 200, answer.get_json()


def _profile_schema_rules_hold(document, client, rule: str, bodies: dict[str, dict]) -> None:
    """profile_schema.set: each body the document admits keeps the stated ``rule`` exactly
    when the op takes it, and only the one named ``fine`` keeps it."""
    from app.schemas.rules import rule_holds

    rules = [found for found in _loom_rules(document, "/v1/profile_schema.set")
             if found["rule"] == rule]
    assert rules, rule
    for name, json_schema in bodies.items():
        body = {"namespace": "n", "json_schema": json_schema}
        assert _admits(document, "/v1/profile_schema.set", body), name
        kept = all(rule_holds(found, body) for found in rules)
        answer = client.post("/v1/profile_schema.set", json=body)
        assert (answer.status_code == 200) is kept, (name, answer.get_json())
        assert kept is (name == "fine"), name
        if not kept:
            assert answer.get_json()["error"]["code"] == "SCHEMA_INVALID", name


def _profile(**properties: dict) -> dict:
    return {"type": "object", "properties": properties}


def test_a_profile_schema_states_its_size_in_bytes_of_canonical_json(document, client):
    # Two bytes a character: under 16 KiB counted in characters, over it in bytes.
    _profile_schema_rules_hold(document, client, "length_within", {
        "fine": _profile(city={"type": "string", "description": "é" * 8000}),
        "over in bytes": _profile(city={"type": "string", "description": "é" * 9000}),
    })


def test_a_profile_schema_states_patterns_that_compile(document, client):
    _profile_schema_rules_hold(document, client, "pattern_compiles", {
        "fine": _profile(code={"type": "string", "description": "Code", "pattern": "^[A-Z]+$"},
                         codes={"type": "array", "description": "Codes",
                                "items": {"type": "string", "pattern": "\\d+"}}),
        "property": _profile(code={"type": "string", "description": "Code", "pattern": "("}),
        "items": _profile(codes={"type": "array", "description": "Codes",
                                 "items": {"type": "string", "pattern": "[a-"}}),
    })


def test_a_profile_schema_states_each_range_low_to_high(document, client):
    _profile_schema_rules_hold(document, client, "ordered", {
        "fine": _profile(code={"type": "string", "description": "C", "minLength": 2,
                               "maxLength": 2},
                         age={"type": "integer", "description": "A", "minimum": 0,
                              "maximum": 150}),
        "lengths": _profile(code={"type": "string", "description": "C", "minLength": 3,
                                  "maxLength": 2}),
        "numbers": _profile(age={"type": "number", "description": "A", "minimum": 1.5,
                                 "maximum": 1}),
        "item lengths": _profile(codes={"type": "array", "description": "C", "items": {
            "type": "string", "minLength": 4, "maxLength": 1}}),
        "item numbers": _profile(ages={"type": "array", "description": "A", "items": {
            "type": "integer", "minimum": 9, "maximum": 3}}),
    })


def test_a_profile_schema_states_the_answer_budget(document, client):
    """Values counted (256 at most) and the output-cap estimate (16,384 tokens at most)."""
    many = {f"list{index}": {"type": "array", "description": "L", "maxItems": 50,
                             "items": {"type": "boolean"}} for index in range(6)}
    _profile_schema_rules_hold(document, client, "answer_fits", {
        "fine": {"type": "object", "properties": dict(list(many.items())[:5])},
        "too many values": _profile(**many),
        "over the output cap": _profile(notes={"type": "array", "description": "N",
                                               "maxItems": 50, "items": {
                                                   "type": "string", "maxLength": 1000}}),
    })
