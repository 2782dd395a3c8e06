"""memory.search through the Flask app against a real server: the lexical index the write
scripts keep, what stays out of it, read scopes, filters, scratchpad and bad input.

The index is checked against one rebuilt from the rows themselves after every kind of write
(set, lock, pin, delete, delete_version, redact, a change of type), including under
concurrent writers, so an index that drifts from its rows fails here.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from app.store import keys
from app.store.memory import MemoryStore
from app.store.recall_terms import decode, query_terms, row_terms
from tests.auth_support import ADMIN_TOKEN, auth_app, bearer, mint
from tests.conftest import ON_CLUSTER
from tests.support.api import op_helpers

NS = {"namespace": "support", "agent": "triage-bot", "user_id": "u-42"}
call, ok = op_helpers(NS)


def search(client, query, **body):
    return ok(client, "memory.search", query=query, **body)


def keys_of(out):
    return [hit["key"] for hit in out["hits"]]


def text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def org_of(app) -> str:
    return app.extensions["loom"].settings.default_org


def posting(term: str, tf: int, length: int, memory_id: str) -> str:
    """A posting as app/store/lua/recall_posting.lua writes it (layout 2)."""
    return f"{term}\x01{99_999_999 - tf:08d}{length:08d}{memory_id}"


def posting_v1(term: str, tf: int, length: int, memory_id: str) -> str:
    """A posting of the first layout, as an install before it wrote them."""
    return f"{term}\x00{memory_id}\x00{tf}\x00{length}"


def index_matches_rows(app, namespace: str, user_id: str) -> None:
    """The user's postings, docs and stats are exactly what the live facts say they are."""
    services = app.extensions["loom"]
    org = org_of(app)
    redis = services.redis
    rows = services.store(MemoryStore).scan_rows(org, namespace, user_id, batch=10_000)[0]
    expected: dict[str, str] = {}
    for _, row in rows:
        if row is None or not row.live or row.redacted or row.memory_type == "profile":
            continue
        if "forget" in row.tags:
            continue
        expected[row.memory_id] = row_terms(row.key, row.value)
    docs = {text(k): text(v) for k, v in
            redis.hgetall(keys.recall_docs(org, namespace, user_id)).items()}
    assert docs == {k: v for k, v in expected.items() if v}
    postings = set()
    length = 0
    for memory_id, stored in docs.items():
        counts = decode(stored)
        size = sum(counts.values())
        length += size
        postings |= {posting(t, tf, size, memory_id) for t, tf in counts.items()}
    found = {text(m) for m in
             redis.zrange(keys.recall_postings(org, namespace, user_id), 0, -1)}
    assert found == postings
    stats = {text(k): int(v) for k, v in
             redis.hgetall(keys.recall_stats(org, namespace, user_id)).items()}
    # A user never indexed has no layout to mark (both layouts agree on no postings); once
    # marked, the mark stays.
    assert stats.get("layout") == 2 or (not docs and "layout" not in stats)
    assert stats.get("docs", 0) == len(docs)
    assert stats.get("length", 0) == length


# --- the tokenizer -----------------------------------------------------------------------------


def test_query_terms_lowercase_stem_and_drop_stop_words():
    assert query_terms("What are the User's favourite Running shoes?") == [
        "user", "favourit", "run", "shoe"]
    assert query_terms("the of and") == []
    counts = decode(row_terms("invoice_currency", {"note": "Prefers EUR invoices", "n": 3}))
    assert counts == Counter({"invoic": 2, "currenc": 1, "note": 1, "prefer": 1, "eur": 1,
                              "n": 1, "3": 1})


# --- ranking and what a hit carries ------------------------------------------------------------


