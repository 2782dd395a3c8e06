"""Facts get their vectors after a fault, within one sweep interval, with real processes.

A real worker (``python -m jobs.worker``) and scheduler (``python -m jobs.scheduler``) run
against two servers this test owns: the data's, persistent, and the queue's, kept in memory
only (``LOOM_QUEUE_URL``), as a queue's server often is. The scripted embeddings server holds
the first call, so an embeddings job is in flight when more facts are written: those writes
set the user's queued marker and enqueue a second job. The queue's server is then killed
(kill -9) and started again empty, so that second job is lost while its marker, on the data's
server, lives on. The sweep finds the marker's job gone and enqueues anew: every fact has its
vector within the sweep's interval (plus the time a job takes), where the marker alone would
have held the user back for its ten minutes. The second test kills the one server of data and
queue while the job's call is held, so the job fails to store its vectors: the sweep again gives
every fact its vector within its interval.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis

from app.store import keys
from app.store.recall_vectors import QUEUED_MARKER_SECONDS
from tests.conftest import TEST_SECRET, make_app
from tests.support.model_server import ScriptedModelServer
from tests.support.owned_redis import OwnedRedis
from tests.support.processes import loom_env, start, stop, wait_for

pytestmark = [pytest.mark.real, pytest.mark.slow]

NS = "support"
USER = "u-1"
SWEEP_SECONDS = 4
# What a pass may take on a loaded machine beyond its interval: the scheduler's poll (a quarter
# of the interval), the worker picking the sweep and then the job up, one embeddings call.
SLACK_SECONDS = 20


def _fact(client, key: str, value: str) -> None:
    answer = client.post("/v1/memory.set", json={
        "namespace": NS, "agent": "chat", "user_id": USER, "key": key, "value": value,
        "memory_type": "semantic"})
    assert answer.status_code == 200, answer.get_json()


def test_facts_get_vectors_within_a_sweep_after_the_queue_server_is_killed(tmp_path: Path):
    data = OwnedRedis(tmp_path / "data-redis").start()
    queue = OwnedRedis(tmp_path / "queue-redis", appendonly=False).start()
    held = threading.Event()
    processes = []
    with ScriptedModelServer() as model:
        model.script_embedding(gate=held)  # the first call waits for the test
        env = loom_env(
            REDIS_URL=data.url, LOOM_QUEUE_URL=queue.url, LOOM_SECRET_KEY=TEST_SECRET,
            LOOM_DATA_DIR=str(tmp_path / "data"), LOOM_EMBED_BASE_URL=model.base_url,
            LOOM_EMBED_MODEL="embed-test",
            LOOM_RECALL_EMBED_SWEEP_INTERVAL_SECONDS=str(SWEEP_SECONDS))
        try:
            processes = [start("jobs.worker", env, tmp_path / "worker.log"),
                         start("jobs.scheduler", env, tmp_path / "scheduler.log")]
            app = make_app(data.url, tmp_path / "data", queue_url=queue.url,
                           embed_base_url=model.base_url, embed_model="embed-test")
            client = app.test_client()
            org = app.extensions["loom"].settings.default_org
            store = redis.Redis.from_url(data.url, decode_responses=True)
            marker = keys.recall_vectors_queued(org, NS, USER)
            vectors = keys.recall_vectors(org, NS, USER)
            for i in range(3):
                _fact(client, f"drink-{i}", f"takes tea number {i}")
            wait_for(lambda: model.embedding_requests, 60, "the first job's embeddings call")
            # The first job is in flight and took its marker down: these writes enqueue a
            # second job, which the queue's server loses when it is killed.
            for i in range(2):
                _fact(client, f"ride-{i}", f"drives car number {i}")
            lost_job = store.get(marker)
            assert lost_job and redis.Redis.from_url(queue.url).exists(f"rq:job:{lost_job}")
            queue.kill()
            queue.start()
            assert not redis.Redis.from_url(queue.url).exists(f"rq:job:{lost_job}")
            restarted = time.monotonic()
            held.set()

            def every_fact_has_a_vector() -> bool:
                for process in processes:
                    assert process.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
                return store.hlen(vectors) == 5

            wait_for(every_fact_has_a_vector, SWEEP_SECONDS + SLACK_SECONDS,
                     "every fact's vector after the queue's server came back", every=0.2)
            took = time.monotonic() - restarted
            print(f"every fact had its vector {took:.1f} s after the queue's server came back "
                  f"(sweep interval {SWEEP_SECONDS} s)")
            assert took < SWEEP_SECONDS + SLACK_SECONDS < QUEUED_MARKER_SECONDS
            assert store.zcard(keys.recall_vectors_due(org, NS, USER)) == 0
            # The lost job's marker was taken over by the sweep's job, which has run.
            assert store.get(marker) != lost_job
            hits = client.post("/v1/memory.search", json={
                "namespace": NS, "agent": "chat", "user_id": USER,
                "query": "drives car", "read_scope": "own_user"}).get_json()["hits"]
            assert "vector" in hits[0]["legs"] and hits[0]["key"].startswith("ride-")
        finally:
            held.set()
            for process in processes:
                stop(process)
            queue.stop()
            data.stop()


def test_facts_get_vectors_within_a_sweep_after_the_only_server_is_killed_mid_job(
        tmp_path: Path):
    """One server for data and queue: it is killed (kill -9) while the job's call is held, the
    call is answered while it is down (the job cannot store its vectors and fails), and it comes
    back from its append-only file. The next sweep gives every fact its vector."""
    server = OwnedRedis(tmp_path / "redis").start()
    held = threading.Event()
    processes = []
    with ScriptedModelServer() as model:
        model.script_embedding(gate=held)
        env = loom_env(
            REDIS_URL=server.url, LOOM_SECRET_KEY=TEST_SECRET,
            LOOM_DATA_DIR=str(tmp_path / "data"), LOOM_EMBED_BASE_URL=model.base_url,
            LOOM_EMBED_MODEL="embed-test",
            LOOM_RECALL_EMBED_SWEEP_INTERVAL_SECONDS=str(SWEEP_SECONDS))
        try:
            processes = [start("jobs.worker", env, tmp_path / "worker.log"),
                         start("jobs.scheduler", env, tmp_path / "scheduler.log")]
            app = make_app(server.url, tmp_path / "data", embed_base_url=model.base_url,
                           embed_model="embed-test")
            client = app.test_client()
            org = app.extensions["loom"].settings.default_org
            for i in range(3):
                _fact(client, f"drink-{i}", f"takes tea number {i}")
            wait_for(lambda: model.embedding_requests, 60, "the job's embeddings call")
            server.kill()
            held.set()  # answered while the server is down: the vectors cannot be stored
            time.sleep(1.0)
            server.start()
            restarted = time.monotonic()
            store = redis.Redis.from_url(server.url, decode_responses=True)

            def every_fact_has_a_vector() -> bool:
                for process in processes:
                    assert process.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
                return store.hlen(keys.recall_vectors(org, NS, USER)) == 3

            wait_for(every_fact_has_a_vector, SWEEP_SECONDS + SLACK_SECONDS,
                     "every fact's vector after the server came back", every=0.2)
            print(f"every fact had its vector {time.monotonic() - restarted:.1f} s after the "
                  f"server came back (sweep interval {SWEEP_SECONDS} s)")
            assert len(model.embedding_requests) >= 2  # the failed job's call, and the next
            assert store.zcard(keys.recall_vectors_due(org, NS, USER)) == 0
        finally:
            held.set()
            for process in processes:
                stop(process)
            server.stop()
