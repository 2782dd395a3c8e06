"""``app.dispatch``: the op routes served straight from WSGI answer exactly what Flask's view
for the same op answers (status, headers, body), and everything that is not an op route still
goes through Flask."""

from __future__ import annotations

import logging

import pytest
from werkzeug.test import Client
from werkzeug.wrappers import Response

from app.dispatch import OpDispatcher
from app.registry import REGISTRY
from app.store.working_memory import WorkingMemoryStore

WHO = {"namespace": "support", "agent": "triage-bot", "user_id": "u-1"}
REQUEST_ID = "req-dispatch-1"

# (method, path, body, content type, extra headers): answers that do not depend on the clock,
# so that the dispatcher's and the view's answers to the same request can be compared whole.
CASES = [
    ("POST", "/v1/working_memory.get", {**WHO, "block_key": "none-yet"}, None, {}),
    ("POST", "/v1/working_memory.get", {"agent": "a"}, None, {}),  # 422 IDENTITY_INCOMPLETE
    ("POST", "/v1/working_memory.set", {**WHO, "content": 7}, None, {}),  # 422 fields
    ("POST", "/v1/working_memory.set", {**WHO, "content": "x" * 10, "char_limit": 2},
     None, {}),  # 422 WORKING_MEMORY_LIMIT_EXCEEDED
    ("POST", "/v1/working_memory.replace", {**WHO, "old": "a", "new": "b"}, None, {}),  # 404
    ("POST", "/v1/working_memory.set", b"{not json", "application/json", {}),  # 400
    ("POST", "/v1/working_memory.set", b"\x0c", "application/json", {}),  # 400
    ("POST", "/v1/working_memory.set", b'{"a": 1}', "text/plain", {}),  # 400 content type
    ("POST", "/v1/working_memory.set", b"[1]", "application/json", {}),  # 400 not an object
    ("POST", "/v1/working_memory.set", b"{}", "application/vnd.loom+json", {}),  # +json
    ("POST", "/v1/working_memory.set", b'{"x": "' + b"y" * 2_000_000 + b'"}',
     "application/json", {}),  # 413
    ("POST", "/v1/working_memory.get", {**WHO}, None,
     {"Authorization": "Basic abc"}),  # 401 AUTH_INVALID
    ("POST", "/v1/profile.render", {**WHO, "labels": ["persona"]}, None, {}),
    ("PUT", "/v1/agent-state", {**WHO, "object_type": "nope"}, None, {}),
]


def _request(client: Client, method: str, path: str, body, content_type, headers):
    headers = {"X-Request-Id": REQUEST_ID, **headers}
    if isinstance(body, bytes):
        return client.open(path, method=method, data=body, content_type=content_type,
                           headers=headers)
    return client.open(path, method=method, json=body, headers=headers)


def _dispatcher(app) -> OpDispatcher:
    # Inside the Host check and the refused-token budget, which wrap every request.
    layer = app.wsgi_app
    while not isinstance(layer, OpDispatcher) and hasattr(layer, "app"):
        layer = layer.app
    assert isinstance(layer, OpDispatcher)
    return layer


@pytest.mark.parametrize("validate", [True, False], ids=["answers-checked", "unchecked"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_an_op_route_answers_as_its_flask_view_does(app_factory, case, validate):
    app = app_factory(validate_answers=validate)
    direct = Client(_dispatcher(app), Response)
    through_flask = Client(_dispatcher(app).flask_app, Response)
    first = _request(direct, *case)
    second = _request(through_flask, *case)
    assert first.status_code == second.status_code
    assert first.get_data() == second.get_data()
    assert sorted(first.headers.items()) == sorted(second.headers.items())
    assert first.headers["X-Request-Id"] == REQUEST_ID
    assert first.headers["Content-Type"] == "application/json"
    assert int(first.headers["Content-Length"]) == len(first.get_data())


def test_every_post_and_put_op_is_served_by_the_dispatcher_and_nothing_else_is(app):
    served = set(_dispatcher(app)._routes)
    expected = {
        (op.http_method, op.http_path) for op in REGISTRY
        if op.http_method != "GET" and "<" not in op.http_path
    }
    assert served == expected
    assert ("POST", "/v1/working_memory.get") in served


def test_op_routes_skip_flask_hooks_and_other_routes_keep_them(app):
    seen: list[str] = []

    @app.before_request
    def note() -> None:
        from flask import request

        seen.append(request.path)

    client = app.test_client()
    assert client.post("/v1/working_memory.get", json=WHO).status_code == 200
    assert seen == []
    assert client.get("/healthz").status_code == 200
    # A method the op does not take, a path with a trailing part, a GET op: all Flask's.
    assert client.get("/v1/working_memory.get").status_code == 405
    assert client.post("/v1/working_memory.get/x", json=WHO).status_code == 404
    assert seen == ["/healthz", "/v1/working_memory.get", "/v1/working_memory.get/x"]


def test_a_write_through_the_dispatcher_is_read_back(client):
    written = client.post("/v1/working_memory.set", json={**WHO, "content": "where I was"})
    assert written.status_code == 200
    got = client.post("/v1/working_memory.get", json=WHO).get_json()
    assert got["content"] == "where I was"
    assert got["version"] == written.get_json()["version"]


def test_an_unexpected_error_is_a_logged_500_in_the_error_shape(app_factory, monkeypatch,
                                                                 caplog):
    def broken(*_args, **_kwargs):
        raise RuntimeError("a bug in a store")

    monkeypatch.setattr(WorkingMemoryStore, "get", broken)
    client = app_factory(validate_answers=False).test_client()
    with caplog.at_level(logging.ERROR, logger="loom.api"):
        answer = client.post("/v1/working_memory.get", json=WHO)
    assert answer.status_code == 500
    assert answer.get_json() == {
        "error": {"code": "INTERNAL_ERROR", "message": "internal error; it has been logged"}}
    assert "X-Request-Id" in answer.headers
    logged = [r for r in caplog.records if r.name == "loom.api"]
    assert logged and logged[0].exc_info and "a bug in a store" in str(logged[0].exc_info[1])


def test_the_access_line_and_the_metrics_count_a_dispatched_request(app_factory, caplog):
    from app import metrics

    client = app_factory(validate_answers=False).test_client()
    counted = metrics.REQUESTS.labels(op="working_memory.get", status="422")
    before = counted._value.get()
    with caplog.at_level(logging.INFO, logger="loom.access"):
        answer = client.post("/v1/working_memory.get", json={"agent": "a"},
                             headers={"X-Request-Id": REQUEST_ID})
    assert answer.status_code == 422
    assert counted._value.get() == before + 1
    lines = [r for r in caplog.records if r.name == "loom.access"]
    assert [r.getMessage() for r in lines] == ["POST working_memory.get 422"]
