"""memory.search (seed 000, "Unified search"): the facts that answer a question, best first.

Facts are found by two legs: the lexical leg (BM25 over the index the memory write scripts keep
in the user's slot, app/store/recall.py) and, when an embeddings endpoint is configured
(``LOOM_EMBED_*``), the vector leg (exact cosine between the query's embedding and the vectors
the embeddings job stored, app/store/recall_vectors.py). The two rankings are fused: each leg's
scores are normalised over its own candidates (best 1, worst 0) and a fact's score is their
mean, and each hit's ``legs`` names the legs that found it. The query is embedded in the
request, as one model call under the budgets and in the ledger; with no endpoint, no vector
stored in scope, calls off for the org, the budget spent or the call failed, the search ranks
by the lexical leg alone and a hit's score is its BM25 score. A hit is a live fact inside the
read scope: never a profile row, an expired row (past its ``valid_to``), a stored request to
forget (tag ``forget``) or a redacted row, none of which the index holds or the filter lets
through. Working memory is not recall: a call naming a run or session gets those blocks under
``scratchpad``, never ranked.

Read scope is ``profile.render``'s: ``own_user`` reads the user's facts and the namespace-level
ones (user ``-``), ``own_session`` those of the user's session and the namespace-level ones,
``namespace`` every user's; the token's claim is the ceiling.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from marshmallow import Schema, ValidationError, fields, validate

from app.auth import row_visible
from app.model.budget import EmbeddingsOutOfBudget, embed_within_budget
from app.model.embeddings import QUERY, embedder_for
from app.model.errors import ModelCallFailed
from app.ops.memory import (
    TAG_MAX,
    memory_type_field,
    read_scope_field,
    read_scope_for,
    to_ns,
)
from app.registry import Call, op
from app.schemas.common import Answer, IdentityArgs, Moment, StrictInt, no_control_characters
from app.schemas.rules import terms_within
from app.search_cost import search_cost
from app.store.memory import PROFILE_TYPE, MemoryRow, MemoryStore
from app.store.recall import LexicalHit, PendingLexical, RecallStore
from app.store.recall_terms import query_terms
from app.store.recall_vectors import RecallVectorStore, VectorHit, VectorsSeen
from app.store.usage import UsageStore
from app.store.working_memory import WorkingMemoryStore

QUERY_MAX = 4096
SEARCH_LIMIT_MAX = 100
FILTER_TAGS_MAX = 16
# The most distinct terms (after stop words and stemming) a query may hold: each is read from
# every user in scope, so they bound what one search costs the store. A LoCoMo question holds
# at most 14 (docs/decisions.md).
QUERY_TERMS_MAX = 32
# Candidates read per hit asked for: filters and the read scope drop some; a round that comes
# short reads further, up to this many candidates in all.
OVERFETCH = 3
CANDIDATES_MAX = 4000
# The vector leg's share of a fused score, the lexical leg's the rest: the mean of the legs'
# normalised scores (a convex combination, as Bruch, Gai and Ingber 2023 compare with
# reciprocal rank fusion; on LoCoMo it beats RRF at k = 60, which ranks below BM25 alone).
VECTOR_WEIGHT = 0.5
LEXICAL = "lexical"
VECTOR = "vector"
log = logging.getLogger("loom.ops.recall")
_WHO = {"namespace": "support", "agent": "triage-bot", "user_id": "u-42"}


def within_query_terms(query: str) -> None:
    """A query's distinct terms (the ones a search reads) are at most QUERY_TERMS_MAX."""
    held = len(query_terms(query))
    if held > QUERY_TERMS_MAX:
        raise ValidationError(
            f"holds {held} distinct terms (after stop words and stemming); at most "
            f"{QUERY_TERMS_MAX} are searched")


QUERY_DESCRIPTION = (f"at most {QUERY_MAX} characters and {QUERY_TERMS_MAX} distinct terms "
                     "once lower-cased, stop words dropped and stemmed (x-loom-rules)")


