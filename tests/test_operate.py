"""Health, readiness, metrics, request ids, access lines and the queue dashboard, in-process.

The metrics are read back with prometheus_client's own text parser, so a malformed exposition
fails here as it would fail a Prometheus scrape. The same behaviour under real gunicorn
workers, an RQ worker and a scheduler is in ``test_operate_live.py``.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import re
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rq import Queue
from rq.registry import FailedJobRegistry

from app import logs
from app.job_queues import JobQueueReader
from app.local import free_port
from app.queue_names import ALL_QUEUES
from app.store.lease import LeaseStore
from app.store.metrics import OTHER_ORG, JobMetricsStore, record_pass
from jobs.queues import BUILDS, PASSES
from jobs.structured_profile import run_pass
from tests.auth_support import ADMIN_TOKEN, auth_app, bearer, mint
from tests.conftest import make_app
from tests.support.model_server import ScriptedModelServer
from tests.test_structured_worker import SCHEMA

NS = {"namespace": "support", "agent": "chat"}
METRICS_TOKEN = "metrics-scraper-token"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(scraped, name: str, **labels: str) -> float:
    return scraped.get((name, tuple(sorted(labels.items()))), 0.0)


def scrape(client, headers=None):
    response = client.get("/metrics", headers=headers or {})
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.headers["Content-Type"].startswith("text/plain")
    return samples(response.get_data(as_text=True))


# --- health and readiness ---------------------------------------------------------------------


def test_healthz_and_readyz_need_no_token_and_are_not_ops(app_factory):
    client = auth_app(app_factory).test_client()
    assert client.get("/healthz").get_json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.get_json() == {"status": "ready",
                                "checks": {"redis": "ok", "queue_redis": "ok"}}
    paths = client.get("/openapi.json").get_json()["paths"]
    assert not any(path in paths for path in ("/healthz", "/readyz", "/metrics"))
    assert client.post("/v1/healthz").status_code == 404


def test_readyz_names_the_part_that_does_not_answer(app_factory):
    dead = f"redis://127.0.0.1:{free_port()}/0"
    client = app_factory(queue_url=dead).test_client()
    answer = client.get("/readyz")
    assert answer.status_code == 503
    assert answer.headers["Retry-After"] == "1"
    error = answer.get_json()["error"]
    assert error["code"] == "NOT_READY" and error["failing"] == ["queue_redis"]
    assert error["checks"]["redis"] == "ok"
    assert "queue_redis" in error["message"]
    assert client.get("/healthz").status_code == 200  # up, just not ready


def test_readyz_with_both_down_names_both(tmp_path):
    dead = f"redis://127.0.0.1:{free_port()}/0"
    client = make_app(dead, tmp_path).test_client()
    error = client.get("/readyz").get_json()["error"]
    assert error["failing"] == ["redis", "queue_redis"]


# --- request ids and the access line ------------------------------------------------------------


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """Loom's log lines of the test, as the JSON formatter writes them."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def parsed(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_request_id_is_echoed_or_made_and_logged_with_the_op(client, json_lines):
    given = client.post("/v1/working_memory.set", headers={"X-Request-Id": "req-42.a"},
                        json={**NS, "user_id": "u-raw-7", "block_key": "k", "content": "x"})
    assert given.status_code == 200 and given.headers["X-Request-Id"] == "req-42.a"
    made = client.post("/v1/working_memory.get", json={**NS, "block_key": ""})
    assert made.status_code == 422
    assert len(made.headers["X-Request-Id"]) == 32
    assert uuid.UUID(made.headers["X-Request-Id"]).version == 4  # the shape uuid4().hex has
    forged = client.get("/healthz", headers={"X-Request-Id": 'a" "level": "ERROR'})
    assert len(forged.headers["X-Request-Id"]) == 32

    access = [line for line in parsed(json_lines) if line["logger"] == "loom.access"]
    assert [line["op"] for line in access] == ["working_memory.set", "working_memory.get"]
    first, second = access
    assert first["request_id"] == "req-42.a" and second["request_id"] == made.headers[
        "X-Request-Id"]
    assert (first["status"], second["status"]) == (200, 422)
    assert first["org"] == "default" and first["namespace"] == "support"
    assert first["level"] == "INFO" and first["time"].endswith("Z")
    assert isinstance(first["duration_ms"], float)
    assert "u-raw-7" not in json_lines.getvalue()


