"""PII masking at write: built-in detectors (positive and negative), custom rules, walking."""

from __future__ import annotations

import time

import pytest

from app.errors import SchemaRuleViolation
from app.pii import (
    MAX_PATTERN_LENGTH,
    MAX_RULES,
    SCAN_LIMIT,
    CompiledRule,
    mask_text,
    mask_value,
    validate_pii_rules,
)

# --- emails ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("write to John.Doe@Example.COM today", "write to [email] today"),
        ("a+tag@mail.example.co.uk.", "[email]."),
        ("<x_y%z@sub-domain.example.org>", "<[email]>"),
        ("two: a@b.io, c@d.io", "two: [email], [email]"),
    ],
)
def test_email_masked(text: str, expected: str) -> None:
    assert mask_text(text) == expected


@pytest.mark.parametrize(
    "text",
    ["no at sign here", "user@localhost", "@handle on social", "a@b", "trailing@ dot.com"],
)
def test_email_lookalikes_untouched(text: str) -> None:
    assert mask_text(text) == text


# --- payment cards -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("card 4111111111111111 ok", "card [card] ok"),
        ("card 4111 1111 1111 1111 ok", "card [card] ok"),
        ("card 4111-1111-1111-1111", "card [card]"),
        ("amex 3782 822463 10005", "amex [card]"),
        ("13 digits 4222222222222", "13 digits [card]"),
        ("19 digits 6304000000000000000", "19 digits [card]"),
        ("with its code 4111 1111 1111 1111 123", "with its code [card] 123"),
        ("two 4111111111111111 5555555555554444", "two [card] [card]"),
        ("(4111111111111111)", "([card])"),
    ],
)
def test_luhn_valid_card_masked(text: str, expected: str) -> None:
    assert mask_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "4111111111111112",  # Luhn fails
        "card 4111 1111 1111 1112 ok",  # Luhn fails, card grouping
        "4111-1111-1111-1112",
        "4111 0111 1111 1112",  # a failing card is never read as a phone either
        "order 123456789012",  # 12 digits: too short for a card
        "41111111111111111111",  # 20 digits: too long
        "x4111111111111111",  # glued to a word
        "4111111111111111abc",
    ],
)
def test_non_card_untouched(text: str) -> None:
    assert mask_text(text) == text


# --- IBANs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("iban GB82 WEST 1234 5698 7654 32 thanks", "iban [iban] thanks"),
        ("GB82WEST12345698765432", "[iban]"),
        ("DE89 3704 0044 0532 0130 00", "[iban]"),
        ("de89370400440532013000", "[iban]"),  # written in lower case
        ("FR14 2004 1010 0505 0001 3M02 606", "[iban]"),
        ("NO93 8601 1117 947", "[iban]"),  # shortest registered length, 15
        # A following word in capitals is not swallowed into the IBAN.
        ("GB82 WEST 1234 5698 7654 32 AND MORE", "[iban] AND MORE"),
    ],
)
def test_valid_iban_masked(text: str, expected: str) -> None:
    assert mask_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "GB82 WEST 1234 5698 7654 33",  # mod-97 fails
        "GB83WEST12345698765432",  # check digits wrong
        "DE89 3704 0044 0532 0130 0",  # one character short for DE
        "XYZ89370400440532013000",  # three letters: not a country code
        "zz68539007547034",  # unknown country written in lower case
    ],
)
def test_invalid_iban_untouched(text: str) -> None:
    assert mask_text(text) == text


def test_unknown_country_iban_masked_only_in_upper_case() -> None:
    # "ZZ" is not registered; the mod-97 check still passes for this string.
    body = "ZZ80539007547034"
    assert mask_text(body) == "[iban]"
    assert mask_text(body.lower()) == body.lower()


