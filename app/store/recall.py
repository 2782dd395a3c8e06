"""The lexical recall index: BM25 over the facts of one or more users.

The index is written by the memory write scripts themselves (``index_recall`` in
app/store/lua/memory_write.lua), in the same script as the row, so a fact is findable exactly
when its row is live, unredacted and not a profile section; a lock or pin leaves it as it is,
a delete, a redact or a profile type takes it out. Per user (the user's slot):
``keys.recall_docs`` (memory_id -> its ``term:tf`` pairs), ``keys.recall_postings`` (one lex
range of postings per term, best first: app/store/lua/recall_posting.lua) and
``keys.recall_stats`` (documents, summed length, posting layout). Per namespace:
``keys.recall_users``, the users a namespace search fans out over.

A search reaches one or more users' slots, and scores them all with one set of idf weights
and one average length, summed over every slot it reaches, so the scores of several users'
facts compare. On one server that is one ``recall_search.lua`` call over every user in scope:
the script sums the document counts, lengths and each query term's document frequency itself,
then keeps one top. On a cluster, where users live in different slots, a first pipeline reads
those figures per slot, and one call a user with the summed weights follows, merged by a sort.
This is exact BM25 over the reached rows; no approximate index is involved. The script reads
each term's postings best first and stops as soon as no unread posting can change the top
(``pruned``); its answer is the one scoring every posting gives (``exhaustive``, kept for the
test that compares them and for an index still on the first posting layout).

No call of a search holds the server long, whatever the query: the script stops once its work
(commands run, postings read, rows scored and kept, each by its measured cost) passes
``work_per_call`` and answers its hits so far with where to go on; the next call goes on from
there, told the score the merged top's worst holds (the floor), below which no row can enter,
and what the calls before it learnt (the summed figures, each run's place, a user's scan cursor,
the rows the threshold already scored), so it redoes none of it. A search within the budget is
one call, answered as before; a longer one is several calls of a few milliseconds each, with
the same hits (docs/decisions.md).

``relayout`` moves an install's indexes written before that layout onto it
(``flask loom recall backfill``), a bounded step at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
from redis.commands.core import Script

from app.store import keys
from app.store.lua import script
from app.store.replies import optional_texts, text_set
from app.store.script_interfaces import RECALL_RELAYOUT, RECALL_SEARCH, RECALL_USER_INDEX_KEYS

if TYPE_CHECKING:
    from app.store.services import StoreServices

NUL = "\x00"
SOH = "\x01"
# BM25's usual constants (Robertson and Zaragoza); bm25s uses the same.
K1 = 1.5
B = 0.75
# The work one lexical script call does before it stops and hands on, in units of one command
# the script runs, each step weighed by its measured cost (recall_search.lua). Measured by the
# server's CPU a call (bench/recall.py, the longest accepted search; 11,000 facts over 12 users
# on a 2-core machine at load 7): 2,500 runs calls of p50 7 ms, at most 23 ms, and the search's
# calls sum to 1.3 times the CPU of one unbounded call (815 against 611 to 636 ms for its three
# rounds).
WORK_PER_CALL = 2500


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
        self._relayout = script(self.redis, "recall_relayout")
        self._clustered = isinstance(self.redis, redis.RedisCluster)
        self.work_per_call = WORK_PER_CALL

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

    def row_keys_by_user(self, org: str, namespace: str,
                         ids_by_user: Mapping[str, Sequence[str]]) -> dict[str, list[str | None]]:
        """``row_keys`` for several users in one pipeline (one round trip on one server; each
        user's HMGET in its own slot on Redis Cluster): a namespace search's hits span many."""
        users = [user_id for user_id, ids in ids_by_user.items() if ids]
        if not users:
            return {user_id: [] for user_id in ids_by_user}
        pipe = self.redis.pipeline(transaction=False)
        for user_id in users:
            pipe.hmget(keys.memory_ids(org, namespace, user_id), list(ids_by_user[user_id]))
        found = {user_id: optional_texts(reply)
                 for user_id, reply in zip(users, pipe.execute(), strict=True)}
        return {user_id: found.get(user_id, []) for user_id in ids_by_user}

    def lexical(
        self, org: str, namespace: str, user_ids: Sequence[str], terms: Sequence[str], top: int,
        *, exhaustive: bool = False,
    ) -> list[LexicalHit]:
        """The ``top`` best facts of these users for the query ``terms``, best first (the same
        answer either way; ``exhaustive`` scores every posting instead of pruning)."""
        return self.lexical_begun(org, namespace, user_ids, terms, top,
                                  exhaustive=exhaustive).answer()

    def lexical_begun(
        self, org: str, namespace: str, user_ids: Sequence[str], terms: Sequence[str], top: int,
        *, exhaustive: bool = False,
    ) -> PendingLexical:
        """``lexical``, begun: on one server the script's call is sent now and its reply read
        by ``answer``, so the caller's other work (the vector leg's product) runs while Redis
        scores; on a cluster it is done before this returns."""
        if not terms or not user_ids:
            return PendingLexical(lambda: [])
        users = list(dict.fromkeys(user_ids))
        mode = "exhaustive" if exhaustive else "pruned"
        if self._clustered:
            named, weights, reached = self._weights(org, namespace, users, terms)
            # Users live in different slots: the calls of one user, then the next's, each
            # told the floor of the top merged so far.
            top_so_far = _Top(top, users)
            for user_id in reached:
                user_keys = _index_keys(org, namespace, user_id)
                state: _Continuation | None = _Continuation(weights, [])
                while state is not None:
                    reply = self._search(*self._call(user_keys, 1, top, mode, top_so_far.floor(),
                                                     named, state))
                    state = top_so_far.merge(named, [user_id], reply)
            hits = top_so_far.hits()
            return PendingLexical(lambda: hits)
        # One server: one call over every user, which sums the idf weights itself (no round
        # trip reads them first) and keeps one top, so a user whose best rows cannot reach it
        # reads no further than that; a search past the call's budget goes on in more calls.
        named = list(terms)
        every_key = [k for user_id in users for k in _index_keys(org, namespace, user_id)]
        sent = _SentScript(self.redis, self._search,
                           *self._call(every_key, len(users), top, mode, None, named, None))

        def answer() -> list[LexicalHit]:
            top_so_far = _Top(top, users)
            state = top_so_far.merge(named, users, sent.reply())
            while state is not None:
                reply = self._search(*self._call(every_key, len(users), top, mode,
                                                 top_so_far.floor(), named, state))
                state = top_so_far.merge(named, users, reply)
            return top_so_far.hits()

        return PendingLexical(answer, sent.abandon)

    def _call(self, user_keys: list[str], users: int, top: int, mode: str, floor: float | None,
              terms: Sequence[str], state: _Continuation | None) -> tuple[list[str], list[Any]]:
        """recall_search.lua's KEYS and ARGV over ``users`` users' index keys: a first call's
        (the script sums the weights), or one going on from ``state`` (with the weights, once
        they are summed)."""
        weights = [] if state is None else state.weights
        if weights:
            body: list[str | float | int] = [v for pair in zip(terms, weights[1:], strict=True)
                                             for v in pair]
        else:
            body = list(terms)
        return RECALL_SEARCH.ordered(
            {}, {"top": top, "k1": K1, "b": B, "avgdl": weights[0] if weights else "",
                 "mode": mode, "budget": self.work_per_call,
                 "floor": "" if floor is None else repr(floor), "users": users,
                 "term_count": len(terms)},
            more_keys=user_keys, more_args=body + ([] if state is None else state.rest))

    def _weights(
        self, org: str, namespace: str, users: Sequence[str], terms: Sequence[str],
    ) -> tuple[list[str], list[str], list[str]]:
        """Redis Cluster's first step: each slot's document count, summed length and each
        term's document frequency (one pipeline), summed into one set of idf weights and one
        average length so the per-slot calls score alike. Answers the terms held, the
        weights (the average length, then each held term's idf) and the users holding any."""
        pipe = self.redis.pipeline(transaction=False)
        for user_id in users:
            pipe.hmget(keys.recall_stats(org, namespace, user_id), ["docs", "length"])
            postings = keys.recall_postings(org, namespace, user_id)
            for term in terms:
                # Both posting layouts: term NUL ... (1) and term SOH ... (2).
                pipe.zlexcount(postings, "[" + term + NUL, "[" + term + SOH + "\xff")
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
            return [], [], []
        named: list[str] = []
        weights = [repr(length / docs)]
        for term, df in zip(terms, frequency, strict=True):
            if df:
                # BM25's idf as Lucene and bm25s take it: never negative (recall_search.lua
                # computes the same on one server).
                named.append(term)
                weights.append(repr(math.log(1 + (docs - df + 0.5) / (df + 0.5))))
        return named, weights, reached

    def indexed_users(self) -> Iterator[tuple[str, str, str]]:
        """(org, namespace, user_id) of every user with a lexical index, on every node."""
        for key in self.redis.scan_iter(match=keys.recall_stats_pattern(), count=1000):
            yield keys.recall_stats_parts(key.decode() if isinstance(key, bytes) else key)

    def relayout(self, org: str, namespace: str, user_id: str, step: int = 500) -> int:
        """Move a user's index onto the current posting layout; the docs moved (0 when it was
        on it). Each step is one script of at most ``step`` docs, so no step holds the server
        long, and a write between steps is already on the new layout."""
        user_keys = _index_keys(org, namespace, user_id)
        cursor, moved = "0", 0
        while True:
            answer = self._relayout(*RECALL_RELAYOUT.ordered(
                dict(zip(RECALL_USER_INDEX_KEYS, user_keys, strict=True)),
                {"cursor": cursor, "step": step}))
            cursor = answer[0].decode() if isinstance(answer[0], bytes) else str(answer[0])
            moved += int(answer[1])
            if cursor == "0":
                return moved


class PendingLexical:
    """A lexical search begun: ``answer`` reads its hits; ``abandon`` drops a reply the caller
    will not read (its other work failed), so no connection goes back to the pool with it."""

    __slots__ = ("_read", "abandon")

    def __init__(self, read: Callable[[], list[LexicalHit]],
                 abandon: Callable[[], None] = lambda: None) -> None:
        self._read = read
        self.abandon = abandon

    def answer(self) -> list[LexicalHit]:
        return self._read()


class _SentScript:
    """One script call sent on a pooled connection now and its reply read later: what
    redis-py's client does in one step (``Connection.send_command``, then ``read_response``),
    split so that the server runs the script while this process works. Where the send or the
    read fails on the connection, or the server has not loaded the script (NOSCRIPT after a
    restart), ``reply`` makes the ordinary call, with the client's own retry and script load:
    the scripts sent this way only read."""

    def __init__(self, client: redis.Redis, search: Script, script_keys: list[str],
                 args: list[str | float | int]) -> None:
        self._client, self._search, self._keys, self._args = client, search, script_keys, args
        # redis-py's Connection methods carry no annotations.
        connection: Any = client.connection_pool.get_connection()
        self._connection = connection
        try:
            connection.send_command("EVALSHA", search.sha, len(script_keys), *script_keys, *args)
        except BaseException as error:
            self.abandon()
            if not isinstance(error, redis.ConnectionError):
                raise

    def reply(self) -> Any:
        connection = self._connection
        if connection is not None:
            try:
                answer = connection.read_response()
            except redis.exceptions.NoScriptError:
                self._release()  # the error reply was read whole
            except BaseException as error:
                self.abandon()
                if not isinstance(error, redis.ConnectionError):
                    raise
            else:
                self._release()
                return answer
        return self._search(keys=self._keys, args=self._args)

    def abandon(self) -> None:
        """Drop the connection with whatever it still has to read: its socket goes with it."""
        if self._connection is not None:
            self._connection.disconnect()
            self._release()

    def _release(self) -> None:
        connection, self._connection = self._connection, None
        self._client.connection_pool.release(connection)


@dataclass(frozen=True, slots=True)
class _Continuation:
    """Where recall_search.lua stopped: the weights it scores with (the average length, then
    each term's idf; empty while not summed yet) and the rest of its state, passed back."""

    weights: list[str]
    rest: list[str]


class _Top:
    """The best ``top`` hits over a search's calls: each call's hits merged in, a row met by
    two calls kept once, best first, ties by memory_id and then by the user's place in scope
    (the script's own order)."""

    def __init__(self, top: int, users: Sequence[str]) -> None:
        self._top = top
        self._place = {user_id: place for place, user_id in enumerate(users)}
        self._hits: dict[tuple[str, str], LexicalHit] = {}
        self._ranked: list[LexicalHit] = []

    def merge(self, named: Sequence[str], called: Sequence[str],
              reply: Any) -> _Continuation | None:
        """One call's reply (its hits numbering the users of ``called``) merged in; where the
        search goes on from, or None once it is done."""
        found, going_on, _work = reply
        flat = [_text(v) for v in found]
        for k in range(0, len(flat), 4):
            hit = LexicalHit(called[int(flat[k]) - 1], flat[k + 1], float(flat[k + 2]),
                             tuple(named[int(n) - 1] for n in flat[k + 3].split(",")))
            self._hits.setdefault((hit.user_id, hit.memory_id), hit)
        self._ranked = sorted(self._hits.values(), key=lambda hit: (
            -hit.score, hit.memory_id, self._place[hit.user_id]))[:self._top]
        self._hits = {(hit.user_id, hit.memory_id): hit for hit in self._ranked}
        if not going_on:
            return None
        state = [_text(v) for v in going_on]
        weights, rest = state[:1 + len(named)], state[1 + len(named):]
        return _Continuation([] if weights[0] == "" else weights, rest)

    def floor(self) -> float | None:
        """The score of the worst hit of a full top: no row below it can enter."""
        return self._ranked[-1].score if len(self._ranked) >= self._top else None

    def hits(self) -> list[LexicalHit]:
        return list(self._ranked)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _index_keys(org: str, namespace: str, user_id: str) -> list[str]:
    """A user's lexical index as recall_search.lua and recall_relayout.lua take it
    (RECALL_USER_INDEX_KEYS): postings, docs, stats."""
    return [keys.recall_postings(org, namespace, user_id),
            keys.recall_docs(org, namespace, user_id),
            keys.recall_stats(org, namespace, user_id)]