def test_search_ranks_by_bm25_and_names_the_matched_terms(client):
    ok(client, "memory.set", key="currency", value="Prefers EUR invoices, paid monthly.",
       memory_type="preference")
    ok(client, "memory.set", key="pet", value="Has a dog called Rex who loves running.")
    ok(client, "memory.set", key="shoes", value="Bought new running shoes for the marathon.")
    ok(client, "memory.set", key="other", value="Lives in Lisbon.")
    out = search(client, "which running shoes", read_scope="own_user")
    assert keys_of(out) == ["shoes", "pet"]
    first, second = out["hits"]
    assert first["score"] > second["score"] > 0
    assert first["legs"] == ["lexical"] and sorted(first["matched_terms"]) == ["run", "shoe"]
    assert second["matched_terms"] == ["run"]
    assert first["value"] == "Bought new running shoes for the marathon."
    assert first["memory_type"] == "semantic" and first["memory_id"].startswith("mem_")
    assert out["count"] == 2 and out["read_scope"] == "own_user" and out["scratchpad"] == []
    # A rare term outweighs a common one: "eur" is in one fact, "running" in two.
    out = search(client, "running EUR", read_scope="own_user")
    assert keys_of(out)[0] == "currency"


def test_limit_caps_the_hits_best_first(client):
    for i in range(15):
        ok(client, "memory.set", key=f"k{i}", value="tea " * (i + 1) + "filler words here")
    out = search(client, "tea", limit=5, read_scope="own_user")
    # More occurrences score higher (BM25's saturating tf), so the last written win.
    assert keys_of(out) == ["k14", "k13", "k12", "k11", "k10"]
    assert len(search(client, "tea", read_scope="own_user")["hits"]) == 10


# --- what never comes back ---------------------------------------------------------------------


def test_profile_expired_forgotten_deleted_and_redacted_rows_stay_out(client, app, clock):
    ok(client, "memory.set", key="kept", value="The espresso machine is broken.")
    ok(client, "profile.set", label="about", value="Loves espresso every morning.")
    ok(client, "memory.set", key="forgot", value="espresso order", tags=["forget"])
    ok(client, "memory.set", key="gone", value="espresso beans from Brazil")
    ok(client, "memory.delete", key="gone")
    ok(client, "memory.set", key="secret", value="espresso with secret syrup")
    ok(client, "memory.redact", key="secret")
    ok(client, "memory.set", key="old", value="espresso was cheap",
       valid_to="2001-01-01T00:00:00Z")
    out = search(client, "espresso", read_scope="own_user")
    assert keys_of(out) == ["kept"]
    # The redacted fact's words are gone from the index, not only filtered.
    org = org_of(app)
    docs = app.extensions["loom"].redis.hgetall(keys.recall_docs(org, "support", "u-42"))
    assert not any("syrup" in text(v) or "secret" in text(v) for v in docs.values())
    index_matches_rows(app, "support", "u-42")


def test_every_write_kind_keeps_the_index_equal_to_the_rows(client, app):
    first = ok(client, "memory.set", key="trip", value="Flying to Oslo in May.")
    bergen = ok(client, "memory.set", key="trip", value="Flying to Bergen in June.")
    assert keys_of(search(client, "oslo", read_scope="own_user")) == []
    assert keys_of(search(client, "bergen", read_scope="own_user")) == ["trip"]
    assert bergen["memory_id"] == first["memory_id"]
    # Removing the newest version brings the older content back, and its terms with it.
    ok(client, "memory.delete_version", key="trip", version_text=bergen["version_text"])
    assert keys_of(search(client, "oslo", read_scope="own_user")) == ["trip"]
    assert keys_of(search(client, "bergen", read_scope="own_user")) == []
    index_matches_rows(app, "support", "u-42")
    # A flag writes a version with the same content: the fact stays found.
    ok(client, "memory.lock", key="trip")
    ok(client, "memory.unlock", key="trip")
    ok(client, "memory.pin", key="trip")
    ok(client, "memory.unpin", key="trip")
    assert keys_of(search(client, "oslo", read_scope="own_user")) == ["trip"]
    index_matches_rows(app, "support", "u-42")
    # Turning a fact into a profile row takes it out; a delete of the last one too.
    ok(client, "memory.set", key="trip", value="Flying to Oslo.", memory_type="profile")
    assert keys_of(search(client, "oslo", read_scope="own_user")) == []
    ok(client, "memory.set", key="trip", value="Flying to Oslo.", memory_type="episodic")
    assert keys_of(search(client, "oslo", read_scope="own_user")) == ["trip"]
    ok(client, "memory.delete", key="trip")
    assert keys_of(search(client, "oslo", read_scope="own_user")) == []
    index_matches_rows(app, "support", "u-42")


