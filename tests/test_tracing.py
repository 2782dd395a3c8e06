"""OpenTelemetry as the README tells a deployer to add it: the Flask and Redis instrumentations
on the built app give one server span per op request, with that request's Redis calls as its
children, whatever the op's answer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.instrumentation.flask import FlaskInstrumentor
from opentelemetry.instrumentation.redis import RedisInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.conftest import on_cluster_skip

WHO = {"namespace": "support", "agent": "triage-bot", "user_id": "u-1"}

pytestmark = on_cluster_skip  # the cluster client's spans are another instrumentation's shape


@pytest.fixture
def traced(app_factory) -> Iterator[tuple[object, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    redis_instrumentor = RedisInstrumentor()
    # Process-wide, as a deployer runs it before the app is built; undone after the test.
    redis_instrumentor.instrument(tracer_provider=provider)
    app = app_factory()
    FlaskInstrumentor().instrument_app(app, tracer_provider=provider)
    try:
        yield app, exporter
    finally:
        FlaskInstrumentor().uninstrument_app(app)
        redis_instrumentor.uninstrument()
        provider.shutdown()


def _one_request_spans(exporter: InMemorySpanExporter) -> tuple[ReadableSpan, list[ReadableSpan]]:
    spans = list(exporter.get_finished_spans())
    exporter.clear()
    servers = [span for span in spans if span.kind == SpanKind.SERVER]
    assert len(servers) == 1, [span.name for span in spans]
    server = servers[0]
    others = [span for span in spans if span is not server]
    assert server.context is not None
    for span in others:
        assert span.kind == SpanKind.CLIENT, span.name
        assert span.parent is not None and span.parent.span_id == server.context.span_id, span.name
        assert span.context is not None and span.context.trace_id == server.context.trace_id
    return server, others


SAMPLE = [
    ("/v1/working_memory.set", {**WHO, "content": "step 3"}, 200, {"EVALSHA"}),
    ("/v1/working_memory.get", WHO, 200, {"HGET"}),
    ("/v1/working_memory.append", {**WHO, "addition": "x"}, 200, {"EVALSHA"}),
    ("/v1/profile.set", {**WHO, "label": "persona", "value": "terse"}, 200, None),
    ("/v1/profile.render", WHO, 200, None),
    ("/v1/working_memory.set", {**WHO, "content": 7}, 422, set()),
]


@pytest.mark.parametrize(("path", "body", "status", "commands"), SAMPLE,
                         ids=[f"{path}-{status}" for path, _b, status, _c in SAMPLE])
def test_one_server_span_per_op_with_its_redis_calls_under_it(traced, path, body, status,
                                                              commands):
    app, exporter = traced
    client = app.test_client()  # type: ignore[attr-defined]
    client.post("/v1/working_memory.set", json={**WHO, "content": "before"})
    exporter.clear()
    answer = client.post(path, json=body)
    assert answer.status_code == status, answer.get_json()
    server, redis_spans = _one_request_spans(exporter)
    assert server.name == f"POST {path}"
    assert server.attributes is not None
    assert server.attributes.get("http.response.status_code",
                                 server.attributes.get("http.status_code")) == status
    names = {span.name.split()[0] for span in redis_spans}
    if commands is None:
        assert redis_spans, "a write or a render reads or writes Redis"
    elif commands:
        assert commands <= names  # (and SCRIPT LOAD, the first time a script runs)
    else:
        assert names == set()


def test_a_failure_marks_the_server_span_as_an_error(traced, monkeypatch):
    from app.store.working_memory import WorkingMemoryStore

    def broken(*_args, **_kwargs):
        raise RuntimeError("a bug in a store")

    app, exporter = traced
    monkeypatch.setattr(WorkingMemoryStore, "get", broken)
    answer = app.test_client().post("/v1/working_memory.get", json=WHO)  # type: ignore[attr-defined]
    assert answer.status_code == 500
    server, _redis = _one_request_spans(exporter)
    assert not server.status.is_ok