class MemorySearchArgs(IdentityArgs):
    # The query's distinct terms, as the OpenAPI document states them (app.schemas.rules).
    OPENAPI_RULES: ClassVar[dict[str, Any]] = {"x-loom-rules": [
        terms_within("query", QUERY_TERMS_MAX)]}

    query = fields.String(
        required=True,
        validate=[validate.Length(min=1, max=QUERY_MAX), no_control_characters,
                  within_query_terms],
        metadata={"description": f"The question, in words: {QUERY_DESCRIPTION}."},
    )
    read_scope = read_scope_field()
    memory_type = memory_type_field(
        load_default=None,
        metadata={"description": "Only facts of this type (profile rows stay out of search)."},
    )
    tags = fields.List(
        fields.String(validate=[validate.Length(min=1, max=TAG_MAX), no_control_characters]),
        load_default=list,
        validate=validate.Length(max=FILTER_TAGS_MAX),
        metadata={"description": f"Only facts holding every one of these tags (at most "
                                 f"{FILTER_TAGS_MAX}, each at most {TAG_MAX} characters)."},
    )
    valid_at = Moment(
        load_default=None,
        metadata={"description": "Only facts true at this moment (valid_at <= it < valid_to)."},
    )
    limit = StrictInt(
        load_default=10,
        validate=validate.Range(min=1, max=SEARCH_LIMIT_MAX),
        metadata={"description": "How many hits at most (default 10, at most 100)."},
    )


class SearchHit(Schema):
    memory_id = fields.String()
    key = fields.String()
    value = fields.Raw(allow_none=True)
    memory_type = fields.String()
    score = fields.Float(metadata={"description": "Higher is better; compares within a call."})
    legs = fields.List(fields.String(), metadata={
        "description": "The legs that found it: lexical (its words), vector (its meaning)."})
    matched_terms = fields.List(
        fields.String(), metadata={"description": "The query's terms (stemmed) it holds."}
    )
    user_id = fields.String()
    agent = fields.String()
    session_id = fields.String()
    tags = fields.List(fields.String())
    confidence = fields.Float()
    valid_at = fields.String(allow_none=True)
    valid_to = fields.String(allow_none=True)
    updated_at = fields.String()


class ScratchpadBlock(Schema):
    layer = fields.String(metadata={"description": "run or session."})
    block_key = fields.String()
    content = fields.String()
    updated_at = fields.String()


class MemorySearchAnswer(Answer):
    hits = fields.List(fields.Nested(SearchHit))
    count = fields.Integer()
    read_scope = fields.String(metadata={"description": "The scope the search read at."})
    scratchpad = fields.List(
        fields.Nested(ScratchpadBlock),
        metadata={"description": "The named run's and session's working-memory blocks."},
    )
    vectors_pending = fields.Integer(
        allow_none=True,
        metadata={"description": "Facts in the search's scope written or changed since their "
                                 "last embedding: the vector leg cannot find them by meaning "
                                 "yet (the lexical leg finds their words). 0 with no embeddings "
                                 "endpoint; null under own_session, whose reach a count of the "
                                 "user's other sessions would pass."},
    )


def _users(call: Call, read_scope: str) -> list[str]:
    """The users a read at ``read_scope`` reaches; read once per call (a search and its
    ``vectors_pending`` count share it)."""
    memo_key = f"{SCOPE_USERS_MEMO}:{read_scope}"
    if memo_key in call.memo:
        return list(call.memo[memo_key])
    identity = call.identity
    users = ["-", identity.user_id]
    if read_scope == "namespace":
        users += call.services.store(RecallStore).namespace_users(
            identity.org, identity.namespace
        )
    found = list(dict.fromkeys(users))
    call.memo[memo_key] = tuple(found)
    return found


def vectors_pending(call: Call, read_scope: str) -> int | None:
    """memory.search's ``vectors_pending``: the facts in scope still waiting for a vector."""
    if read_scope == "own_session":
        return None
    identity = call.identity
    return call.services.store(RecallVectorStore).pending_in(
        identity.org, identity.namespace, _users(call, read_scope))


@dataclass(frozen=True, slots=True)
class Filters:
    """What a hit must be besides a live fact in scope: a type, every tag, true at a time."""

    memory_type: str | None = None
    tags: tuple[str, ...] = ()
    valid_at_ns: int | None = None