def test_concurrent_writers_leave_the_index_exact(app):
    def work(writer: int) -> None:
        c = app.test_client()
        for i in range(25):
            key = f"k{i % 4}"
            status, out = call(c, "memory.set", key=key,
                               value=f"writer {writer} wrote word{i % 3} at {i}")
            assert status == 200, out
            if i % 6 == 5:
                call(c, "memory.delete", key=key)
            if i % 9 == 8:
                call(c, "memory.pin", key=key)
                call(c, "memory.unpin", key=key)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    index_matches_rows(app, "support", "u-42")
    client = app.test_client()
    live = {row["key"] for row in ok(client, "memory.list", limit=100)["memories"]}
    assert set(keys_of(search(client, "writer", read_scope="own_user"))) == live


# --- read scopes, filters, scratchpad ----------------------------------------------------------


def test_read_scopes_reach_users_and_sessions_as_profile_render(client):
    ok(client, "memory.set", key="mine", value="kayak trip")
    ok(client, "memory.set", key="session", value="kayak rental", session_id="s-1")
    ok(client, "memory.set", key="shared", value="kayak policy", user_id="-")
    ok(client, "memory.set", key="theirs", value="kayak lessons", user_id="u-7")
    everything = search(client, "kayak")  # the ceiling of auth off: namespace
    assert everything["read_scope"] == "namespace"
    assert sorted(keys_of(everything)) == ["mine", "session", "shared", "theirs"]
    assert {h["user_id"] for h in everything["hits"]} == {"u-42", "-", "u-7"}
    assert sorted(keys_of(search(client, "kayak", read_scope="own_user"))) == [
        "mine", "session", "shared"]
    assert sorted(keys_of(search(client, "kayak", read_scope="own_session",
                                 session_id="s-1"))) == ["session", "shared"]


def test_a_tokens_read_scope_is_the_ceiling(app_factory):
    app = auth_app(app_factory)
    client = app.test_client()
    admin = bearer(ADMIN_TOKEN)
    ok(client, "memory.set", headers=admin, key="mine", value="violin lessons")
    ok(client, "memory.set", headers=admin, key="theirs", value="violin repair", user_id="u-7")
    token = mint(client, namespace="support", role="viewer", read_scope="own_user")
    status, out = call(client, "memory.search", bearer(token), query="violin",
                       read_scope="namespace")
    assert status == 403 and list(out["error"]["fields"]) == ["read_scope"]
    status, out = call(client, "memory.search", bearer(token), query="violin")
    assert status == 200 and keys_of(out) == ["mine"] and out["read_scope"] == "own_user"


def test_filters_type_tags_and_valid_at(client):
    ok(client, "memory.set", key="a", value="garden roses", memory_type="preference",
       tags=["home"])
    ok(client, "memory.set", key="b", value="garden tulips", tags=["home", "spring"],
       valid_at="2030-03-01T00:00:00Z", valid_to="2099-06-01T00:00:00Z")
    ok(client, "memory.set", key="c", value="garden fence", memory_type="episodic")
    own = {"read_scope": "own_user"}
    assert keys_of(search(client, "garden", memory_type="preference", **own)) == ["a"]
    assert keys_of(search(client, "garden", tags=["home", "spring"], **own)) == ["b"]
    assert sorted(keys_of(search(client, "garden", tags=["home"], **own))) == ["a", "b"]
    inside = search(client, "garden", valid_at="2040-04-01T00:00:00Z", **own)
    assert sorted(keys_of(inside)) == ["a", "b", "c"]
    after = search(client, "garden", valid_at="2099-07-01T00:00:00Z", **own)
    assert sorted(keys_of(after)) == ["a", "c"]
    february = search(client, "garden", valid_at="2030-02-01T00:00:00Z", **own)
    assert sorted(keys_of(february)) == ["a", "c"]


