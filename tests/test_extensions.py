"""A deployer's Flask extensions see every op: hooks registered on the built app run for each
op request, whatever its method and answer (200, 401, 404, 421, 422, 429, 503, 500), and
Flask's ``got_request_exception`` signal is sent for the server's own failures (503, 500), as
Flask sends it for an exception no handler takes, and not for a refusal of the caller's
request. The Host check and the refused-token budget refuse inside Flask too, after the
deployer's ``before_request`` hooks and before any view."""

from __future__ import annotations

from pathlib import Path

import pytest
from flask import Flask, got_request_exception, request

from app.clock import FrozenClock
from app.local import free_port
from app.store.working_memory import WorkingMemoryStore
from tests.conftest import make_app

ADMIN = "admin-token-for-the-extension-test-0123456789"
WHO = {"namespace": "support", "agent": "triage-bot", "user_id": "u-1"}


class Seen:
    """What a deployer's hooks and signal listener saw, request by request."""

    def __init__(self, app: Flask) -> None:
        self.before: list[tuple[str, str, str | None]] = []
        self.after: list[tuple[str, int]] = []
        self.exceptions: list[tuple[str, BaseException]] = []

        @app.before_request
        def note_start() -> None:
            self.before.append((request.method, request.path, request.endpoint))

        @app.after_request
        def note_answer(response):  # type: ignore[no-untyped-def]
            self.after.append((request.path, response.status_code))
            return response

        def note_exception(sender: Flask, exception: BaseException, **_extra: object) -> None:
            assert sender is app
            self.exceptions.append((request.path, exception))

        # Held by the test (blinker keeps weak references), and let go when it ends.
        self.listener = note_exception
        got_request_exception.connect(note_exception, app)

    def close(self) -> None:
        got_request_exception.disconnect(self.listener)


@pytest.fixture
def seen_on():
    made: list[Seen] = []

    def watch(app: Flask) -> Seen:
        made.append(Seen(app))
        return made[-1]

    yield watch
    for seen in made:
        seen.close()


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_hooks_see_every_op_and_every_answer_with_auth_on(redis_url, tmp_path, seen_on):
    app = make_app(redis_url, tmp_path, auth="on", admin_token=ADMIN)
    seen = seen_on(app)
    client = app.test_client()
    sample = [
        ("POST", "/v1/working_memory.set", {**WHO, "content": "step 3"}, _bearer(ADMIN), 200),
        ("POST", "/v1/working_memory.get", WHO, _bearer(ADMIN), 200),
        ("POST", "/v1/working_memory.append", {**WHO, "addition": "x"}, _bearer(ADMIN), 200),
        ("POST", "/v1/profile.render", WHO, _bearer(ADMIN), 200),
        ("POST", "/v1/working_memory.get", WHO, {}, 401),
        ("POST", "/v1/working_memory.get", WHO, _bearer("no-such-token"), 401),
        ("POST", "/v1/working_memory.set", {**WHO, "content": 7}, _bearer(ADMIN), 422),
        ("POST", "/v1/working_memory.replace", {**WHO, "old": "a", "new": "b",
                                                "block_key": "none"}, _bearer(ADMIN), 404),
        ("PUT", "/v1/agent-state", {**WHO, "object_type": 3}, _bearer(ADMIN), 422),
        ("GET", "/v1/profiles/cust-42/agent-state?namespace=shop", None, _bearer(ADMIN), None),
    ]
    statuses = []
    for method, path, body, headers, status in sample:
        answer = client.open(path, method=method, json=body, headers=headers)
        if status is not None:
            assert answer.status_code == status, (path, answer.get_json())
        assert "X-Request-Id" in answer.headers
        statuses.append(answer.status_code)
    assert [(method, path.split("?")[0]) for method, path, *_ in sample] == [
        (method, path) for method, path, _endpoint in seen.before]
    assert all(endpoint is not None for *_, endpoint in seen.before)
    assert [status for _path, status in seen.after] == statuses
    # Refusals of the caller's request are answers, not failures of the server.
    assert seen.exceptions == []


def test_a_rate_limited_op_is_seen_and_answered_429(redis_url, tmp_path, seen_on):
    # Two requests a minute, on a clock that stands still: the third is over the budget.
    app = make_app(redis_url, tmp_path, rate_limit=(2, 60), clock=FrozenClock())
    seen = seen_on(app)
    client = app.test_client()
    answers = [client.post("/v1/working_memory.get", json=WHO) for _ in range(3)]
    assert [answer.status_code for answer in answers] == [200, 200, 429]
    assert int(answers[2].headers["Retry-After"]) > 0
    assert [status for _path, status in seen.after] == [200, 200, 429]
    assert len(seen.before) == 3
    assert seen.exceptions == []


def test_a_dead_store_is_seen_answered_503_and_signalled(tmp_path: Path, seen_on):
    dead = f"redis://127.0.0.1:{free_port()}/0"
    app = make_app(dead, tmp_path, redis_socket_timeout_seconds=0.5,
                   redis_connect_timeout_seconds=0.5)
    seen = seen_on(app)
    client = app.test_client()
    for path, body in (("/v1/working_memory.get", WHO),
                       ("/v1/working_memory.set", {**WHO, "content": "x"}),
                       ("/v1/profile.set", {**WHO, "label": "persona", "value": "v"})):
        answer = client.post(path, json=body)
        assert answer.status_code == 503, answer.get_json()
        assert answer.get_json()["error"]["code"] == "STORE_UNAVAILABLE"
    assert [path for _method, path, _endpoint in seen.before] == [
        "/v1/working_memory.get", "/v1/working_memory.set", "/v1/profile.set"]
    assert [status for _path, status in seen.after] == [503, 503, 503]
    assert [path for path, _error in seen.exceptions] == [
        "/v1/working_memory.get", "/v1/working_memory.set", "/v1/profile.set"]
    import redis

    assert all(isinstance(error, redis.ConnectionError) for _path, error in seen.exceptions)