def test_the_access_line_written_straight_is_the_formatters_line(monkeypatch):
    """With Loom's JSON handler alone on the root logger, the access line skips the logging
    machinery; it must come out as the handler's own formatting of the record would."""
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    try:
        logs.configure_logging("json")
        root.handlers = [h for h in root.handlers if getattr(h, "_loom_handler", False)]
        access = logging.getLogger("loom.access")
        with logs.bound_to(request_id="r1", op="working_memory.get", org="default",
                           namespace='sh"op\\ é\u2028'):
            logs.info_line(access, "POST working_memory.get 200", status=200, duration_ms=1.5)
            root.addHandler(logging.NullHandler())  # a second handler: the ordinary path
            logs.info_line(access, "POST working_memory.get 200", status=200, duration_ms=1.5)
    finally:
        root.handlers = saved
        root.setLevel(level)
    lines = stream.getvalue().rstrip("\n").split("\n")
    straight, ordinary = (json.loads(line) for line in lines)
    assert straight.pop("time")[-1] == "Z" and ordinary.pop("time")[-1] == "Z"
    assert straight == ordinary == {
        "level": "INFO", "logger": "loom.access", "message": "POST working_memory.get 200",
        "request_id": "r1", "op": "working_memory.get", "status": 200, "duration_ms": 1.5,
        "org": "default", "namespace": 'sh"op\\ é\u2028'}
    # Byte for byte the formatter's line, but for the instant it was written.
    untimed = [re.sub(r'"time": "[^"]*"', '"time": ""', line) for line in lines]
    assert untimed[0] == untimed[1]


def test_an_unexpected_error_logs_the_route_not_the_raw_path(app, json_lines):
    @app.get("/boom/<thing>")
    def boom(thing):
        raise RuntimeError("boom")

    response = app.test_client().get("/boom/ana@example.com")
    assert response.status_code == 500
    assert "ana@example.com" not in json_lines.getvalue()
    error = next(line for line in parsed(json_lines) if line["level"] == "ERROR")
    assert error["request_id"] == response.headers["X-Request-Id"] and "exc" in error


def test_text_format_is_one_plain_line_with_the_fields():
    record = logging.LogRecord("loom.x", logging.INFO, __file__, 1, "hello %s", ("you",), None)
    with logs.bound_to(request_id="r1", op="memory.get"):
        text = logs.TextFormatter().format(record)
        line = json.loads(logs.JsonFormatter().format(record))
    assert "INFO loom.x: hello you request_id=r1 op=memory.get" in text
    assert line["message"] == "hello you" and line["op"] == "memory.get"
    with pytest.raises(ValueError):
        logs.bind(user_id="u-1")  # a raw user id is not a log field


# --- metrics ------------------------------------------------------------------------------------


def test_metrics_count_requests_by_op_and_status(client):
    before = scrape(client)
    for _ in range(3):
        client.post("/v1/working_memory.set",
                    json={**NS, "block_key": "k", "content": "x"})
    client.post("/v1/working_memory.get", json={**NS, "block_key": ""})
    client.post("/v1/no.such_op", json={})
    after = scrape(client)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("loom_http_requests_total", op="working_memory.set", status="200") == 3
    assert delta("loom_http_requests_total", op="working_memory.get", status="422") == 1
    assert delta("loom_http_requests_total", op="unmatched", status="404") == 1
    assert delta("loom_http_request_duration_seconds_count", op="working_memory.set") == 3
    assert delta("loom_http_request_duration_seconds_bucket", op="working_memory.set",
                 le="+Inf") == 3


def test_rate_limited_requests_are_counted(app_factory):
    client = app_factory(rate_limit=(2, 60)).test_client()
    before = scrape(client)
    statuses = [client.post("/v1/working_memory.get", json={**NS, "block_key": "k"}).status_code
                for _ in range(4)]
    assert statuses.count(429) >= 1
    after = scrape(client)
    op = "working_memory.get"
    assert (value(after, "loom_http_rate_limited_total", op=op)
            - value(before, "loom_http_rate_limited_total", op=op)) == statuses.count(429)


def test_metrics_with_auth_on_take_the_admin_or_the_metrics_token(app_factory):
    client = auth_app(app_factory, metrics_token=METRICS_TOKEN).test_client()
    assert client.get("/metrics").status_code == 401
    writer = mint(client, org="acme", namespace="support", role="admin")
    assert client.get("/metrics", headers=bearer(writer)).status_code == 403
    assert client.get("/metrics", headers=bearer("wrong")).status_code == 403
    assert client.get("/metrics", headers=bearer(ADMIN_TOKEN)).status_code == 200
    assert client.get("/metrics", headers=bearer(METRICS_TOKEN)).status_code == 200