def test_selective_filter_reads_past_the_first_candidates(client):
    for i in range(40):
        ok(client, "memory.set", key=f"n{i}", value="lamp " * 5 + f"note {i}")
    ok(client, "memory.set", key="rare", value="lamp", memory_type="decision")
    out = search(client, "lamp", memory_type="decision", limit=1, read_scope="own_user")
    assert keys_of(out) == ["rare"]


def test_scratchpad_carries_the_named_run_and_session_blocks(client):
    ok(client, "working_memory.set", block_key="cursor", content="page 3", session_id="s-1",
       run_id="r-1")
    ok(client, "working_memory.set", block_key="where", content="drafting", session_id="s-1")
    ok(client, "working_memory.set", block_key="agent-note", content="agent wide")
    ok(client, "memory.set", key="fact", value="drafting the report")
    out = search(client, "drafting", session_id="s-1", run_id="r-1", read_scope="own_user")
    assert [(b["layer"], b["block_key"], b["content"]) for b in out["scratchpad"]] == [
        ("run", "cursor", "page 3"), ("session", "where", "drafting")]
    # Blocks are never ranked: the hit is the fact, not the block with the same word.
    assert keys_of(out) == ["fact"]
    assert search(client, "drafting", read_scope="own_user")["scratchpad"] == []


@pytest.mark.parametrize("body, field", [
    ({}, "query"),
    ({"query": ""}, "query"),
    ({"query": "x" * 4097}, "query"),
    ({"query": "a", "limit": 0}, "limit"),
    ({"query": "a", "limit": 101}, "limit"),
    ({"query": "a", "limit": "5"}, "limit"),
    ({"query": "a", "read_scope": "everything"}, "read_scope"),
    ({"query": "a", "tags": "home"}, "tags"),
    ({"query": "a", "valid_at": "yesterday"}, "valid_at"),
    ({"query": "a", "memory_type": "Not A Type"}, "memory_type"),
])
def test_bad_input_is_a_422_naming_the_field(client, body, field):
    status, out = call(client, "memory.search", **body)
    assert status == 422, out
    assert field in out["error"]["fields"]


def test_a_query_of_stop_words_finds_nothing(client):
    ok(client, "memory.set", key="k", value="the and of")
    assert search(client, "the of", read_scope="own_user")["hits"] == []


# --- erasure and export --------------------------------------------------------------------------


def test_erasure_takes_the_users_index_and_leaves_the_others(client, app):
    from tests.support.erasure_worker import run_erasure_jobs

    ok(client, "memory.set", key="a", value="harbour walk at dawn")
    ok(client, "memory.set", key="b", value="harbour ferry", user_id="u-7")
    org = org_of(app)
    redis = app.extensions["loom"].redis
    recall_keys = [keys.recall_docs(org, "support", "u-42"),
                   keys.recall_postings(org, "support", "u-42"),
                   keys.recall_stats(org, "support", "u-42")]
    assert all(redis.exists(key) for key in recall_keys)
    started = ok(client, "user.erase", user_id="u-42")
    run_erasure_jobs(app.extensions["loom"])
    receipt = ok(client, "erasure.status", erasure_id=started["erasure_id"])
    assert receipt["status"] == "done" and receipt["census"]["clean"] is True
    assert not any(redis.exists(key) for key in recall_keys)
    assert not redis.sismember(keys.recall_users(org, "support"), "u-42")
    assert keys_of(search(client, "harbour")) == ["b"]
    assert keys_of(search(client, "harbour", read_scope="own_user")) == []