def test_a_bug_is_seen_answered_500_and_signalled(app_factory, monkeypatch, seen_on):
    def broken(*_args, **_kwargs):
        raise RuntimeError("a bug in a store")

    monkeypatch.setattr(WorkingMemoryStore, "get", broken)
    app = app_factory(validate_answers=False)
    seen = seen_on(app)
    answer = app.test_client().post("/v1/working_memory.get", json=WHO)
    assert answer.status_code == 500
    assert answer.get_json() == {
        "error": {"code": "INTERNAL_ERROR", "message": "internal error; it has been logged"}}
    assert seen.after == [("/v1/working_memory.get", 500)]
    assert [(path, str(error)) for path, error in seen.exceptions] == [
        ("/v1/working_memory.get", "a bug in a store")]


def test_a_host_the_process_does_not_answer_is_seen_and_answered_421(app, seen_on):
    seen = seen_on(app)
    client = app.test_client()
    refused = client.post("/v1/working_memory.get", json=WHO,
                          headers={"Host": "rebound.attacker.example:8000"})
    answered = client.post("/v1/working_memory.get", json=WHO, headers={"Host": "localhost"})
    assert refused.status_code == 421
    assert refused.get_json() == {"error": {
        "code": "HOST_NOT_ALLOWED",
        "message": "this server does not answer that Host name; add it to LOOM_ALLOWED_HOSTS",
        "fields": {"Host": [
            "this server does not answer that Host name; add it to LOOM_ALLOWED_HOSTS"]}}}
    assert refused.headers["Cache-Control"] == "no-store"
    assert "X-Request-Id" in refused.headers
    assert answered.status_code == 200
    assert [path for _method, path, _endpoint in seen.before] == [
        "/v1/working_memory.get", "/v1/working_memory.get"]
    assert [status for _path, status in seen.after] == [421, 200]
    assert seen.exceptions == []


def test_an_address_past_its_refused_token_budget_is_seen_and_answered_429(
        redis_url, tmp_path, seen_on):
    app = make_app(redis_url, tmp_path, auth="on", admin_token=ADMIN,
                   bad_token_limit=(2, 3600), clock=FrozenClock())
    seen = seen_on(app)
    client = app.test_client()
    other = app.test_client()
    guesses = [client.post("/v1/working_memory.get", json=WHO,
                           headers=_bearer(f"guess-{n}")).status_code for n in range(3)]
    # Over the budget, even the right token is refused, and the console's sign-in too.
    held = client.post("/v1/working_memory.get", json=WHO, headers=_bearer(ADMIN))
    signed = client.post("/console/sign-in", data={"token": ADMIN})
    # Another address, and a request without a credential, pass.
    elsewhere = other.post("/v1/working_memory.get", json=WHO, headers=_bearer(ADMIN),
                           environ_base={"REMOTE_ADDR": "10.0.0.9"})
    health = client.get("/healthz")
    assert guesses == [401, 401, 401]
    for refused in (held, signed):
        assert refused.status_code == 429, refused.get_data(as_text=True)
        assert refused.get_json()["error"]["code"] == "RATE_LIMITED"
        assert 0 < int(refused.headers["Retry-After"]) <= 3600
        assert refused.headers["Cache-Control"] == "no-store"
    assert (elsewhere.status_code, health.status_code) == (200, 200)
    assert [path for _method, path, _endpoint in seen.before] == [
        *["/v1/working_memory.get"] * 4, "/console/sign-in", "/v1/working_memory.get",
        "/healthz"]
    assert [status for _path, status in seen.after] == [401, 401, 401, 429, 429, 200, 200]
    assert seen.exceptions == []


def test_no_op_route_is_served_outside_flask(redis_url, tmp_path):
    """Every op's route is in Flask's URL map, served by the view its blueprint registered, and
    nothing wraps Flask's own WSGI callable but werkzeug's ProxyFix (behind proxies), which
    reads the proxies' headers and serves no request."""
    from werkzeug.middleware.proxy_fix import ProxyFix

    from app.registry import REGISTRY

    app = make_app(redis_url, tmp_path, trusted_proxies=1)
    layers = []
    layer = app.wsgi_app
    while not hasattr(layer, "__func__"):
        layers.append(type(layer))
        layer = layer.app
    assert layers == [ProxyFix]
    assert layer.__func__ is Flask.wsgi_app  # type: ignore[attr-defined]
    rules = {(rule.rule, method): rule.endpoint for rule in app.url_map.iter_rules()
             for method in rule.methods or ()}
    for declared in REGISTRY:
        endpoint = rules[(declared.http_path, declared.http_method)]
        assert app.extensions["loom_ops_by_endpoint"][endpoint] == declared.name
        assert app.view_functions[endpoint].__name__ == declared.name.replace(".", "_")