# --- phone numbers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("call +33 6 12 34 56 78 now", "call [phone] now"),
        ("+14155552671", "[phone]"),
        ("call +1 (415) 555-2671.", "call [phone]."),
        ("+44 (0)20 7946 0958", "[phone]"),
        ("0033 6 12 34 56 78", "[phone]"),
        ("0033612345678", "[phone]"),
        ("(415) 555-2671", "[phone]"),
        ("415-555-2671", "[phone]"),
        ("415.555.2671", "[phone]"),
        ("1 415 555 2671", "[phone]"),
        ("06 12 34 56 78", "[phone]"),
        ("06.12.34.56.78", "[phone]"),
        ("020 7946 0958", "[phone]"),
        ("(030) 1234567", "[phone]"),
        ("07700 900123", "[phone]"),
        ("415-555-2671 415.555.0100", "[phone] [phone]"),
        ("room 12 415-555-2671", "room 12 [phone]"),
        ("on 2024-01-15 call 06 12 34 56 78", "on 2024-01-15 call [phone]"),
        ("2024-01-15 06 12 34 56 78", "2024-01-15 [phone]"),
        ("(call 415-555-2671)", "(call [phone])"),
        ("(+33 6 12 34 56 78)", "([phone])"),
    ],
)
def test_phone_masked(text: str, expected: str) -> None:
    assert mask_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "on 2024-01-15 we met",  # ISO date
        "2024-01-15T10:30:00Z",
        "due 15/01/2024 or 01-02-2024",
        "01-02-2024 10 people",
        "2024.01.15",
        "order 12345",  # plain short number
        "0612345678",  # a bare digit run has no phone shape
        "555-1234",  # a 7-digit local number
        "total 100 200 300",
        "ip 192.168.1.1",
        "version 10.0.19041",
        "+1 5",  # too few digits after +
        "+0 612 345 678",  # country codes never start with 0
        "price 1.299.000",
        "1 2 3 4 5 6 7 8 9 0 1 2 3",
    ],
)
def test_phone_lookalikes_untouched(text: str) -> None:
    assert mask_text(text) == text


# --- order of detectors, empties, long input ---------------------------------------------------


def test_email_digits_are_not_read_as_a_phone() -> None:
    assert mask_text("4155552671@sms.example.com") == "[email]"


def test_mixed_text_masks_every_kind() -> None:
    text = "Ana <ana@x.io>, +33 6 12 34 56 78, card 4111 1111 1111 1111, DE89370400440532013000"
    assert mask_text(text) == "Ana <[email]>, [phone], card [card], [iban]"


def test_masks_are_stable() -> None:
    text = "ana@x.io 4111111111111111"
    assert mask_text(text) == mask_text(text) == mask_text(mask_text(text))


def test_empty_and_clean_text() -> None:
    assert mask_text("") == ""
    assert mask_text("nothing to see") == "nothing to see"


@pytest.mark.parametrize(
    "text",
    ["1 " * 40_000, "0 " * 40_000, "00 " * 30_000, "+1 " * 30_000, "4111 " * 20_000, "a@" * 50_000],
)
def test_adversarial_number_runs_stay_fast(text: str) -> None:
    # CPU time of this process, not wall time: a backtracking engine takes minutes here, and
    # other processes on a busy machine must not count against the linear one.
    start = time.process_time()
    mask_text(text)
    assert time.process_time() - start < 3.0


# --- custom rules: validation ------------------------------------------------------------------


def test_validate_rules_compiles_and_defaults_mask() -> None:
    rules = validate_pii_rules(
        [
            {"name": "order_id", "pattern": r"ORD-\d{6}"},
            {"name": "token", "pattern": r"tk_[a-z]+", "mask": "<token>"},
        ]
    )
    assert [r.name for r in rules] == ["order_id", "token"]
    assert rules[0].mask == "[order_id]"
    assert rules[1].mask == "<token>"
    assert isinstance(rules[0], CompiledRule)
    assert rules[0].to_dict() == {"name": "order_id", "pattern": r"ORD-\d{6}", "mask": "[order_id]"}


def test_validate_none_and_empty() -> None:
    assert validate_pii_rules(None) == []
    assert validate_pii_rules([]) == []


def _violation(rules: object) -> SchemaRuleViolation:
    with pytest.raises(SchemaRuleViolation) as info:
        validate_pii_rules(rules)
    assert info.value.status == 422
    return info.value