def test_export_carries_the_facts_but_never_the_index_fields(client):
    ok(client, "memory.set", key="a", value="harbour walk at dawn")
    out = ok(client, "subject.export", user_id="u-42")
    assert "recall_terms" not in str(out) and "harbour walk at dawn" in str(out)


# --- pruning: the same answer as scoring every posting -------------------------------------------


def _random_corpus(app, rng, users: list[str], docs: int) -> list[str]:
    """Facts of Zipf-drawn words (repeats in a fact, some facts twice, so tf runs and score ties
    both occur), written by the store's own write path, with a share rewritten and deleted."""
    from app.store.memory import Content, Location

    vocabulary = [f"w{i}" for i in range(60)]
    weights = [1 / (rank + 1) for rank in range(len(vocabulary))]
    store = app.extensions["loom"].store(MemoryStore)
    org = org_of(app)
    texts: list[str] = []
    for _ in range(docs):
        if texts and rng.random() < 0.1:
            text_ = rng.choice(texts)
        else:
            text_ = " ".join(rng.choices(vocabulary, weights, k=rng.randint(1, 14)))
        texts.append(text_)
        where = Location(org, "support", rng.choice(users), "triage-bot", "-",
                         f"k{rng.randint(0, docs)}")
        if rng.random() < 0.05:
            store.delete(where, written_by="triage-bot")
        else:
            store.set(where, Content(value=text_, actor="triage-bot"), written_by="triage-bot")
    return vocabulary


def _bm25_reference(app, user_ids: list[str], terms: list[str], top: int) -> list:
    """The lexical leg's answer computed here from each row's stored ``term:tf`` list: BM25
    with Lucene's idf over every row of ``user_ids``, summed over the terms in their order,
    best first, ties by memory_id and then by the user's place in ``user_ids``."""
    import math

    from app.store.recall import K1, B, LexicalHit

    redis_ = app.extensions["loom"].redis
    org = org_of(app)
    rows = []
    for place, user_id in enumerate(user_ids):
        for mid, stored in redis_.hgetall(keys.recall_docs(org, "support", user_id)).items():
            pairs = {term: int(tf) for term, tf in (p.split(":") for p in stored.split())}
            rows.append((place, user_id, mid, pairs, sum(pairs.values())))
    if not rows:
        return []
    avgdl = sum(row[4] for row in rows) / len(rows)
    idfs = []
    for term in terms:
        df = sum(1 for row in rows if term in row[3])
        idfs.append(math.log(1 + (len(rows) - df + 0.5) / (df + 0.5)) if df else 0.0)
    scored = []
    for place, user_id, mid, pairs, length in rows:
        total, matched = None, []
        for term, idf in zip(terms, idfs, strict=True):
            if term in pairs:
                tf = pairs[term]
                s = idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / avgdl))
                total = s if total is None else total + s
                matched.append(term)
        if total is not None:
            scored.append((-total, mid, place, LexicalHit(user_id, mid, total, tuple(matched))))
    scored.sort(key=lambda entry: entry[:3])
    return [entry[3] for entry in scored[:top]]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pruned_search_answers_exactly_what_scoring_every_posting_does(app, seed):
    import random

    from app.store.recall import RecallStore

    rng = random.Random(seed)
    users = ["u-1", "u-2", "u-3"]
    vocabulary = _random_corpus(app, rng, users, 400)
    recall = app.extensions["loom"].store(RecallStore)
    org = org_of(app)
    compared = 0
    for _ in range(60):
        terms = list(dict.fromkeys(rng.choices(vocabulary, k=rng.randint(1, 4))))
        reach = rng.choice([users[:1], users])
        for top in (1, 3, 10, 40, 1000):
            pruned = recall.lexical(org, "support", reach, terms, top)
            exhaustive = recall.lexical(org, "support", reach, terms, top, exhaustive=True)
            assert pruned == exhaustive, (terms, reach, top)
            # And both are BM25 as computed from the stored rows, whichever way the script
            # read each user (whole, or by the threshold).
            assert pruned == _bm25_reference(app, reach, terms, top), (terms, reach, top)
            compared += bool(pruned)
    assert compared > 200


