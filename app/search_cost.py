"""What a search costs against a token's request budget (LOOM_RATE_LIMIT), in requests.

A plain request costs one. A search's Redis work grows with its distinct terms (each one a
postings read for every user in scope) and with its read scope (a namespace search reads every
user's postings; own_user and own_session read one user's and the namespace's), so it costs
its terms times its scope's weight, ``TERMS_PER_REQUEST`` terms to a request, and never less
than one: a token spends its budget as fast with one long query as with the short ones that
hold the same words. Terms are counted as the recall index reads a query
(``app.store.recall_terms.query_terms``), so stop words and repeats cost nothing. The limits on
a query's size are another matter (the search ops' own bounds); this only prices what passes.
"""

from __future__ import annotations

from app.store.recall_terms import query_terms

# A namespace search reads the postings of every user in it; own_user and own_session read
# the caller's user and the namespace's rows (user '-').
SCOPE_WEIGHT = {"own_session": 1, "own_user": 1, "namespace": 4}
# Terms one request's worth of budget buys at weight 1: a short question costs what any
# other request does.
TERMS_PER_REQUEST = 4


def terms_cost(terms: int, read_scope: str) -> int:
    """The requests a search of ``terms`` distinct terms at ``read_scope`` costs."""
    weighted = terms * SCOPE_WEIGHT[read_scope]
    return max(1, -(-weighted // TERMS_PER_REQUEST))


def search_cost(query: str, read_scope: str) -> int:
    """The requests a search of ``query`` at ``read_scope`` costs."""
    return terms_cost(len(query_terms(query)), read_scope)
