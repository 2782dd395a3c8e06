"""The protected-attribute detector behind ``LOOM_MEMORY_ATTRIBUTE_TAGGING``.

With the setting on, ``memory.set`` tags a row ``attribute:<name>`` for each protected
attribute its value mentions, and every profile fold (the structured profile and the
``consolidated_profile`` section) leaves a row with such a tag out. The attributes are the
special categories of GDPR Art. 9, one name each:

==========================  =================================================================
``health``                  diagnoses, conditions, treatment, medication, pregnancy, disability
``religion_or_belief``      religions, their places and practices, atheism
``ethnicity``               racial or ethnic origin
``political_opinion``       parties, voting, political leanings
``trade_union_membership``  union membership
``genetic_data``            DNA, genome and genetic tests, hereditary conditions
``biometric_data``          fingerprints, face, iris and voice prints used to identify someone
``sex_life``                sexual activity and relationships
``sexual_orientation``      gay, lesbian, bisexual, LGBTQ and the like
==========================  =================================================================

How it decides: a fixed list of English words and phrases per attribute, matched
case-insensitively on whole words and phrases (a match must not start or end inside a word, so
"tory" does not match "history"; "union" alone matches nothing, "joined the union" does). The
lists favour words that almost always mean the attribute and leave out the ambiguous ones
("race", "party", "black", "faith", "disabled" or "conservative" on their own, "Christian"
without "a" or "is" before it, since it is also a first name), so the detector misses some
mentions rather than tag ordinary facts; a caller that knows better adds the tag itself. Some
words still have an everyday sense ("church" in a street name, "fingerprint" of a browser): a
false match only keeps that row out of the profile folds. Other languages are not covered.

It is pure (no model, no I/O) and linear in the text, so it runs on the request path. A value
that is not text is searched through every string in it, dictionary keys included.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

TAG_PREFIX = "attribute:"

# Each entry is a regular-expression fragment; a space stands for any run of spaces or hyphens,
# so "trade union" also matches "trade-union" and "trade  union" (so never write " ?": spell
# the joined form out as its own alternative).
WORDS: dict[str, tuple[str, ...]] = {
    "health": (
        r"diagnosed with", r"(?:medical|my|his|her|their) diagnos(?:is|es)",
        r"diabet(?:es|ic)", r"cancer", r"tumou?rs?", r"chemo(?:therapy)?",
        r"radiotherapy", r"depress(?:ion|ed)", r"anxiety",
        r"panic attacks?", r"bipolar", r"schizophreni(?:a|c)", r"adhd", r"autis(?:m|tic)",
        r"ptsd", r"ocd", r"pregnan(?:t|cy)", r"miscarriage", r"hiv", r"medications?",
        r"prescri(?:bed|ption)", r"antidepressants?", r"insulin", r"therap(?:y|ist)",
        r"psychiatr(?:ist|ic|y)", r"mental health", r"mental illness", r"illness",
        r"disabilit(?:y|ies)", r"disabled (?:person|people|veteran|parking)",
        r"chronic (?:pain|illness|condition|fatigue|disease)", r"asthma(?:tic)?",
        r"epilep(?:sy|tic)", r"allerg(?:y|ies|ic)", r"surgery", r"hospitali[sz]ed",
        r"blood pressure", r"hypertension", r"heart (?:attack|disease|condition)",
        r"migraines?", r"dementia", r"alzheimer'?s?", r"parkinson'?s?", r"arthritis",
        r"multiple sclerosis", r"eating disorder", r"anorexi(?:a|c)", r"bulimi(?:a|c)",
        r"addiction", r"alcoholi(?:c|sm)", r"rehab", r"sick leave", r"wheelchair",
        r"medical condition", r"hearing aids?", r"sexually transmitted",
    ),
    "religion_or_belief": (
        r"religio(?:n|ns|us)", r"christians", r"christianity",
        r"(?:a|is|devout|practi[sc]ing) christian", r"catholic(?:s|ism)?",
        r"protestant(?:s|ism)?", r"muslims?", r"islam(?:ic)?", r"jew(?:s|ish)?",
        r"judaism", r"hindu(?:s|ism)?", r"buddhis(?:t|ts|m)", r"sikh(?:s|ism)?",
        r"atheis(?:t|ts|m)", r"agnostic", r"church(?:es)?", r"mosque", r"synagogue",
        r"bible", r"qur'?an", r"koran", r"torah", r"pray(?:s|ed|ing)?", r"prayers?",
        r"halal", r"kosher", r"ramadan", r"mormons?", r"evangelical", r"baptist",
        r"lutheran", r"methodist", r"jehovah'?s witness(?:es)?", r"scientolog(?:y|ist)",
        r"pagan", r"religious belief", r"philosophical belief",
    ),
    "ethnicity": (
        r"ethnic(?:ity|ities)?", r"racial(?:ly)?", r"mixed race", r"african american",
        r"asian american", r"native american", r"indigenous", r"aboriginal",
        r"first nations", r"caucasian", r"hispanic", r"latin[oax]", r"romani", r"inuit",
        r"arab", r"person of colou?r", r"people of colou?r",
    ),
    "political_opinion": (
        r"political(?:ly)?",
        r"vot(?:es|ed|ing) (?:for )?(?:labour|conservatives?|liberals?|greens?|tory|tories)",
        r"democrats?", r"republicans?", r"conservative party", r"labour party",
        r"liberal democrats?", r"green party", r"tor(?:y|ies)", r"socialis(?:t|ts|m)",
        r"communis(?:t|ts|m)", r"libertarian", r"marxis(?:t|ts|m)", r"fascis(?:t|ts|m)",
        r"nationalis(?:t|ts|m)", r"left wing(?:er)?", r"right wing(?:er)?", r"far left",
        r"far right", r"maga",
    ),
    "trade_union_membership": (
        r"trade unions?", r"labou?r unions?", r"unioni[sz]ed", r"union members?(?:hip)?",
        r"union dues", r"union rep(?:resentative)?", r"shop steward",
        r"(?:joined|joins|member of|belongs to|belong to|in) (?:the|a) union", r"teamsters",
    ),
    "genetic_data": (
        r"genetics?", r"genome", r"genomic", r"genotype", r"brca[12]?", r"23andme",
        r"dna (?:tests?|samples?|results?|profiles?|data|kits?)", r"hereditary",
        r"chromosom(?:e|es|al)",
    ),
    "biometric_data": (
        r"biometrics?", r"fingerprints?", r"facial recognition", r"face scans?",
        r"iris scans?", r"retina(?:l)? scans?", r"voice(?:prints?| prints?)",
        r"palm(?:prints?| prints?)",
    ),
    "sex_life": (
        r"sex life", r"sexually active", r"sexual (?:partners?|relationship|history|activity)",
        r"one night stand", r"celibate", r"fetish(?:es)?",
    ),
    "sexual_orientation": (
        r"gay", r"lesbians?", r"bisexual", r"homosexual", r"heterosexual", r"queer",
        r"pansexual", r"asexual", r"lgbt\w*\+?", r"sexual orientation",
        r"same sex (?:partners?|couples?|marriage)",
    ),
}

ATTRIBUTES: tuple[str, ...] = tuple(sorted(WORDS))


def _pattern(words: tuple[str, ...]) -> re.Pattern[str]:
    alternatives = "|".join(word.replace(" ", r"[\s\-]+") for word in words)
    # Lookarounds instead of \b: a word ending in "+" (LGBTQ+) still ends a match cleanly.
    return re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)", re.IGNORECASE)


_PATTERNS: dict[str, re.Pattern[str]] = {name: _pattern(WORDS[name]) for name in ATTRIBUTES}


def _texts(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _texts(key)
            yield from _texts(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _texts(item)


def detect(value: Any) -> list[str]:
    """The protected attributes ``value`` mentions, sorted by name (empty when none)."""
    texts = list(_texts(value))
    return [
        name for name in ATTRIBUTES
        if any(_PATTERNS[name].search(text) for text in texts)
    ]


def attribute_tags(value: Any) -> list[str]:
    """``attribute:<name>`` for each attribute ``detect`` finds."""
    return [TAG_PREFIX + name for name in detect(value)]


def with_attribute_tags(tags: list[str], value: Any) -> list[str]:
    """The caller's tags followed by the detected ones it lacks, in a stable order."""
    return list(dict.fromkeys([*tags, *attribute_tags(value)]))