def _kept(call: Call, row: MemoryRow, read_scope: str, now: int, filters: Filters) -> bool:
    identity = call.identity
    if not row.live or row.redacted or row.memory_type == PROFILE_TYPE or row.expired(now):
        return False
    if "forget" in row.tags:
        return False
    fixed_agent = call.principal.agent
    if fixed_agent is not None and row.agent not in (fixed_agent, "-"):
        return False
    if not row_visible(read_scope, identity, row.user_id, row.session_id):
        return False
    if filters.memory_type is not None and row.memory_type != filters.memory_type:
        return False
    if any(tag not in row.tags for tag in filters.tags):
        return False
    at = filters.valid_at_ns
    if at is not None:
        if row.valid_at is not None and row.valid_at > at:
            return False
        if row.valid_to is not None and row.valid_to <= at:
            return False
    return True


@dataclass(frozen=True, slots=True)
class Hit:
    """One fact the search found: where, its score, the legs that found it, and the query's
    terms it holds (empty when only the vector leg found it)."""

    user_id: str
    memory_id: str
    score: float
    legs: tuple[str, ...]
    matched_terms: tuple[str, ...] = ()


def _normalised(scores: Sequence[float]) -> list[float]:
    """Scores mapped onto [0, 1] by the list's own best and worst (all 1 when they are equal)."""
    if not scores:
        return []
    best, worst = max(scores), min(scores)
    if best <= worst:
        return [1.0] * len(scores)
    return [(score - worst) / (best - worst) for score in scores]


def fuse(lexical: Sequence[LexicalHit], vector: Sequence[VectorHit] | None) -> list[Hit]:
    """The legs' rankings as one, best first. Without a vector leg (None) the lexical ranking
    stands with its BM25 scores; with one, each leg's scores are normalised over its own
    candidates (best 1, worst 0) and a fact's fused score is their mean (a leg that did not
    find it adds 0)."""
    if vector is None:
        return [Hit(h.user_id, h.memory_id, h.score, (LEXICAL,), h.matched_terms)
                for h in lexical]
    scores: dict[tuple[str, str], float] = {}
    legs: dict[tuple[str, str], list[str]] = {}
    terms: dict[tuple[str, str], tuple[str, ...]] = {}
    for lexical_hit, share in zip(lexical, _normalised([h.score for h in lexical]),
                                  strict=True):
        where = (lexical_hit.user_id, lexical_hit.memory_id)
        scores[where] = scores.get(where, 0.0) + (1 - VECTOR_WEIGHT) * share
        legs.setdefault(where, []).append(LEXICAL)
        terms[where] = lexical_hit.matched_terms
    for vector_hit, share in zip(vector, _normalised([h.score for h in vector]), strict=True):
        where = (vector_hit.user_id, vector_hit.memory_id)
        scores[where] = scores.get(where, 0.0) + VECTOR_WEIGHT * share
        legs.setdefault(where, []).append(VECTOR)
    fused = [Hit(user_id, memory_id, score, tuple(legs[(user_id, memory_id)]),
                 terms.get((user_id, memory_id), ()))
             for (user_id, memory_id), score in scores.items()]
    fused.sort(key=lambda hit: (-hit.score, hit.memory_id))
    return fused


QUERY_VECTOR_MEMO = "query_vector"
# call.memo: the users a read scope reaches (``_users``), read once per call.
SCOPE_USERS_MEMO = "scope_users"


