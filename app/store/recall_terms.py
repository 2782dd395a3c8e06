"""The terms the lexical recall index holds for a fact, and the terms of a query.

One tokenizer serves both sides, so a query term meets the term a write indexed: Unicode word
runs, lower-cased (casefold), English stop words dropped, each word stemmed by the Snowball
English stemmer (PyStemmer). A row's terms are computed here when its content is written and
travel with the row as the ``recall_terms`` field (``term:tf`` pairs, space-separated), which
the write scripts index in the same script as the row (app/store/lua/memory_write.lua).
Nothing here speaks Redis.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import Stemmer

# Words too common to tell facts apart (the usual English list of IR systems).
STOP_WORDS = frozenset("""
a about above after again against all am an and any are aren't as at be because been before
being below between both but by can can't cannot could couldn't did didn't do does doesn't
doing don't down during each few for from further had hadn't has hasn't have haven't having he
he'd he'll he's her here here's hers herself him himself his how how's i i'd i'll i'm i've if
in into is isn't it it's its itself let's me more most mustn't my myself no nor not of off on
once only or other ought our ours ourselves out over own same shan't she she'd she'll she's
should shouldn't so some such than that that's the their theirs them themselves then there
there's these they they'd they'll they're they've this those through to too under until up
very was wasn't we we'd we'll we're we've were weren't what what's when when's where where's
which while who who's whom why why's with won't would wouldn't you you'd you'll you're you've
your yours yourself yourselves s t d ll m re ve
""".split())

# A term never holds a space or a colon: the stored form splits on both.
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?", re.UNICODE)
# A term longer than this is cut: a base64 blob is not a word anyone searches for.
TERM_MAX = 64
# The most distinct terms one row indexes; a longer text keeps its most frequent ones.
TERMS_PER_ROW_MAX = 512

_stemmer = Stemmer.Stemmer("english")


def _kept_word(word: str) -> str:
    # "user's" and "users" meet: the possessive goes before stemming, then the apostrophe.
    if "'" in word:
        word = (word[:-2] if word.endswith("'s") else word).replace("'", "")
        if word in STOP_WORDS:
            return ""
    return word


def words(text: str) -> list[str]:
    """The terms of ``text`` in order, repeats kept."""
    found = [w for w in map(_kept_word, _WORD.findall(text.casefold()))
             if w and w not in STOP_WORDS]
    return [stem[:TERM_MAX] for stem in _stemmer.stemWords(found)]


def query_terms(text: str) -> list[str]:
    """A query's distinct terms, in the order they first appear."""
    return list(dict.fromkeys(words(text)))


def _texts(value: Any) -> Iterator[str]:
    """The text a JSON value carries: its strings, numbers and object keys."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int | float):
        yield str(value)
    elif isinstance(value, dict):
        for name, item in value.items():
            yield str(name)
            yield from _texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)


def _key_text(key: str) -> str:
    # "invoice_currency" reads as two words.
    return re.sub(r"[_\-.]+", " ", key)


def row_terms(key: str, value: Any) -> str:
    """The stored ``recall_terms`` of a fact: ``term:tf`` pairs over its key and value."""
    counts: dict[str, int] = {}
    text = value if isinstance(value, str) else " ".join(_texts(value))
    for term in words(_key_text(key) + " " + text):
        counts[term] = counts.get(term, 0) + 1
    return encode(counts)


def encode(counts: dict[str, int]) -> str:
    kept = (sorted(counts.items()) if len(counts) <= TERMS_PER_ROW_MAX
            else sorted(Counter(counts).most_common(TERMS_PER_ROW_MAX)))
    return " ".join(f"{term}:{count}" for term, count in kept)


def decode(stored: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for pair in stored.split():
        term, _, count = pair.rpartition(":")
        found[term] = int(count)
    return found


def indexable(memory_type: str, tags: Iterable[str]) -> bool:
    """Whether a row's content is indexed at all: never a profile section (those stay out of
    memory.search) and never a stored request to forget."""
    return memory_type != "profile" and "forget" not in tags


def row_text(key: str, value: Any) -> str:
    """A fact as one line of text for its embedding: the key read as words, then the value's
    text (its strings, numbers and object keys), so ``invoice_currency`` = "EUR" embeds as
    "invoice currency: EUR"."""
    text = value if isinstance(value, str) else " ".join(_texts(value))
    return f"{_key_text(key)}: {text}"