@pytest.mark.skipif(ON_CLUSTER, reason="the two-step way is the cluster's own there")
def test_one_call_summing_its_weights_answers_what_the_two_step_way_does(app):
    """On one server the script sums every user's figures into the idf weights itself; the
    cluster's way reads them first and passes the weights. Both score alike, bit for bit."""
    import random

    from app.store.recall import RecallStore

    rng = random.Random(5)
    users = ["u-1", "u-2", "u-3"]
    vocabulary = _random_corpus(app, rng, users, 300)
    services = app.extensions["loom"]
    one_call = services.store(RecallStore)
    two_step = RecallStore(services)
    two_step._clustered = True  # the cluster's path, run against this one server
    org = org_of(app)
    compared = 0
    for _ in range(40):
        terms = list(dict.fromkeys(rng.choices(vocabulary + ["absent"], k=rng.randint(1, 4))))
        reach = rng.choice([users[:1], users, users + ["nobody"]])
        for top in (1, 10, 1000):
            got = one_call.lexical(org, "support", reach, terms, top)
            assert got == two_step.lexical(org, "support", reach, terms, top), (terms, top)
            compared += bool(got)
    assert compared > 60
    assert one_call.lexical(org, "support", users, ["absent"], 10) == []
    assert one_call.lexical(org, "support", ["nobody"], ["w0"], 10) == []


@pytest.mark.skipif(ON_CLUSTER, reason="the cluster's per-user calls are made at once")
def test_a_begun_search_survives_a_flushed_script_and_an_abandoned_reply(app):
    """The one-server search is sent before it is read: a server that lost its scripts
    (NOSCRIPT after a restart) still answers, and a reply that is dropped unread goes with
    its connection, never to the next command that borrows it."""
    import random

    from app.store.recall import RecallStore

    rng = random.Random(9)
    users = ["u-1", "u-2"]
    vocabulary = _random_corpus(app, rng, users, 200)
    services = app.extensions["loom"]
    recall = services.store(RecallStore)
    org = org_of(app)
    terms = vocabulary[:3]
    expected = recall.lexical(org, "support", users, terms, 10)
    assert expected
    services.redis.script_flush()
    assert recall.lexical(org, "support", users, terms, 10) == expected
    for _ in range(5):
        recall.lexical_begun(org, "support", users, vocabulary[3:5], 10).abandon()
    for _ in range(10):
        assert services.redis.ping()
        assert recall.lexical(org, "support", users, terms, 10) == expected


def _back_to_layout_1(app, namespace: str, user_id: str) -> None:
    """Rewrite a user's postings as an install before the current layout left them."""
    redis = app.extensions["loom"].redis
    org = org_of(app)
    postings = keys.recall_postings(org, namespace, user_id)
    redis.delete(postings)
    for memory_id, stored in redis.hgetall(keys.recall_docs(org, namespace, user_id)).items():
        counts = decode(text(stored))
        size = sum(counts.values())
        redis.zadd(postings, {posting_v1(t, tf, size, text(memory_id)): 0
                              for t, tf in counts.items()})
    redis.hdel(keys.recall_stats(org, namespace, user_id), "layout")


