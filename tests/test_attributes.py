"""The protected-attribute detector: what it tags, what it leaves alone, and how it matches."""

from __future__ import annotations

import pytest

from app.attributes import ATTRIBUTES, attribute_tags, detect, with_attribute_tags


@pytest.mark.parametrize(
    ("text", "attribute"),
    [
        ("I was diagnosed with diabetes", "health"),
        ("Takes medication for depression", "health"),
        ("She is pregnant with her second child", "health"),
        ("HIV positive since 2015", "health"),
        ("Recovering from cancer surgery", "health"),
        ("Has Alzheimer's in the family", "health"),
        ("Is a devout Catholic", "religion_or_belief"),
        ("Only eats halal food", "religion_or_belief"),
        ("Goes to the mosque on Fridays", "religion_or_belief"),
        ("Is an atheist", "religion_or_belief"),
        ("Identifies as Hispanic", "ethnicity"),
        ("Her ethnic origin is Kurdish", "ethnicity"),
        ("Member of the Green Party", "political_opinion"),
        ("Always votes for Labour", "political_opinion"),
        ("Strong political views on taxes", "political_opinion"),
        ("Joined the union last year", "trade_union_membership"),
        ("Pays trade-union dues", "trade_union_membership"),
        ("Shop steward at the plant", "trade_union_membership"),
        ("Took a DNA test from 23andMe", "genetic_data"),
        ("Carries the BRCA1 gene variant", "genetic_data"),
        ("Enrolled her fingerprints at the office", "biometric_data"),
        ("Opted out of facial recognition", "biometric_data"),
        ("Is not sexually active", "sex_life"),
        ("Is gay and married to Tom", "sexual_orientation"),
        ("Volunteers for LGBTQ+ youth", "sexual_orientation"),
        ("Lives with her same-sex partner", "sexual_orientation"),
    ],
)
def test_positives(text, attribute):
    assert attribute in detect(text)


@pytest.mark.parametrize(
    "text",
    [
        "Prefers EUR invoices",
        "Lives in Berlin and speaks German",
        "Decided to renew the annual plan",
        "Disabled the feature flag on Monday",  # "disabled" alone is not a disability
        "The product came out in May",
        "History of the account is in the CRM",  # "tory" inside "history"
        "Banks with a credit union",  # a credit union is not a trade union
        "Member of the European Union's trade desk",
        "Speaks Arabic and French",  # a language, not an ethnicity
        "Christian from sales prefers tea",  # a first name
        "Diagnoses outages from the logs",  # diagnosing a bug is not a diagnosis
        "Part of the company's DNA is speed",
        "Prefers window seats; raids the snack bar",
        "",
    ],
)
def test_negatives(text):
    assert detect(text) == []


def test_matching_is_case_insensitive_and_on_whole_words():
    assert detect("DIABETES") == ["health"] == detect("Diabetes.") == detect("(diabetic)")
    assert detect("prediabetesx") == []
    assert detect("genetically-speaking geneticsx") == []


def test_values_that_are_not_text_are_searched_through():
    assert detect({"condition": "asthma", "notes": ["prays daily"]}) == [
        "health", "religion_or_belief"]
    assert detect({"diabetes": True}) == ["health"]  # keys are text too
    assert detect(42) == [] and detect(None) == [] and detect([1.5, False]) == []


def test_every_attribute_has_a_name_and_several_found_at_once_come_sorted():
    assert ATTRIBUTES == tuple(sorted(ATTRIBUTES))
    assert {"health", "religion_or_belief", "ethnicity", "sexual_orientation",
            "political_opinion", "trade_union_membership", "genetic_data", "biometric_data",
            "sex_life"} == set(ATTRIBUTES)
    found = detect("A Muslim trade union member with asthma")
    assert found == ["health", "religion_or_belief", "trade_union_membership"]
    assert attribute_tags("Has asthma") == ["attribute:health"]


def test_tags_keep_the_callers_and_add_each_attribute_once():
    assert with_attribute_tags(["vip", "attribute:health"], "asthma and insulin") == [
        "vip", "attribute:health"]
    assert with_attribute_tags(["vip"], "Votes for the Tories") == [
        "vip", "attribute:political_opinion"]
    assert with_attribute_tags([], "Prefers tea") == []


def test_long_text_is_read_without_a_runaway_pattern():
    """A 64 KiB value (the longest a write takes) is scanned to the end. Speed is bench's to
    measure; what this guards against is a pattern that backtracks without end, which no
    loaded machine excuses: the scan must finish at all, in a thread given a minute."""
    import threading

    text = ("Prefers short answers and EUR invoices. " * 1600)[:65536]
    found: list[object] = []
    scan = threading.Thread(target=lambda: found.append(detect(text)), daemon=True)
    scan.start()
    scan.join(timeout=60)
    assert found == [[]]
