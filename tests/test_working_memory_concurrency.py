"""No lost update: concurrent writers on one block, through the app and through gunicorn."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

WRITERS = 8
EACH = 40
NS = {"namespace": "race", "agent": "bot", "block_key": "log"}


def _run(writers, work):
    with ThreadPoolExecutor(max_workers=writers) as pool:
        return [f.result() for f in [pool.submit(work, w) for w in range(writers)]]


def _assert_every_addition_once(content, count_writers, each):
    parts = content.split("\n")
    expected = {f"w{w}-{i}" for w in range(count_writers) for i in range(each)}
    assert len(parts) == len(expected)
    assert set(parts) == expected


def test_eight_appenders_through_the_app_lose_nothing(app):
    def work(writer):
        client = app.test_client()
        versions = []
        for i in range(EACH):
            response = client.post(
                "/v1/working_memory.append",
                json={**NS, "addition": f"w{writer}-{i}"},
            )
            assert response.status_code == 200, response.get_json()
            versions.append(response.get_json()["version"])
        return versions

    versions = [v for chunk in _run(WRITERS, work) for v in chunk]
    assert len(set(versions)) == WRITERS * EACH  # every acknowledged write is its own version
    content = app.test_client().post("/v1/working_memory.get", json=NS).get_json()["content"]
    _assert_every_addition_once(content, WRITERS, EACH)


@pytest.mark.slow
def test_eight_appenders_through_gunicorn_lose_nothing(live_server):
    def work(writer):
        with requests.Session() as http:
            for i in range(EACH):
                response = http.post(
                    live_server.url + "/v1/working_memory.append",
                    json={**NS, "addition": f"w{writer}-{i}"},
                    timeout=10,
                )
                assert response.status_code == 200

    _run(WRITERS, work)
    content = requests.post(live_server.url + "/v1/working_memory.get", json=NS, timeout=10)
    _assert_every_addition_once(content.json()["content"], WRITERS, EACH)


def test_concurrent_replaces_each_land_once(app):
    tokens = [f"<{w}-{i}>" for w in range(WRITERS) for i in range(EACH)]
    client = app.test_client()
    client.post(
        "/v1/working_memory.set",
        json={**NS, "content": "".join(tokens), "char_limit": 16384},
    )

    def work(writer):
        c = app.test_client()
        for i in range(EACH):
            r = c.post(
                "/v1/working_memory.replace",
                json={**NS, "old": f"<{writer}-{i}>", "new": f"[{writer}-{i}]"},
            )
            assert r.status_code == 200

    _run(WRITERS, work)
    content = client.post("/v1/working_memory.get", json=NS).get_json()["content"]
    assert content == "".join(t.replace("<", "[").replace(">", "]") for t in tokens)


def test_concurrent_sets_give_distinct_increasing_versions(app):
    def work(writer):
        c = app.test_client()
        return [
            c.post("/v1/working_memory.set", json={**NS, "content": f"w{writer}-{i}"})
            .get_json()["version"]
            for i in range(EACH)
        ]

    results = _run(WRITERS, work)
    for chunk in results:
        assert chunk == sorted(chunk) and len(set(chunk)) == len(chunk)
    every = [v for chunk in results for v in chunk]
    assert len(set(every)) == len(every)
    final = app.test_client().post("/v1/working_memory.get", json=NS).get_json()
    assert final["version"] == max(every)