def test_a_pass_counts_builds_passes_model_calls_and_tokens_by_org(app_factory, tmp_path):
    with ScriptedModelServer(default=lambda request: {"preferred_name": "Sam"}) as model:
        app = app_factory(llm_base_url=model.base_url, llm_model="scripted-model")
        client = app.test_client()
        client.post("/v1/profile_schema.set", json={**NS, "json_schema": SCHEMA})
        for user in ("u-1", "u-2", "u-3"):
            client.post("/v1/memory.set", json={**NS, "user_id": user, "key": "name",
                                                "value": f"I am {user}"})
        result = run_pass(app.extensions["loom"], holder="metrics-test", force=True)
        assert [outcome for _, _, outcome in result["built"]] == ["built"] * 3
        calls = [r for r in model.requests if r.path.endswith("/chat/completions")]
        scraped = scrape(client)
    assert value(scraped, "loom_builds_total", outcome="built") == 3
    assert value(scraped, "loom_passes_total", **{"pass": "structured_profile"}) == 1
    assert value(scraped, "loom_pass_duration_seconds_count",
                 **{"pass": "structured_profile"}) == 1
    assert value(scraped, "loom_model_calls_total", org="default") == len(calls) == 3
    usage = client.post("/v1/usage.get", json=NS).get_json()
    assert value(scraped, "loom_model_prompt_tokens_total", org="default") == usage[
        "prompt_tokens"] > 0
    assert value(scraped, "loom_model_completion_tokens_total", org="default") == usage[
        "completion_tokens"] > 0


def test_org_labels_are_capped_and_the_rest_count_as_other(app_factory):
    app = app_factory(metrics_max_orgs=2)
    store = app.extensions["loom"].store(JobMetricsStore)
    assert store.add_by_org("acme", {"loom_model_calls_total": 1}) == "acme"
    assert store.add_by_org("globex", {"loom_model_calls_total": 2}) == "globex"
    assert store.add_by_org("initech", {"loom_model_calls_total": 4}) == OTHER_ORG
    assert store.add_by_org("umbrella", {"loom_model_calls_total": 8}) == OTHER_ORG
    assert store.add_by_org("acme", {"loom_model_calls_total": 16}) == "acme"
    scraped = scrape(app.test_client())
    orgs = {dict(labels)["org"]: v for (name, labels), v in scraped.items()
            if name == "loom_model_calls_total"}
    assert orgs == {"acme": 17, "globex": 2, OTHER_ORG: 12}


def test_pass_duration_is_a_cumulative_histogram(app_factory):
    app = app_factory()
    services = app.extensions["loom"]
    for seconds in (0.05, 0.7, 42.0):
        record_pass(services, "structured_profile", seconds, ["built", "short", "failed"])
    scraped = scrape(app.test_client())
    labels = {"pass": "structured_profile"}
    assert value(scraped, "loom_pass_duration_seconds_bucket", le="0.1", **labels) == 1
    assert value(scraped, "loom_pass_duration_seconds_bucket", le="1.0", **labels) == 2
    assert value(scraped, "loom_pass_duration_seconds_bucket", le="60.0", **labels) == 3
    assert value(scraped, "loom_pass_duration_seconds_bucket", le="+Inf", **labels) == 3
    assert value(scraped, "loom_pass_duration_seconds_sum", **labels) == pytest.approx(42.75)
    for outcome in ("built", "short", "failed"):
        assert value(scraped, "loom_builds_total", outcome=outcome) == 3


def test_queue_gauges_and_the_lease_holders_age(app_factory, clock):
    app = app_factory(clock=clock)
    services = app.extensions["loom"]
    client = app.test_client()
    queue = Queue(BUILDS, connection=services.queue_redis)
    queue.enqueue("jobs.structured_profile.build_user_job", "o", "n", "u")
    queue.enqueue("jobs.structured_profile.build_user_job", "o", "n", "u2")
    failed = Queue(PASSES, connection=services.queue_redis).enqueue("jobs.nothing")
    FailedJobRegistry(queue=Queue(PASSES, connection=services.queue_redis)).add(
        failed, ttl=600, exc_string="boom")
    lease = services.store(LeaseStore).acquire("structured_profile", "host:1", 600)
    assert lease is not None
    clock.advance(75)
    scraped = scrape(client)
    assert value(scraped, "loom_queue_depth", queue=BUILDS) == 2
    assert value(scraped, "loom_queue_oldest_job_age_seconds", queue=BUILDS) >= 0
    assert value(scraped, "loom_queue_failed_jobs", queue=PASSES) == 1
    assert value(scraped, "loom_queue_failed_jobs", queue=BUILDS) == 0
    assert value(scraped, "loom_workers_alive", queue=BUILDS) == 0
    assert value(scraped, "loom_lease_held", lease="structured_profile") == 1
    assert value(scraped, "loom_lease_holder_age_seconds",
                 lease="structured_profile") == pytest.approx(75)
    assert value(scraped, "loom_lease_held", lease="profile_consolidation") == 0
    lease.release()
    scraped = scrape(client)
    assert value(scraped, "loom_lease_held", lease="structured_profile") == 0
    assert value(scraped, "loom_lease_holder_age_seconds", lease="structured_profile") == 0


