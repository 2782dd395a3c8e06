"""The bench's bare baseline app answers every request the mixed bench sends it: a baseline
route that fails makes the bench compare Loom with less work than Loom does (its profile
writes failed twice, each time a store began asking its services for something new)."""

from __future__ import annotations

import importlib
import sys
from collections import Counter
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def baseline(redis_server_url, monkeypatch):
    monkeypatch.setenv("REDIS_URL", redis_server_url)
    monkeypatch.syspath_prepend(str(ROOT))
    sys.modules.pop("bench.baseline_app", None)  # it reads REDIS_URL when imported
    module = importlib.import_module("bench.baseline_app")
    yield module
    sys.modules.pop("bench.baseline_app", None)


def test_the_baseline_answers_every_request_of_the_mixed_cycle(baseline, redis_server_url,
                                                                tmp_path):
    from bench import mixed

    redis.Redis.from_url(redis_server_url).flushdb()
    mixed.seed(redis_server_url, tmp_path)
    client = baseline.app.test_client()
    answered: Counter[tuple[str, int]] = Counter()
    for n in range(2 * len(mixed.CYCLE)):
        op, body = mixed.request_body(n)
        response = client.post(mixed.BASELINE_PATHS[op], data=body,
                               content_type="application/json")
        answered[op, response.status_code] += 1
    assert {status for _, status in answered} == {200}, answered
    assert {op for op, _ in answered} == set(mixed.BASELINE_PATHS)
    rendered = client.post(mixed.BASELINE_PATHS["profile_render"],
                           data=mixed.request_body(mixed.CYCLE.index("profile_render"))[1],
                           content_type="application/json").get_json()
    assert rendered["section_count"] >= 1 and "<profile label=" in rendered["rendered"]