@pytest.mark.parametrize(
    "rules, rule, field",
    [
        ({"name": "x"}, "pii_rules_not_list", "pii_rules"),
        ([{"name": f"r{i}", "pattern": "x"} for i in range(MAX_RULES + 1)],
         "pii_rules_too_many", "pii_rules"),
        (["x"], "pii_rule_not_object", "pii_rules[0]"),
        ([{"name": "a", "pattern": "x", "patern": "y"}], "pii_rule_unknown_key",
         "pii_rules[0].patern"),
        ([{"name": "Bad", "pattern": "x"}], "pii_rule_name_invalid", "pii_rules[0].name"),
        ([{"name": "1a", "pattern": "x"}], "pii_rule_name_invalid", "pii_rules[0].name"),
        ([{"name": "a" * 33, "pattern": "x"}], "pii_rule_name_invalid", "pii_rules[0].name"),
        ([{"pattern": "x"}], "pii_rule_name_invalid", "pii_rules[0].name"),
        ([{"name": "email", "pattern": "x"}], "pii_rule_name_reserved", "pii_rules[0].name"),
        ([{"name": "a", "pattern": "x"}, {"name": "a", "pattern": "y"}],
         "pii_rule_name_duplicate", "pii_rules[1].name"),
        ([{"name": "a"}], "pii_rule_pattern_invalid", "pii_rules[0].pattern"),
        ([{"name": "a", "pattern": ""}], "pii_rule_pattern_invalid", "pii_rules[0].pattern"),
        ([{"name": "a", "pattern": 5}], "pii_rule_pattern_invalid", "pii_rules[0].pattern"),
        ([{"name": "a", "pattern": "(unclosed"}], "pii_rule_pattern_invalid",
         "pii_rules[0].pattern"),
        ([{"name": "a", "pattern": "x" * (MAX_PATTERN_LENGTH + 1)}], "pii_rule_pattern_too_long",
         "pii_rules[0].pattern"),
        ([{"name": "a", "pattern": "x*"}], "pii_rule_pattern_matches_empty",
         "pii_rules[0].pattern"),
        ([{"name": "a", "pattern": r"(a)\1"}], "pii_rule_pattern_unsafe", "pii_rules[0].pattern"),
        ([{"name": "a", "pattern": r"a(?=b)"}], "pii_rule_pattern_unsafe",
         "pii_rules[0].pattern"),
        ([{"name": "a", "pattern": r"(?>[A-Z]+-)+\d"}], "pii_rule_pattern_unsafe",
         "pii_rules[0].pattern"),
        ([{"name": "a", "pattern": r"(?:[A-Z]++-)+\d"}], "pii_rule_pattern_unsafe",
         "pii_rules[0].pattern"),
        ([{"name": "a", "pattern": "x", "mask": ""}], "pii_rule_mask_invalid",
         "pii_rules[0].mask"),
        ([{"name": "a", "pattern": "x", "mask": 3}], "pii_rule_mask_invalid",
         "pii_rules[0].mask"),
        ([{"name": "a", "pattern": "x", "mask": "m" * 65}], "pii_rule_mask_invalid",
         "pii_rules[0].mask"),
    ],
)  # fmt: skip
def test_rule_violations(rules: object, rule: str, field: str) -> None:
    err = _violation(rules)
    assert err.rule == rule
    assert list(err.details["fields"]) == [field]


def test_limits_are_inclusive() -> None:
    rules = [{"name": f"r{i}", "pattern": "x" * MAX_PATTERN_LENGTH} for i in range(MAX_RULES)]
    assert len(validate_pii_rules(rules)) == MAX_RULES
    assert validate_pii_rules([{"name": "a" * 32, "pattern": "x"}])[0].name == "a" * 32


@pytest.mark.parametrize(
    "pattern",
    # Nested and overlapping quantifiers are fine: RE2 runs every pattern in linear time.
    [r"(a+)+$", r"(\w*,)*x", r"(?:[A-Z]+-){1,500}\d", r"(\d{3}-)+\d", r"ORD-\d+",
     r"(?:ab|cd)+", r"(a|aa)+b"],
)
def test_safe_nested_shapes_accepted(pattern: str) -> None:
    assert validate_pii_rules([{"name": "a", "pattern": pattern}])[0].pattern == pattern


