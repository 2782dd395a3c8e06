"""bench/memory_vectors.py at a tiny size, on the embedded server and on Redis 8 with vector
sets: its figures are the store's, not arithmetic of its own. A fact costs at least its floor
(the text and its int8 vector), every fact's vector is where this version keeps it (on the
engine in the user's set and again in the namespace's set, which a namespace search reads; in
the user's vector hash elsewhere), and the processes it measures did search."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import memory_vectors

FACTS, USERS, TEXT, DIMENSIONS = 60, 3, 133, 384


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("bench") / "measured.json"
    assert memory_vectors.main([
        "--facts", str(FACTS), "--users", str(USERS), "--text", str(TEXT),
        "--dimensions", str(DIMENSIONS), "--engines", "vectorset,valkey", "--small-cache", "10",
        "--no-record", "--json", str(out)]) == 0
    return json.loads(Path(out).read_text())


@pytest.mark.parametrize("engine", ["vectorset", "valkey"])
def test_a_fact_costs_at_least_its_text_and_vector(measured, engine):
    figures = measured[engine]
    assert figures["floor"] == TEXT + DIMENSIONS  # every text is --text bytes
    families = figures["families"]
    # MEMORY USAGE of the fact's own keys alone: above the floor, and within what the server
    # says it grew by (plus its allocator's slack; a tiny run's used_memory is noisy).
    assert sum(families.values()) > figures["floor"]
    assert figures["used_memory_per_fact"] > figures["floor"]
    assert families["loom:mem:"] > TEXT  # the row holds the text


def test_on_the_engine_each_vector_is_in_its_users_set_and_the_namespaces(measured):
    families = measured["vectorset"]["families"]
    # Q8: a byte a dimension at least, in each set.
    assert families["loom:recall-vset:"] >= DIMENSIONS
    assert families["loom:recall-ns-vset:"] >= DIMENSIONS
    # The user's hash keeps the fingerprint alone there, far less than a vector.
    assert families["loom:recall-vec:"] < DIMENSIONS


def test_on_exact_cosine_the_vector_is_in_the_users_hash(measured):
    families = measured["valkey"]["families"]
    assert families["loom:recall-vec:"] >= DIMENSIONS
    assert "loom:recall-vset:" not in families
    assert "loom:recall-ns-vset:" not in families


@pytest.mark.parametrize("engine", ["vectorset", "valkey"])
def test_the_search_processes_were_measured(measured, engine):
    rss = measured[engine]["rss"]
    roles = {"web, cache cap default", "worker, cache cap default"}
    if engine == "valkey":
        roles |= {"web, cache cap 10", "worker, cache cap 10"}
    assert set(rss) == roles
    for figures in rss.values():
        assert 0 < figures["before_kib"] <= figures["after_kib"] + 1024
