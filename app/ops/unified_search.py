"""memory.unified_search, the MCP tool ``loom_search`` (seed 000, "Unified search"): the facts
memory.search finds, and a profile leg.

The facts are memory.search's own answer (``app.ops.recall.search_answer``): same ranking, same
read scope, same filters, same ``scratchpad``. Profile rows stay out of memory.search; here they
come apart, under ``profile``, when the question is about the user: it speaks of the user
(``I``, ``my``, ``you``, ``the user``, ``the customer`` ...) or names the call's user_id, or
the call says ``profile="always"``. The sections are those profile.render reads at the same
read scope (the user's, their session's and the namespace-level ones).

Sections are scored by meaning when they can be: with an embeddings endpoint configured, every
section in scope holding a current vector (the section-vector job keeps them,
app/store/profile_vectors.py) and the query embedded in the request (one embeddings call under
the budgets and in the ledger), a section's score is its cosine to the question and a section
below ``PROFILE_MIN_COSINE`` is left out. Otherwise (no endpoint, a vector not made yet, the
call refused by a budget or failed) the few sections are scored lexically, BM25 over their
label and text with the facts' tokenizer, and ``profile_leg`` says which scoring answered.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

from marshmallow import Schema, fields, validate

from app.model.budget import EmbeddingsOutOfBudget, embed_within_budget
from app.model.embeddings import QUERY, embedder_for
from app.model.errors import ModelCallFailed
from app.ops.memory import record_profile_read
from app.ops.profile import section_text, sections_in_scope
from app.ops.recall import (
    QUERY_VECTOR_MEMO,
    MemorySearchAnswer,
    MemorySearchArgs,
    search_answer,
    search_call_cost,
)
from app.registry import Call, op
from app.schemas.common import StrictInt
from app.store.memory import MemoryRow
from app.store.profile_vectors import ProfileVectorStore, cosine, fingerprint, unit
from app.store.recall import K1, B
from app.store.recall_terms import decode, query_terms, row_terms
from app.store.usage import UsageStore

log = logging.getLogger("loom.ops.unified_search")

PROFILE_LIMIT_MAX = 20
# Below this cosine a section is not about the question (unit vectors; unrelated text of the
# usual embedding models scores near 0.0-0.15).
PROFILE_MIN_COSINE = 0.2
PROFILE_MODES = ("auto", "always", "never")
# Words by which a question speaks of the person the agent serves (matched on whole words,
# casefolded): the first and second person, and the usual names for the user.
_ABOUT_USER = re.compile(
    r"\b(i|me|my|mine|myself|i'm|i've|i'd|you|your|yours|yourself|you're|user|user's|users|"
    r"customer|customer's|client|client's|profile|persona|preferences?|prefers?)\b")
_WHO = {"namespace": "support", "agent": "triage-bot", "user_id": "u-42"}


class UnifiedSearchArgs(MemorySearchArgs):
    profile = fields.String(
        load_default="auto", validate=validate.OneOf(PROFILE_MODES),
        metadata={"description": "auto (default): the profile leg runs when the question is "
                                 "about the user; always; never."})
    profile_limit = StrictInt(
        load_default=3, validate=validate.Range(min=1, max=PROFILE_LIMIT_MAX),
        metadata={"description": "How many profile sections at most (default 3, at most 20)."})


class ProfileHit(Schema):
    memory_id = fields.String()
    label = fields.String()
    value = fields.Raw(allow_none=True)
    score = fields.Float(metadata={"description": "Higher is better; compares within a call."})
    leg = fields.String(metadata={"description": "vector or lexical: how it was scored."})
    user_id = fields.String()
    agent = fields.String()
    session_id = fields.String()
    updated_at = fields.String()


class UnifiedSearchAnswer(MemorySearchAnswer):
    profile = fields.List(fields.Nested(ProfileHit), metadata={
        "description": "Profile sections about the question, best first (profile leg)."})
    profile_leg = fields.String(metadata={
        "description": "off (the question is not about the user), vector or lexical."})
    about_user = fields.Boolean(metadata={
        "description": "Whether the question reads as one about the user."})


def about_user(query: str, user_id: str) -> bool:
    """Whether a question speaks of the user (see the module)."""
    text = query.casefold()
    if user_id != "-" and user_id.casefold() in text:
        return True
    return _ABOUT_USER.search(text) is not None


def lexical_scores(query: str, sections: list[MemoryRow]) -> dict[str, float]:
    """BM25 of each section for the query, with idf over the sections scored (memory_id ->
    score; sections sharing no term are left out)."""
    terms = query_terms(query)
    counts = {row.memory_id: decode(row_terms(row.key, row.value)) for row in sections}
    if not terms or not counts:
        return {}
    docs = len(counts)
    average = sum(sum(c.values()) for c in counts.values()) / docs or 1.0
    scores: dict[str, float] = {}
    for term in dict.fromkeys(terms):
        df = sum(1 for c in counts.values() if term in c)
        if not df:
            continue
        idf = math.log(1 + (docs - df + 0.5) / (df + 0.5))
        for memory_id, c in counts.items():
            tf = c.get(term, 0)
            if tf:
                length = sum(c.values())
                scores[memory_id] = scores.get(memory_id, 0.0) + idf * tf * (K1 + 1) / (
                    tf + K1 * (1 - B + B * length / average))
    return scores


def vector_scores(call: Call, query: str, sections: list[MemoryRow]) -> dict[str, float] | None:
    """Each section's cosine to the query, or None when they cannot be scored by meaning
    here: no endpoint, calls off, a section without a current vector, or the query's
    embedding refused by a budget or failed."""
    svc = call.services
    settings = svc.settings
    identity = call.identity
    embedder = embedder_for(settings)
    if embedder is None:
        return None
    with embedder:
        if not svc.store(UsageStore).model_calls_enabled(identity.org):
            return None
        stored = svc.store(ProfileVectorStore).vectors(
            identity.org, identity.namespace, {row.user_id for row in sections})
        dimensions = settings.embed_dimensions or None
        by_section: dict[str, list[float]] = {}
        for row in sections:
            made_from, vector = stored.get(row.memory_id, ("", []))
            if made_from != fingerprint(embedder.made_by, dimensions, row.content_sha256):
                return None  # not refreshed yet: the lexical leg answers until it is
            by_section[row.memory_id] = vector
        shared = call.memo.get(QUERY_VECTOR_MEMO)
        if shared is not None and shared[0] == query:
            question = unit(shared[1])  # the fact leg embedded it already
        else:
            try:
                embedded = embed_within_budget(svc, identity.org, identity.namespace,
                                               embedder, [query], purpose=QUERY)
            except (EmbeddingsOutOfBudget, ModelCallFailed) as error:
                log.info("loom_search: the profile leg scores lexically: %s", error)
                return None
            question = unit(embedded.vectors[0])
    return {memory_id: cosine(question, vector) for memory_id, vector in by_section.items()}


def _profile_hit(row: MemoryRow, score: float, leg: str) -> dict[str, Any]:
    return {
        "memory_id": row.memory_id, "label": row.key, "value": section_text(row),
        "score": round(score, 6), "leg": leg, "user_id": row.user_id, "agent": row.agent,
        "session_id": row.session_id, "updated_at": row.as_answer()["updated_at"],
    }


def profile_leg(call: Call, read_scope: str, query: str, limit: int
                ) -> tuple[list[dict[str, Any]], str]:
    """The sections about the question, best first, and the scoring that ranked them."""
    sections = [row for row in sections_in_scope(call, read_scope, "namespace", None)
                if section_text(row)]
    if not sections:
        return [], "lexical"
    by_meaning = vector_scores(call, query, sections)
    if by_meaning is not None:
        leg = "vector"
        scores = {mid: s for mid, s in by_meaning.items() if s >= PROFILE_MIN_COSINE}
    else:
        leg = "lexical"
        scores = lexical_scores(query, sections)
    ranked = sorted((row for row in sections if row.memory_id in scores),
                    key=lambda row: (-scores[row.memory_id], row.key, row.memory_id))
    return [_profile_hit(row, scores[row.memory_id], leg) for row in ranked[:limit]], leg


@op("memory.unified_search", role="viewer", kind="read", tool="loom_search",
    cost=search_call_cost,
    args=UnifiedSearchArgs, answer=UnifiedSearchAnswer,
    example={**_WHO, "query": "what currency do I want my invoices in",
             "read_scope": "own_user"})
def memory_unified_search(call: Call) -> dict[str, Any]:
    """Find the facts that answer a question, and profile sections when it is about the user."""
    a = call.args
    answer = search_answer(call)
    mode = a["profile"]
    about = about_user(a["query"], call.identity.user_id)
    answer.update({"profile": [], "profile_leg": "off", "about_user": about})
    if mode == "always" or (mode == "auto" and about):
        found, leg = profile_leg(call, answer["read_scope"], a["query"], a["profile_limit"])
        answer.update({"profile": found, "profile_leg": leg})
        if found:
            record_profile_read(call, "memory.unified_search")
    return answer