def test_custom_path_prefix() -> None:
    with pytest.raises(SchemaRuleViolation) as info:
        validate_pii_rules([{"name": "a", "pattern": "("}], path="features.pii_rules")
    assert list(info.value.details["fields"]) == ["features.pii_rules[0].pattern"]


# --- custom rules: masking ---------------------------------------------------------------------


def test_custom_rules_mask_with_default_and_own_mask() -> None:
    rules = validate_pii_rules(
        [
            {"name": "order_id", "pattern": r"ORD-\d{6}"},
            {"name": "token", "pattern": r"tk_[a-z]+", "mask": "<token>"},
        ]
    )
    assert mask_text("ORD-123456 and tk_abc", rules) == "[order_id] and <token>"


def test_custom_rules_run_before_builtins() -> None:
    # Without the rule, the digits would read as a phone number; the namespace's rule wins.
    rules = validate_pii_rules([{"name": "ticket", "pattern": r"TCK-\d{3}-\d{3}-\d{4}"}])
    assert mask_text("TCK-415-555-2671", rules) == "[ticket]"
    assert mask_text("TCK-415-555-2671") == "TCK-[phone]"


def test_mask_text_accepts_raw_rules_and_validates_them() -> None:
    assert mask_text("id X-9", [{"name": "xid", "pattern": r"X-\d"}]) == "id [xid]"
    with pytest.raises(SchemaRuleViolation):
        mask_text("id X-9", [{"name": "Bad", "pattern": r"X-\d"}])


def test_mask_is_literal_not_a_replacement_template() -> None:
    rules = validate_pii_rules([{"name": "a", "pattern": r"(sec)ret", "mask": r"\1 \g<0>"}])
    assert mask_text("a secret", rules) == r"a \1 \g<0>"


def test_empty_matches_never_splice_masks() -> None:
    rules = validate_pii_rules([{"name": "edge", "pattern": r"\b"}])
    assert mask_text("two words", rules) == "two words"


def test_custom_rules_scan_only_the_first_scan_limit_chars() -> None:
    rules = validate_pii_rules([{"name": "secret", "pattern": "SECRET"}])
    text = "SECRET" + "." * (SCAN_LIMIT - 6) + "SECRET"
    masked = mask_text(text, rules)
    assert masked.startswith("[secret]")
    assert masked.endswith("SECRET")  # past the cap: a state this long is over the cap anyway


def test_builtins_scan_past_the_limit() -> None:
    text = "." * SCAN_LIMIT + " ana@x.io"
    assert mask_text(text).endswith(" [email]")


# --- mask_value --------------------------------------------------------------------------------


def test_mask_value_walks_lists_and_dicts() -> None:
    rules = validate_pii_rules([{"name": "order_id", "pattern": r"ORD-\d{6}"}])
    value = {
        "note": "mail ana@x.io",
        "items": ["ORD-123456", {"phone": "+33 6 12 34 56 78", "qty": 2, "ok": True}],
        "ana@x.io": None,
        "price": 12.5,
    }
    masked = mask_value(value, rules)
    assert masked == {
        "note": "mail [email]",
        "items": ["[order_id]", {"phone": "[phone]", "qty": 2, "ok": True}],
        "[email]": None,  # a key can carry an address as well as a value
        "price": 12.5,
    }
    assert value["note"] == "mail ana@x.io"  # the input is not changed in place


@pytest.mark.parametrize("value", [None, 3, 2.5, True, [], {}])
def test_mask_value_passes_scalars_and_empties(value: object) -> None:
    assert mask_value(value) == value


def test_mask_value_on_a_string() -> None:
    assert mask_value("ana@x.io") == "[email]"


def test_mask_value_keeps_list_order() -> None:
    assert mask_value(["a", "ana@x.io", ["b", "c@d.io"], "z"]) == [
        "a",
        "[email]",
        ["b", "[email]"],
        "z",
    ]


def test_mask_value_survives_deep_nesting() -> None:
    value: object = "ana@x.io"
    for _ in range(5000):
        value = [value]
    masked = mask_value(value)
    for _ in range(5000):
        assert isinstance(masked, list) and len(masked) == 1
        masked = masked[0]
    assert masked == "[email]"