def test_an_index_on_the_first_layout_answers_the_same_and_the_backfill_moves_it(client, app):
    for i in range(12):
        ok(client, "memory.set", key=f"walk{i}", value="harbour walk " * (i % 3 + 1) + f"n{i}")
    ok(client, "memory.set", key="other", value="harbour ferry", user_id="u-7")
    before = search(client, "harbour walk", read_scope="namespace")
    _back_to_layout_1(app, "support", "u-42")
    _back_to_layout_1(app, "support", "u-7")
    # Searched exhaustively until it is moved: the same hits, the same scores.
    assert search(client, "harbour walk", read_scope="namespace") == before
    # Writes on the old layout take out the old postings and write new ones beside them.
    ok(client, "memory.set", key="walk3", value="a quiet harbour")
    ok(client, "memory.delete", key="walk4")
    ok(client, "memory.set", key="walk99", value="walk walk walk")
    mixed = search(client, "harbour walk", read_scope="own_user", limit=50)
    assert "walk4" not in keys_of(mixed) and "walk99" in keys_of(mixed)
    result = app.test_cli_runner().invoke(args=["loom", "recall", "backfill"])
    assert result.exit_code == 0, result.output
    assert "lexical index: 2 users, 13 facts moved" in result.output
    assert "vectors: no embeddings endpoint" in result.output
    index_matches_rows(app, "support", "u-42")
    index_matches_rows(app, "support", "u-7")
    assert search(client, "harbour walk", read_scope="own_user", limit=50) == mixed
    # Run again, it finds nothing to move.
    again = app.test_cli_runner().invoke(args=["loom", "recall", "backfill"])
    assert "2 users, 0 facts moved" in again.output


def _works_of_calls(monkeypatch, stops: list[str] | None = None) -> list[int]:
    """The work each lexical script call reports (commands, postings, rows scored and kept by
    their weights), in the order the calls answer: recorded where the store merges each reply.
    ``stops`` gets where each call that hands on stopped: 'D' summing the figures, else 'A',
    'T' or 'H' (recall_search.lua stop_before)."""
    from app.store import recall as recall_module

    works: list[int] = []
    merge = recall_module._Top.merge

    def recorded(self, named, called, reply):
        works.append(int(reply[2]))
        going_on = [text(v) for v in reply[1]]
        if stops is not None and going_on:
            phase = going_on[1 + len(named)]
            stops.append(phase if phase == "D" else going_on[3 + len(named)])
        return merge(self, named, called, reply)

    monkeypatch.setattr(recall_module._Top, "merge", recorded)
    return works