def test_the_queue_reader_dates_the_oldest_waiting_job_from_the_time_it_is_given(app_factory):
    services = app_factory().extensions["loom"]
    queue = Queue(BUILDS, connection=services.queue_redis)
    first = queue.enqueue("jobs.nothing")
    queue.enqueue("jobs.nothing")
    enqueued = queue.fetch_job(first.id).enqueued_at
    enqueued = enqueued if enqueued.tzinfo else enqueued.replace(tzinfo=UTC)
    reader = services.store(JobQueueReader)
    census = reader.read(enqueued + timedelta(seconds=90))
    by_name = {reading.name: reading for reading in census.queues}
    assert sorted(by_name) == sorted(ALL_QUEUES)
    builds = by_name[BUILDS]
    assert (builds.depth, builds.oldest_age_seconds, builds.failed, builds.workers) == (
        2, 90.0, 0, 0)
    assert (by_name[PASSES].depth, by_name[PASSES].oldest_age_seconds) == (0, 0.0)
    assert (census.schedulers_alive, census.scheduled_jobs) == (0, 0)
    # A clock behind the enqueue time reads no negative age.
    early = reader.read(enqueued - timedelta(seconds=5))
    assert [reading.oldest_age_seconds for reading in early.queues
            if reading.name == BUILDS] == [0.0]


def test_metrics_still_answer_when_the_queue_redis_is_down(app_factory):
    dead = f"redis://127.0.0.1:{free_port()}/0"
    client = app_factory(queue_url=dead).test_client()
    client.post("/v1/working_memory.set", json={**NS, "block_key": "k", "content": "x"})
    scraped = scrape(client)
    assert value(scraped, "loom_http_requests_total", op="working_memory.set",
                 status="200") >= 1
    assert not any(name == "loom_queue_depth" for name, _ in scraped)
    assert value(scraped, "loom_redis_errors_total", process="web") >= 1


def test_a_request_answered_503_for_a_dead_store_counts_as_a_redis_error(tmp_path):
    from app import metrics

    dead = f"redis://127.0.0.1:{free_port()}/0"
    client = make_app(dead, tmp_path, queue_url=dead).test_client()
    errors = metrics.REDIS_ERRORS.labels(process="web")
    before = errors._value.get()
    answer = client.post("/v1/working_memory.set", json={**NS, "block_key": "k", "content": "x"})
    assert answer.status_code == 503
    assert answer.get_json()["error"]["code"] == "STORE_UNAVAILABLE"
    # Counted by the request itself, not by a scrape that meets the same dead store.
    assert errors._value.get() == before + 1


# --- the queue dashboard ----------------------------------------------------------------------


def test_dashboard_answers_the_admin_and_refuses_others(app_factory):
    client = auth_app(app_factory).test_client()
    Queue(BUILDS, connection=client.application.extensions["loom"].queue_redis).enqueue(
        "jobs.structured_profile.build_user_job", "o", "n", "u")
    refused = client.get("/rq/")
    assert refused.status_code == 401 and refused.headers["WWW-Authenticate"].startswith("Basic")
    org_admin = mint(client, org="acme", namespace="*", role="admin")
    assert client.get("/rq/", headers=bearer(org_admin)).status_code == 403
    assert client.get("/rq/0/data/queues.json", headers=bearer(org_admin)).status_code == 403
    page = client.get("/rq/", headers=bearer(ADMIN_TOKEN))
    assert page.status_code == 200 and "RQ dashboard" in page.get_data(as_text=True)
    basic = base64.b64encode(f"admin:{ADMIN_TOKEN}".encode()).decode()
    queues = client.get("/rq/0/data/queues.json", headers={"Authorization": f"Basic {basic}"})
    assert queues.status_code == 200
    assert {q["name"]: q["count"] for q in queues.get_json()["queues"]}[BUILDS] == 1
    workers = client.get("/rq/0/data/workers.json", headers=bearer(ADMIN_TOKEN))
    assert workers.status_code == 200 and workers.get_json() == {"workers": []}