def query_vector(call: Call, query: str, users: Sequence[str],
                 whole_namespace: bool = False) -> tuple[list[float] | None, VectorsSeen | None]:
    """The query's embedding, or None when the vector leg sits this search out: no endpoint,
    no vector stored for anyone in scope (no call is made for nothing to match), model calls
    off for the org, the budget spent, or the call failed; and what was read of the users'
    vectors on the way, for ``nearest``. ``whole_namespace``: ``users`` are every user of the
    namespace."""
    services = call.services
    settings = services.settings
    identity = call.identity
    embedder = embedder_for(settings)
    if embedder is None:
        return None, None
    with embedder:
        seen = services.store(RecallVectorStore).has_vectors(
            identity.org, identity.namespace, users, whole_namespace=whole_namespace)
        if not seen:
            return None, None
        if not services.store(UsageStore).model_calls_enabled(identity.org):
            return None, None
        try:
            answer = embed_within_budget(services, identity.org, identity.namespace, embedder,
                                         [query], purpose=QUERY)
        except EmbeddingsOutOfBudget as out:
            log.info("memory.search: the %s budget is spent; the lexical leg answers alone",
                     out.scope)
            return None, None
        except ModelCallFailed as error:
            log.warning("memory.search: the query's embedding failed; the lexical leg answers "
                        "alone: %s", error)
            return None, None
    # loom_search's profile leg embeds the same question: one call serves both legs.
    call.memo[QUERY_VECTOR_MEMO] = (query, answer.vectors[0])
    return answer.vectors[0], seen


def search_rows(call: Call, query: str, limit: int, read_scope: str,
                filters: Filters = Filters()) -> list[tuple[MemoryRow, Hit]]:
    """The best ``limit`` facts for ``query`` inside ``read_scope``, each with its hit."""
    identity = call.identity
    terms = query_terms(query)
    recall = call.services.store(RecallStore)
    memory = call.services.store(MemoryStore)
    users = _users(call, read_scope)
    whole_namespace = read_scope == "namespace"
    wanted, vectors_seen = query_vector(call, query, users, whole_namespace)
    if not terms and wanted is None:
        return []
    vectors = call.services.store(RecallVectorStore)
    now = call.services.clock.now_ns()
    top = limit * OVERFETCH + 10
    # Each round asks the vector leg as deep as it reads: a deeper one is rare (filters that
    # drop most hits), while hits asked for beyond it would cost objects and a sort on every
    # search (exact cosine's product over the scope is the same either way).
    depth = top
    # The first round's lexical script runs in Redis while this process ranks the vectors:
    # it is sent once the vector leg has read what it needs.
    first: PendingLexical | None = None

    def begin_lexical() -> None:
        nonlocal first
        first = recall.lexical_begun(identity.org, identity.namespace, users, terms, top)

    try:
        vector_hits = None if wanted is None else vectors.nearest(
            identity.org, identity.namespace, users, wanted, depth,
            whole_namespace=whole_namespace, meanwhile=begin_lexical,
            seen=vectors_seen)
    except BaseException:
        if first is not None:
            first.abandon()
        raise
    if first is None:
        begin_lexical()
    kept: list[tuple[MemoryRow, Hit]] = []
    seen: set[tuple[str, str]] = set()
    while True:
        if first is not None:
            lexical, first = first.answer(), None
        else:
            lexical = recall.lexical(identity.org, identity.namespace, users, terms, top)
        if wanted is not None and top > depth:
            depth = top
            vector_hits = vectors.nearest(identity.org, identity.namespace, users, wanted, depth,
                                          whole_namespace=whole_namespace, seen=vectors_seen)
        vector = None if vector_hits is None else vector_hits[:top]
        hits = [hit for hit in fuse(lexical, vector) if (hit.user_id, hit.memory_id) not in seen]
        examined = 0
        # Rows are read a few past what is still missing, so an unfiltered search reads
        # about ``limit`` rows, and a selective filter reads on down the ranking.
        while examined < len(hits) and len(kept) < limit:
            chunk = hits[examined:examined + (limit - len(kept)) + 5]
            examined += len(chunk)
            seen.update((hit.user_id, hit.memory_id) for hit in chunk)
            found = _rows_of(recall, memory, identity.org, identity.namespace, chunk)
            kept += [(row, hit) for row, hit in found if _kept(call, row, read_scope, now, filters)]
        exhausted = len(lexical) < top and (
            vector_hits is None or (len(vector_hits) <= top and len(vector_hits) < depth))
        if len(kept) >= limit or exhausted or top >= CANDIDATES_MAX:
            kept.sort(key=lambda pair: (-pair[1].score, pair[1].memory_id))
            return kept[:limit]
        top = min(top * 4, CANDIDATES_MAX)


