"""What one search may ask for, through the Flask app: the query's characters and distinct
terms, its tags and its ``limit`` have maximums the OpenAPI document states, and a request past
one is a 422 naming the field and the limit, on every op that searches by a query
(memory.search, memory.ask, memory.unified_search, context.pack). Within them, what a search
costs the store per call is bounded by the lexical script's budget (tests/test_recall.py,
``test_a_search_past_its_budget_goes_on_in_calls_each_within_it``).
"""

from __future__ import annotations

import pytest

from app.ops.recall import FILTER_TAGS_MAX, QUERY_MAX, QUERY_TERMS_MAX, SEARCH_LIMIT_MAX
from app.schemas.rules import rule_holds, terms_within
from app.store.recall_terms import query_terms
from tests.support.api import op_helpers

NS = {"namespace": "support", "agent": "triage-bot", "user_id": "u-42"}
call, ok = op_helpers(NS)
QUERY_OPS = ("memory.search", "memory.ask", "memory.unified_search", "context.pack")
# The ops with memory.search's own fields: tags and limit as well as the query.
SEARCH_OPS = ("memory.search", "memory.ask", "memory.unified_search")


def distinct_terms(count: int) -> str:
    """A query of ``count`` distinct terms (count >= 1), padded with words that add none:
    stop words, a repeat, and three words of one stem."""
    words = [f"harbour{i}" for i in range(count - 1)]
    return " ".join(["the", "walking", *words, "of", "walks", *words[:1], "walked"])


def test_the_query_helper_counts_what_a_search_reads():
    assert query_terms("walking walks walked the of") == ["walk"]
    for count in (1, 2, QUERY_TERMS_MAX, QUERY_TERMS_MAX + 1):
        assert len(query_terms(distinct_terms(count))) == count


def refused(client, op: str, **body) -> list[str]:
    status, out = call(client, op, **body)
    assert status == 422, (op, status, out)
    assert out["error"]["code"] == "VALIDATION_ERROR"
    (field,) = out["error"]["fields"]
    return [field, *out["error"]["fields"][field]]


@pytest.mark.parametrize("op", QUERY_OPS)
def test_a_query_past_its_distinct_terms_is_a_422_naming_the_field_and_the_limit(client, op):
    at_most = distinct_terms(QUERY_TERMS_MAX)
    # Stop words, repeats and words of one stem add no term: this is the longest accepted.
    status, out = call(client, op, query=at_most + " the " + at_most)
    assert status != 422, out
    past = at_most + " lighthouse"
    field, message = refused(client, op, query=past)
    assert field == "query"
    assert f"holds {QUERY_TERMS_MAX + 1} distinct terms" in message
    assert f"at most {QUERY_TERMS_MAX}" in message


@pytest.mark.parametrize("op", QUERY_OPS)
def test_a_query_past_its_characters_is_a_422_naming_the_field_and_the_limit(client, op):
    assert call(client, op, query="harbour " + "x" * (QUERY_MAX - 8))[0] != 422
    field, message = refused(client, op, query="harbour " + "x" * (QUERY_MAX - 7))
    assert field == "query" and str(QUERY_MAX) in message


@pytest.mark.parametrize("op", SEARCH_OPS)
def test_tags_and_limit_past_their_maximums_are_422s_naming_them(client, op):
    tags = [f"t{i}" for i in range(FILTER_TAGS_MAX)]
    assert call(client, op, query="harbour", tags=tags, limit=SEARCH_LIMIT_MAX)[0] != 422
    field, message = refused(client, op, query="harbour", tags=[*tags, "one-more"])
    assert field == "tags" and str(FILTER_TAGS_MAX) in message
    field, message = refused(client, op, query="harbour", limit=SEARCH_LIMIT_MAX + 1)
    assert field == "limit" and str(SEARCH_LIMIT_MAX) in message


def test_a_search_at_every_maximum_answers_its_hits(client):
    """The longest accepted search (every maximum at once, namespace scope) is answered, with
    the hits of the words it holds."""
    for i in range(30):
        ok(client, "memory.set", key=f"walk{i}", value=f"harbour{i} lighthouse",
           tags=["coast"], user_id=f"u-{i % 3}")
    tags = ["coast", *[f"t{i}" for i in range(FILTER_TAGS_MAX - 1)]]
    out = ok(client, "memory.search", query=distinct_terms(QUERY_TERMS_MAX), read_scope="namespace",
             limit=SEARCH_LIMIT_MAX, tags=tags[:1])
    assert sorted(hit["key"] for hit in out["hits"]) == sorted(f"walk{i}" for i in range(30))
    none = ok(client, "memory.search", query=distinct_terms(QUERY_TERMS_MAX),
              read_scope="namespace", limit=SEARCH_LIMIT_MAX, tags=tags)
    assert none["hits"] == []


def _args_schema(document: dict, path: str) -> dict:
    node = next(iter(document["paths"][path].values()))
    node = node["requestBody"]["content"]["application/json"]["schema"]
    while "$ref" in node:
        node = document["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


@pytest.mark.parametrize("op", QUERY_OPS)
def test_the_document_states_each_maximum_and_a_body_keeps_it_as_the_op_does(client, op):
    document = client.get("/openapi.json").get_json()
    schema = _args_schema(document, f"/v1/{op}")
    query = schema["properties"]["query"]
    assert query["maxLength"] == QUERY_MAX
    assert f"{QUERY_TERMS_MAX} distinct terms" in query["description"]
    rules = schema["x-loom-rules"]
    assert terms_within("query", QUERY_TERMS_MAX) in rules
    if op in SEARCH_OPS:
        assert schema["properties"]["tags"]["maxItems"] == FILTER_TAGS_MAX
        assert schema["properties"]["limit"]["maximum"] == SEARCH_LIMIT_MAX
    for count in (1, QUERY_TERMS_MAX, QUERY_TERMS_MAX + 1):
        body = {**NS, "query": distinct_terms(count)}
        kept = all(rule_holds(rule, body) for rule in rules)
        assert kept is (count <= QUERY_TERMS_MAX)
        assert (client.post(f"/v1/{op}", json=body).status_code != 422) is kept, count