@pytest.mark.parametrize("clustered", [False, True])
def test_a_search_past_its_budget_goes_on_in_calls_each_within_it(app, monkeypatch, clustered):
    """A lexical search whose work passes one call's budget stops at a point it can resume
    and goes on in further calls (each told the merged top's floor): every pruned call stays
    within the budget and one step past it, and the answer is, bit for bit, the one-call
    answer and BM25 computed from the rows, pruned or exhaustive, on one server's way or the
    cluster's."""
    import random

    from app.store.recall import RecallStore

    rng = random.Random(11)
    users = ["u-1", "u-2", "u-3", "u-4"]
    vocabulary = _random_corpus(app, rng, users, 500)
    services = app.extensions["loom"]
    org = org_of(app)
    whole = RecallStore(services)
    chunked = RecallStore(services)
    if clustered:
        whole._clustered = chunked._clustered = True
    budget = chunked.work_per_call = 40
    room = budget // 2
    most_tf = max(tf for user_id in users for stored in services.redis.hvals(
        keys.recall_docs(org, "support", user_id)) for tf in decode(text(stored)).values())
    most_rows = max(services.redis.hlen(keys.recall_docs(org, "support", user_id))
                    for user_id in users)
    carried_max = max(2 * budget, 1000)  # recall_search.lua CARRIED_MAX
    works = _works_of_calls(monkeypatch)
    split = compared = 0
    for _ in range(40):
        terms = list(dict.fromkeys(rng.choices(vocabulary, k=rng.randint(1, 6))))
        # One step past the budget: a user's whole read (its figures, its lists and the rows
        # kept), or the first posting of each of its runs, or one page of a run or of a scan
        # (a small hash answers HSCAN whole); and a resumed call's state read in and handed on.
        step = (3 * room + 4 * len(terms) + 8 + 3 * len(terms) * most_tf + 3 * most_rows
                + budget // 8 + carried_max // 4)
        for top in (1, 10, 40, 1000):
            for exhaustive in (False, True):
                works.clear()
                expected = whole.lexical(org, "support", users, terms, top,
                                         exhaustive=exhaustive)
                if not whole._clustered:  # on a cluster, a call a user's slot
                    assert len(works) == 1  # a budget no search here passes: one call
                works.clear()
                got = chunked.lexical(org, "support", users, terms, top, exhaustive=exhaustive)
                assert got == expected, (terms, top, exhaustive)
                # Scoring every posting reads a user's lists whole: the way of the test
                # comparisons and of an index on the first layout, never a step to bound.
                if not exhaustive:
                    assert all(work <= budget + step for work in works), (works, budget + step)
                split += len(works) > (1 if not clustered else len(users))
            assert got == _bm25_reference(app, users, terms, top), (terms, top)
            compared += bool(got)
    assert compared > 100
    # The small budget did split searches, many of them.
    assert split > 50


def _docs_hgets(app, run) -> list[str]:
    """Every HGET of a recall docs hash (a row scored from its stored terms) the server ran
    while ``run`` ran: MONITOR shows the commands a script runs."""
    redis_ = app.extensions["loom"].redis
    seen: list[str] = []

    def listen(monitor) -> None:
        for command in monitor.listen():
            line = command["command"]
            if line.startswith("ECHO") and "docs-hgets-done" in line:
                return
            if line.startswith("HGET ") and "recall-docs" in line:
                seen.append(line)

    with redis_.monitor() as monitor:
        listener = threading.Thread(target=listen, args=(monitor,))
        listener.start()
        run()
        redis_.echo("docs-hgets-done")
        listener.join(30)
    assert not listener.is_alive()
    return seen


@pytest.mark.skipif(ON_CLUSTER, reason="MONITOR reads one server")
def test_a_resumed_call_redoes_nothing_an_earlier_call_of_the_search_did(app, monkeypatch):
    """A long query (many common terms) over users too large for one call's step, at a small
    budget: its calls stop summing the figures, reading the threshold and scanning a user's
    rows, and the next call goes on from each. No row is scored twice across
    the calls (a row met again by another term's posting is known from the calls before), and
    the hits are, bit for bit, the one-call answer and BM25 from the rows."""
    import random

    from app.store.recall import RecallStore

    rng = random.Random(23)
    users = [f"u-{n}" for n in range(1, 7)]
    vocabulary = _random_corpus(app, rng, users, 1200)
    services = app.extensions["loom"]
    org = org_of(app)
    whole = RecallStore(services)
    whole.work_per_call = 10**9
    chunked = RecallStore(services)
    chunked.work_per_call = 60
    stops: list[str] = []
    works = _works_of_calls(monkeypatch, stops)
    for count in (3, 8, 14):
        terms = vocabulary[:count]
        for top in (1, 5, 40, 400):
            works.clear()
            expected = whole.lexical(org, "support", users, terms, top)
            assert len(works) == 1
            got: list = []

            def run(got: list = got, terms: list = terms, top: int = top) -> None:
                got.extend(chunked.lexical(org, "support", users, terms, top))

            scored = _docs_hgets(app, run)
            assert got == expected, (count, top)
            assert got == _bm25_reference(app, users, terms, top), (count, top)
            assert len(scored) == len(set(scored)), (count, top, Counter(scored).most_common(3))
    # Calls stopped summing the figures, reading the threshold and scanning, and were gone on
    # from.
    assert {"D", "T", "H"} <= set(stops), Counter(stops)