def _rows_of(recall: RecallStore, memory: MemoryStore, org: str, namespace: str,
             hits: Sequence[Hit]) -> list[tuple[MemoryRow, Hit]]:
    by_user: dict[str, list[Hit]] = {}
    for hit in hits:
        by_user.setdefault(hit.user_id, []).append(hit)
    row_key_of: dict[str, str] = {}
    ids_by_user = {user_id: [hit.memory_id for hit in user_hits]
                   for user_id, user_hits in by_user.items()}
    found = recall.row_keys_by_user(org, namespace, ids_by_user)
    for user_id, ids in ids_by_user.items():
        for memory_id, row_key in zip(ids, found[user_id], strict=True):
            if row_key is not None:
                row_key_of[memory_id] = row_key
    wanted = [hit for hit in hits if hit.memory_id in row_key_of]
    rows = memory.read_row_keys([row_key_of[hit.memory_id] for hit in wanted])
    by_id = {row.memory_id: row for row in rows}
    return [(by_id[hit.memory_id], hit) for hit in wanted if hit.memory_id in by_id]


def hit_answer(row: MemoryRow, hit: Hit) -> dict[str, Any]:
    answer = row.as_answer()
    return {
        "memory_id": row.memory_id,
        "key": row.key,
        "value": row.value,
        "memory_type": row.memory_type,
        "score": round(hit.score, 6),
        "legs": list(hit.legs),
        "matched_terms": list(hit.matched_terms),
        "user_id": row.user_id,
        "agent": row.agent,
        "session_id": row.session_id,
        "tags": list(row.tags),
        "confidence": row.confidence,
        "valid_at": answer["valid_at"],
        "valid_to": answer["valid_to"],
        "updated_at": answer["updated_at"],
    }


def scratchpad(call: Call, read_scope: str) -> list[dict[str, Any]]:
    """The named run's blocks, then the named session's: never ranked, inside the scope."""
    identity = call.identity
    layers = []
    if identity.run_id != "-":
        layers.append(("run", identity))
    if identity.session_id != "-":
        layers.append(("session", identity.with_(run_id="-")))
    store = call.services.store(WorkingMemoryStore)
    found: list[dict[str, Any]] = []
    for name, scope in layers:
        if not row_visible(read_scope, identity, scope.user_id, scope.session_id):
            continue
        for block in store.blocks(scope):
            shown = block.as_answer()
            found.append({"layer": name, "block_key": block.block_key,
                          "content": block.content, "updated_at": shown["updated_at"]})
    return found


def search_call_cost(call: Call) -> int:
    """A call's cost against the request budget when it searches (``app.search_cost``): its
    query's terms at the read scope it runs at. No query searches nothing: one request."""
    query = call.args.get("query")
    if not query:
        return 1
    return search_cost(query, read_scope_for(call, call.args.get("read_scope")))


@op("memory.search", role="viewer", kind="read", cost=search_call_cost,
    args=MemorySearchArgs, answer=MemorySearchAnswer,
    example={**_WHO, "query": "which currency for invoices", "read_scope": "own_user"})
def memory_search(call: Call) -> dict[str, Any]:
    """Find the facts that answer a question, best first (profile rows stay out)."""
    return search_answer(call)


def search_answer(call: Call, count_pending: bool = True) -> dict[str, Any]:
    """memory.search's answer for a call whose args hold its fields: the one retrieval that
    memory.ask and memory.unified_search (the MCP tool loom_search) make too. ``count_pending``
    False leaves ``vectors_pending`` out (memory.ask, whose answer has no such field)."""
    a = call.args
    read_scope = read_scope_for(call, a["read_scope"])
    filters = Filters(
        memory_type=a["memory_type"],
        tags=tuple(a["tags"]),
        valid_at_ns=None if a["valid_at"] is None else to_ns(a["valid_at"]),
    )
    found = search_rows(call, a["query"], a["limit"], read_scope, filters)
    hits = [hit_answer(row, hit) for row, hit in found]
    return {
        "hits": hits,
        "count": len(hits),
        "read_scope": read_scope,
        "scratchpad": scratchpad(call, read_scope),
        **({"vectors_pending": vectors_pending(call, read_scope)} if count_pending else {}),
    }
