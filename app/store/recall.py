"""The lexical recall index: BM25 over the facts of one or more users.

The index is written by the memory write scripts themselves (``index_recall`` in
app/store/lua/memory_write.lua), in the same script as the row, so a fact is findable exactly
when its row is live, unredacted and not a profile section; a lock or pin leaves it as it is,
a delete, a redact or a profile type takes it out. Per user (the user's slot):
``keys.recall_docs`` (memory_id -> its ``term:tf`` pairs), ``keys.recall_postings`` (one lex
range of postings per term) and ``keys.recall_stats`` (documents and summed length). Per
namespace: ``keys.recall_users``, the users a namespace search fans out over.

A search reaches one or more users' slots. It first reads, for each slot, the document count,
the summed length and each query term's document frequency (one pipeline), sums them into one
set of idf weights and one average length, then scores every slot with those same weights in
``recall_search.lua``, so the scores of several users' facts compare and the merge is a sort.
This is exact BM25 over the reached rows; no approximate index is involved.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis

from app.store import keys
from app.store.lua import script
from app.store.replies import optional_texts, text_set

if TYPE_CHECKING:
    from app.store.services import StoreServices

NUL = "\x00"
# BM25's usual constants (Robertson and Zaragoza); bm25s uses the same.
K1 = 1.5
B = 0.75


@dataclass(frozen=True, slots=True)
class LexicalHit:
    """One fact the lexical leg found: where, how well, and which query terms it holds."""

    user_id: str
    memory_id: str
    score: float
    matched_terms: tuple[str, ...]


class RecallStore:
    def __init__(self, services: StoreServices) -> None:
        self.redis = services.redis
        self._search = script(self.redis, "recall_search")
        self._clustered = isinstance(self.redis, redis.RedisCluster)

    def namespace_users(self, org: str, namespace: str) -> list[str]:
        """The namespace's users that have (or had) indexed facts, in a stable order."""
        return sorted(text_set(self.redis.smembers(keys.recall_users(org, namespace))))

    def row_keys(self, org: str, namespace: str, user_id: str,
                 memory_ids: Sequence[str]) -> list[str | None]:
        """The row key behind each memory_id of a user (None where it is gone)."""
        if not memory_ids:
            return []
        return optional_texts(self.redis.hmget(keys.memory_ids(org, namespace, user_id),
                                               list(memory_ids)))

    def lexical(
        self, org: str, namespace: str, user_ids: Sequence[str], terms: Sequence[str], top: int
    ) -> list[LexicalHit]:
        """The ``top`` best facts of these users for the query ``terms``, best first."""
        if not terms or not user_ids:
            return []
        users = list(dict.fromkeys(user_ids))
        pipe = self.redis.pipeline(transaction=False)
        for user_id in users:
            pipe.hmget(keys.recall_stats(org, namespace, user_id), ["docs", "length"])
            postings = keys.recall_postings(org, namespace, user_id)
            for term in terms:
                pipe.zlexcount(postings, "[" + term + NUL, "[" + term + NUL + "\xff")
        replies = pipe.execute()
        docs = length = 0
        frequency = [0] * len(terms)
        reached: list[str] = []
        step = 1 + len(terms)
        for i, user_id in enumerate(users):
            stats, *counts = replies[i * step:(i + 1) * step]
            docs += int(stats[0] or 0)
            length += int(stats[1] or 0)
            if any(counts):
                reached.append(user_id)
            for j, count in enumerate(counts):
                frequency[j] += int(count)
        if not reached or docs <= 0:
            return []
        weights: list[str | float] = []
        for term, df in zip(terms, frequency, strict=True):
            if df:
                # BM25's idf as Lucene and bm25s take it: never negative.
                weights += [term, math.log(1 + (docs - df + 0.5) / (df + 0.5))]
        args: list[str | float | int] = [top, K1, B, length / docs, *weights]
        calls = [([keys.recall_postings(org, namespace, user_id)], args) for user_id in reached]
        if self._clustered:
            # Users live in different slots: one script call per user.
            answers = [self._search(keys=k, args=a) for k, a in calls]
        else:
            pipe = self.redis.pipeline(transaction=False)
            for script_keys, script_args in calls:
                self._search(keys=script_keys, args=script_args, client=pipe)
            answers = pipe.execute()
        named = [str(w) for w in weights[0::2]]
        hits: list[LexicalHit] = []
        for user_id, answer in zip(reached, answers, strict=True):
            flat = [v.decode() if isinstance(v, bytes) else str(v) for v in answer]
            for k in range(0, len(flat), 3):
                matched = tuple(named[int(n) - 1] for n in flat[k + 2].split(","))
                hits.append(LexicalHit(user_id, flat[k], float(flat[k + 1]), matched))
        hits.sort(key=lambda hit: (-hit.score, hit.memory_id))
        return hits[:top]
