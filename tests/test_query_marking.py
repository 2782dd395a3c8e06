"""How the endpoint is told a query from a document (LOOM_EMBED_QUERY_MODE), through the Flask
app against a real server and the scripted embeddings server, which records every body it was
sent: facts and profile sections go as documents, a search's question as a query."""

from __future__ import annotations

from typing import Any

import pytest

from app.model.embeddings import EMBEDDED_MODEL, QueryMarking
from app.queue_names import BUILDS
from app.settings import SettingsError, load_settings
from app.store.recall_vectors import RecallVectorStore, fingerprint
from tests.support.api import op_helpers
from tests.support.model_server import ScriptedModelServer
from tests.support.rq_worker import run_queued

NS = {"namespace": "support", "agent": "triage-bot", "user_id": "u-42"}
SYNONYMS = {"automobile": "car", "food": "vegetarian"}
FACT = "drives an automobile to the office"
SECTION = "vegetarian, no meat"
QUESTION = "how do I get to work by car"


@pytest.fixture
def srv():
    with ScriptedModelServer(synonyms=SYNONYMS) as server:
        yield server


_, ok = op_helpers(NS)


def run_jobs(app) -> None:
    run_queued(app.extensions["loom"], BUILDS)


def sent(srv: ScriptedModelServer, app, **settings: Any) -> dict[str, dict[str, Any]]:
    """Write a fact and a profile section, run their vector jobs, search once; answers the
    body of each embeddings call by what it carried: the fact, the section, the question."""
    client = app.test_client()
    ok(client, "memory.set", key="commute", value=FACT)
    ok(client, "profile.set", label="diet", value=SECTION)
    run_jobs(app)
    out = ok(client, "memory.search", query=QUESTION, read_scope="own_user")
    assert [hit["key"] for hit in out["hits"]] == ["commute"]
    assert "vector" in out["hits"][0]["legs"]
    by_what: dict[str, dict[str, Any]] = {}
    for request in srv.embedding_requests:
        (text,) = request.body["input"]
        what = ("fact" if FACT in text else "section" if "vegetarian" in text
                else "question" if QUESTION in text else text)
        by_what[what] = request.body
    assert set(by_what) == {"fact", "section", "question"}, by_what
    return by_what


def app_with(app_factory, srv, model: str, **settings: Any):
    return app_factory(embed_base_url=srv.base_url, embed_model=model, **settings)


def test_auto_sends_the_embedded_models_input_type(app_factory, srv):
    bodies = sent(srv, app_with(app_factory, srv, EMBEDDED_MODEL))
    assert bodies["fact"]["input_type"] == "document"
    assert bodies["section"]["input_type"] == "document"
    assert bodies["question"]["input_type"] == "query"
    assert bodies["question"]["input"] == [QUESTION]  # no prefix beside the field


def test_auto_prefixes_for_an_e5_model(app_factory, srv):
    bodies = sent(srv, app_with(app_factory, srv, "intfloat/multilingual-e5-small"))
    assert bodies["fact"]["input"][0].startswith("passage: ")
    assert bodies["section"]["input"][0].startswith("passage: ")
    assert bodies["question"]["input"] == ["query: " + QUESTION]
    assert not any("input_type" in body for body in bodies.values())


def test_auto_sends_nothing_extra_for_another_model(app_factory, srv):
    bodies = sent(srv, app_with(app_factory, srv, "text-embedding-3-small"))
    assert bodies["question"]["input"] == [QUESTION]
    assert bodies["fact"]["input"][0] == f"commute: {FACT}"
    assert not any("input_type" in body for body in bodies.values())


def test_input_type_with_the_field_and_names_set(app_factory, srv):
    app = app_with(app_factory, srv, "embed-v4", embed_query_mode="input_type",
                   embed_input_type_field="task",
                   embed_input_types=("retrieval.query", "retrieval.passage"))
    bodies = sent(srv, app)
    assert bodies["fact"]["task"] == "retrieval.passage"
    assert bodies["section"]["task"] == "retrieval.passage"
    assert bodies["question"]["task"] == "retrieval.query"
    assert "input_type" not in bodies["question"]


def test_prefix_with_the_prefixes_set(app_factory, srv):
    app = app_with(app_factory, srv, "nomic-embed-text", embed_query_mode="prefix",
                   embed_query_prefix="search_query: ",
                   embed_document_prefix="search_document: ")
    bodies = sent(srv, app)
    assert bodies["fact"]["input"] == [f"search_document: commute: {FACT}"]
    assert bodies["section"]["input"][0].startswith("search_document: ")
    assert bodies["question"]["input"] == ["search_query: " + QUESTION]


def test_none_turns_the_embedded_models_field_off(app_factory, srv):
    bodies = sent(srv, app_with(app_factory, srv, EMBEDDED_MODEL, embed_query_mode="none"))
    assert not any("input_type" in body for body in bodies.values())
    assert bodies["question"]["input"] == [QUESTION]


def test_a_facts_fingerprint_names_how_documents_were_marked(app_factory, srv):
    # Vectors made under one marking are not current under another: backfill makes them again.
    app = app_with(app_factory, srv, EMBEDDED_MODEL)
    sent(srv, app)
    services = app.extensions["loom"]
    memory_id = ok(app.test_client(), "memory.get", key="commute")["memory"]["memory_id"]
    (stored,) = services.store(RecallVectorStore).fingerprints(
        services.settings.default_org, "support", "u-42", [memory_id])
    text = f"commute: {FACT}"
    marked = fingerprint(EMBEDDED_MODEL + "\x00input_type=document", None, text)
    assert stored == marked
    assert marked != fingerprint(EMBEDDED_MODEL, None, text)


def test_the_settings_parse_and_refuse_by_name():
    settings = load_settings(environ={
        "LOOM_EMBED_QUERY_MODE": "Prefix",
        "LOOM_EMBED_INPUT_TYPES": "search_query, search_document",
        "LOOM_EMBED_QUERY_PREFIX": "q: "})
    assert settings.embed_query_mode == "prefix"
    assert settings.embed_input_types == ("search_query", "search_document")
    assert settings.embed_query_prefix == "q: "  # the trailing space is kept
    assert settings.embed_document_prefix == "passage: "
    for name, value in (("LOOM_EMBED_QUERY_MODE", "guess"), ("LOOM_EMBED_INPUT_TYPES", "query")):
        with pytest.raises(SettingsError, match=name):
            load_settings(environ={name: value})


@pytest.mark.parametrize(("model", "mode"), [
    ("multilingual-e5-small-q4", "input_type"),
    ("portuguese-multilingual-e5-small-q4", "input_type"),
    ("intfloat/e5-large-v2", "prefix"),
    ("multilingual-e5-base", "prefix"),
    ("text-embedding-3-small", "none"),
    ("voyage-3", "none"),
    ("bge-m3", "none"),
])
def test_auto_resolves_by_the_model_name(model, mode):
    assert QueryMarking().resolved(model) == mode
    assert QueryMarking(mode="none").resolved(model) == "none"
