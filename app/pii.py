"""PII masking at write, for typed agent state (seed 002) and any other text Loom keeps.

A field a type declares with ``pii: true`` is masked before it is stored, by the namespace's
rules: four built-in detectors (emails, phone numbers, payment cards, IBANs) plus the
namespace's own regular expressions. A match is replaced by a stable mask (``[email]``,
``[phone]``, ``[card]``, ``[iban]``, ``[<rule name>]`` or the rule's own ``mask``), so the same
text always masks the same way and a masked state still compares equal across writes.

Masking reads a normalised form of the text (NFKC, format characters such as zero-width spaces
removed), so ``ana\u200b@example.com`` or a fullwidth ``ａｎａ@example.com`` masks like the plain
address; text in which nothing is found is stored exactly as written. Object keys are masked
like values: ``{"ana@example.com": ...}`` keeps no address in its key.

The module is pure: no Redis, no Flask. Callers validate a namespace's rules once with
``validate_pii_rules`` (it raises ``SchemaRuleViolation`` naming the rule and the path), keep
the compiled list, and call ``mask_text`` / ``mask_value`` on every write.

Detector choices, in short (the reasons sit next to the code):

- cards are masked only when the digits pass the Luhn check, so order numbers survive;
- IBANs are masked only when the mod-97 check passes (and the length fits the country);
- phone numbers need a visible phone shape: an international prefix (``+`` or ``00``), or a
  national layout with separators; a bare run of digits, a short number or a date is left alone.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import re2

from app.errors import SchemaRuleViolation

# A namespace's own patterns run on RE2 (google-re2), whose matching time is linear in the text
# whatever the pattern, so no rule can pin a web worker by backtracking (``(a|aa)+b`` included).
# What RE2 cannot run in linear time (backreferences, lookarounds, atomic groups, possessive
# quantifiers) does not compile there and is refused at validation. Each pattern scans at most
# the first SCAN_LIMIT characters of a string (a state is capped at 65,536 bytes, so a longer
# string can never be stored anyway), and a request body is at most LOOM_MAX_BODY_BYTES: the
# work per write is bounded by rules x text.
SCAN_LIMIT = 65_536
# RE2's memory for one compiled pattern; a pattern needing more (huge counted repeats) is refused.
RE2_MAX_MEM = 8 << 20

MAX_RULES = 32
MAX_PATTERN_LENGTH = 512
MAX_MASK_LENGTH = 64
RULE_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")

# The built-in masks. A custom rule may not take one of these names: a reader of a masked state
# must be able to trust that "[card]" means a Luhn-valid card number and nothing else.
BUILTIN_MASKS = {
    "email": "[email]",
    "phone": "[phone]",
    "card": "[card]",
    "iban": "[iban]",
}

_RULE_KEYS = frozenset({"name", "pattern", "mask"})


@dataclass(frozen=True)
class CompiledRule:
    """One validated custom rule: its name, source pattern, compiled regex and mask."""

    name: str
    pattern: str
    regex: Any  # an RE2 pattern object (re2._Regexp)
    mask: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "pattern": self.pattern, "mask": self.mask}


# --- validation of a namespace's rules ---------------------------------------------------------


def validate_pii_rules(rules: Any, path: str = "pii_rules") -> list[CompiledRule]:
    """Validate a namespace's custom rules and compile them.

    ``rules`` is a list of ``{"name", "pattern", "mask"?}`` objects (``None`` means no rules).
    Unknown keys are refused rather than ignored: a typo such as ``"patern"`` would otherwise
    silently leave PII unmasked. Raises ``SchemaRuleViolation`` with ``field`` set to the path of
    the offending member, e.g. ``pii_rules[2].pattern``.
    """
    if rules is None:
        return []
    if not isinstance(rules, list):
        raise SchemaRuleViolation("pii_rules_not_list", "pii rules must be a list", field=path)
    if len(rules) > MAX_RULES:
        raise SchemaRuleViolation(
            "pii_rules_too_many",
            f"at most {MAX_RULES} pii rules, got {len(rules)}",
            field=path,
        )
    compiled: list[CompiledRule] = []
    seen: set[str] = set()
    for i, rule in enumerate(rules):
        here = f"{path}[{i}]"
        if not isinstance(rule, Mapping):
            raise SchemaRuleViolation(
                "pii_rule_not_object", "a pii rule must be an object", field=here
            )
        unknown = sorted(str(k) for k in rule if k not in _RULE_KEYS)
        if unknown:
            raise SchemaRuleViolation(
                "pii_rule_unknown_key",
                f"unknown key(s) in pii rule: {', '.join(unknown)}",
                field=f"{here}.{unknown[0]}",
            )
        name = rule.get("name")
        if not isinstance(name, str) or not RULE_NAME_RE.fullmatch(name):
            raise SchemaRuleViolation(
                "pii_rule_name_invalid",
                "rule name must match [a-z][a-z0-9_]{0,31}",
                field=f"{here}.name",
            )
        if name in BUILTIN_MASKS:
            raise SchemaRuleViolation(
                "pii_rule_name_reserved",
                f"'{name}' is a built-in detector; choose another name",
                field=f"{here}.name",
            )
        if name in seen:
            raise SchemaRuleViolation(
                "pii_rule_name_duplicate", f"duplicate rule name '{name}'", field=f"{here}.name"
            )
        seen.add(name)
        pattern = _check_pattern(rule.get("pattern"), f"{here}.pattern")
        mask = _check_mask(rule.get("mask"), name, f"{here}.mask")
        compiled.append(CompiledRule(name, pattern, _re2_compile(pattern), mask))
    return compiled


def _re2_options() -> Any:
    options = re2.Options()
    options.log_errors = False  # a refused pattern is the caller's 422, not a server log line
    options.max_mem = RE2_MAX_MEM
    return options


def _re2_compile(pattern: str) -> Any:
    return re2.compile(pattern, _re2_options())


def pattern_is_accepted(pattern: str) -> bool:
    """Whether a pii rule's ``pattern`` keeps the rules ``_check_pattern`` holds it to."""
    try:
        _check_pattern(pattern, "pattern")
    except SchemaRuleViolation:
        return False
    return True


def _check_pattern(pattern: Any, where: str) -> str:
    if not isinstance(pattern, str) or not pattern:
        raise SchemaRuleViolation(
            "pii_rule_pattern_invalid", "pattern must be a non-empty string", field=where
        )
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise SchemaRuleViolation(
            "pii_rule_pattern_too_long",
            f"pattern of {len(pattern)} characters is over {MAX_PATTERN_LENGTH}",
            field=where,
        )
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise SchemaRuleViolation(
            "pii_rule_pattern_invalid", f"pattern does not compile: {exc}", field=where
        ) from None
    try:
        regex = _re2_compile(pattern)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise SchemaRuleViolation(
            "pii_rule_pattern_unsafe",
            f"pattern cannot run in linear time ({reason}): backreferences, lookarounds, "
            "atomic groups and possessive quantifiers are not supported",
            field=where,
        ) from None
    # A pattern that matches the empty string would splice a mask between every character.
    if regex.fullmatch("") is not None:
        raise SchemaRuleViolation(
            "pii_rule_pattern_matches_empty",
            "pattern must not match the empty string",
            field=where,
        )
    return pattern


def _check_mask(mask: Any, name: str, where: str) -> str:
    if mask is None:
        return f"[{name}]"
    if not isinstance(mask, str) or not mask or len(mask) > MAX_MASK_LENGTH:
        raise SchemaRuleViolation(
            "pii_rule_mask_invalid",
            f"mask must be a string of 1 to {MAX_MASK_LENGTH} characters",
            field=where,
        )
    return mask


# --- built-in detectors ------------------------------------------------------------------------

# Emails: a pragmatic shape (local@domain.tld), not RFC 5322. The local part and each domain
# label are single character classes, so matching is linear.
_EMAIL_RE = re.compile(
    r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@(?:[A-Za-z0-9-]{1,63}\.)+[A-Za-z]{2,24}"
    r"(?![A-Za-z0-9-])"
)

# IBAN lengths from the SWIFT registry. A code in this table must have exactly its length; an
# unknown two-letter code is accepted at 15 to 34 characters only in upper case, so a newly
# registered country still masks while random lower-case tokens do not.
_IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22,
    "BI": 27, "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DJ": 27,
    "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FK": 18, "FO": 18, "FR": 27,
    "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HN": 28, "HR": 21, "HU": 28,
    "IE": 22, "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28,
    "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "LY": 25, "MC": 27, "MD": 24, "ME": 22,
    "MK": 19, "MN": 20, "MR": 27, "MT": 31, "MU": 30, "NI": 28, "NL": 18, "NO": 15, "OM": 23,
    "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "RU": 33, "SA": 24,
    "SC": 31, "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "SO": 23, "ST": 25, "SV": 28,
    "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20, "YE": 30,
}  # fmt: skip

# An IBAN written compact or in the usual groups of four. Each repetition takes one character
# (with an optional single space before it), so there is no ambiguity to backtrack through.
_IBAN_RE = re.compile(r"(?<![A-Za-z0-9])[A-Za-z]{2}[0-9]{2}(?: ?[A-Za-z0-9]){11,30}(?![A-Za-z0-9])")

# A "number span": digit groups joined by one separator (space, dash, dot) or by parentheses,
# with an optional leading "+". Every repetition starts with a non-digit, and the atomic group
# stops the engine from retrying shorter spans, so a scan is linear. Spans are then classified
# in Python (card, phone, or left alone), which is far easier to get right than one big regex.
_SPAN_RE = re.compile(r"(?<![\w+])(?>\+?\(?\d+(?:(?:[ .\-]\(?|\)[ .\-]?\(?|\()\d+)*\)?)(?![\w@])")

# Dates are never phone numbers or cards: a piece that holds one is left alone.
_DATE_RE = re.compile(
    r"(?<!\d)(?:\d{4}[-./]\d{1,2}[-./]\d{1,2}|\d{1,2}[-./]\d{1,2}[-./]\d{4})(?!\d)"
)
# North American layout: (415) 555-2671, 415-555-2671, 415.555.2671, 1 415 555 2671.
_NANP_RE = re.compile(r"(?:1[ .\-])?(?:\(\d{3}\) ?|\d{3}[ .\-])\d{3}[ .\-]\d{4}")
# National layouts with a trunk 0 and separators: 06 12 34 56 78, 020 7946 0958, (030) 1234567.
_TRUNK_RE = re.compile(r"(?:\(0\d{1,4}\) ?|0\d{1,4}[ .\-])\d{2,8}(?:[ .\-]\d{2,8})*")
_PIECE_RE = re.compile(r"[^ ]+")
_MAX_ITEM_DIGITS = 19  # the longest card; the longest phone (00 + 15 digits) is shorter


def _luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _iban_ok(compact: str) -> bool:
    """Mod-97 check (ISO 13616) plus the country's registered length."""
    country = compact[:2].upper()
    expected = _IBAN_LENGTHS.get(country)
    if expected is None:
        if not compact[:2].isupper() or not 15 <= len(compact) <= 34:
            return False
    elif len(compact) != expected:
        return False
    rearranged = (compact[4:] + compact[:4]).upper()
    # Letters count as 10..35; int() on the joined string is exact for 34 characters.
    number = "".join(str(int(ch, 36)) for ch in rearranged)
    return int(number) % 97 == 1


def _mask_ibans(text: str) -> str:
    def repl(m: re.Match[str]) -> str:
        candidate = m.group(0)
        # The greedy match may have swallowed a following word written in capitals
        # ("GB82 WEST 1234 5698 7654 32 AND"); drop trailing groups until the check passes.
        while True:
            if _iban_ok(candidate.replace(" ", "")):
                return BUILTIN_MASKS["iban"] + m.group(0)[len(candidate) :]
            cut = candidate.rfind(" ")
            if cut <= 4:
                return m.group(0)
            candidate = candidate[:cut]

    return _IBAN_RE.sub(repl, text)


def _card_shaped(piece: str) -> bool:
    """Digits grouped as cards are printed: groups of 4+ (4-4-4-4, 4-6-5), only space or dash.

    Cards never start with 0 and never carry a "+", a dot or parentheses.
    """
    if not re.fullmatch(r"[1-9][\d \-]*", piece):
        return False
    groups = re.split(r"[ \-]", piece)
    digits = "".join(groups)
    return 13 <= len(digits) <= 19 and all(len(g) >= 4 for g in groups[:-1])


def _is_card(piece: str) -> bool:
    return _card_shaped(piece) and _luhn_ok(re.sub(r"\D", "", piece))


def _is_phone(piece: str) -> bool:
    digits = re.sub(r"\D", "", piece)
    if piece.startswith("+"):
        # E.164 allows up to 15 digits; a country code never starts with 0.
        return 8 <= len(digits) <= 15 and digits[0] != "0"
    if piece.startswith("00"):
        # 00 is the international call prefix in most of the world.
        rest = digits[2:]
        return 8 <= len(rest) <= 15 and rest[0] != "0"
    if _NANP_RE.fullmatch(piece):
        return True
    return bool(_TRUNK_RE.fullmatch(piece)) and 9 <= len(digits) <= 12


def _classify(piece: str) -> str | None:
    if _DATE_RE.search(piece):
        return None
    if _is_card(piece):
        return "card"
    if _is_phone(piece):
        return "phone"
    return None


def _span_items(span: str) -> Iterator[tuple[int, int, str]]:
    """Yield (start, end, kind) for each card or phone inside one number span.

    A span can hold several numbers joined by single spaces ("415-555-2671 415-555-0100") or a
    number after a plain one ("room 12 415-555-2671"), so it is cut at spaces into pieces and
    read greedily: at each piece, the longest run of pieces that is a card or a phone wins.
    """
    if _card_shaped(span) and not _DATE_RE.search(span):
        # A card-shaped number is a card or nothing: if the whole fails Luhn, only a prefix may
        # be a card (a card followed by its 3-digit code). Never read a failing card as a phone.
        if _is_card(span):
            yield 0, len(span), "card"
            return
        cut = len(span)
        while (cut := span.rfind(" ", 0, cut)) > 0:
            if _is_card(span[:cut]):
                yield 0, cut, "card"
                return
        return
    pieces = [(m.start(), m.end(), _count_digits(m.group(0))) for m in _PIECE_RE.finditer(span)]
    i = 0
    while i < len(pieces):
        found = None
        first = span[pieces[i][0] : pieces[i][1]]
        digits = 0
        before_last = inner = _MAX_ITEM_DIGITS  # smallest piece before the last / after the first
        for j in range(i, len(pieces)):
            if j > i:
                before_last = min(before_last, pieces[j - 1][2])
                inner = min(inner, pieces[j][2])
            digits += pieces[j][2]
            if digits > _MAX_ITEM_DIGITS + 2:  # +2: an "00" prefix is not part of the number
                break
            # Cheap counts first: a span of thousands of short numbers must cost neither a
            # regex per pair of pieces nor a walk to the 21-digit limit from every piece.
            if _worth_classifying(first, digits, j - i + 1, before_last, inner):
                kind = _classify(span[pieces[i][0] : pieces[j][1]])
                if kind is not None:
                    found = (j, kind)
            if not _can_grow(first, digits, j - i + 1, min(before_last, pieces[j][2]), inner):
                break
        if found is None:
            i += 1
            continue
        j, kind = found
        yield pieces[i][0], pieces[j][1], kind
        i = j + 1


def _count_digits(piece: str) -> int:
    return sum(ch.isdigit() for ch in piece)


def _worth_classifying(first: str, digits: int, count: int, before_last: int, inner: int) -> bool:
    """Whether a run of ``count`` pieces could be a card or a phone, from counts alone."""
    if first.startswith("+"):
        return 8 <= digits <= 15
    if first.startswith("00"):
        return 10 <= digits <= 17
    if first.startswith(("0", "(0")):
        return 9 <= digits <= 12 and _count_digits(first) >= 2 and inner >= 2
    card = 13 <= digits <= 19 and before_last >= 4
    nanp = 10 <= digits <= 11 and count <= 4
    return card or nanp


def _can_grow(first: str, digits: int, count: int, before_next: int, inner: int) -> bool:
    """Whether adding more pieces could still give a card or a phone (``before_next`` is the
    smallest piece up to and including the current one)."""
    if first.startswith("+"):
        return digits < 15
    if first.startswith("00"):
        return digits < 17
    if first.startswith(("0", "(0")):
        return digits < 12 and _count_digits(first) >= 2 and inner >= 2
    return (digits < 19 and before_next >= 4) or (digits < 11 and count < 4)


def _trim_parens(offset: int, span: str) -> tuple[int, str]:
    """Drop parentheses that belong to the prose around a number, not to the number.

    "(call 415-555-2671)" gives the span "415-555-2671)" and "(4111111111111111)" a span in
    parentheses; only balanced inner parentheses, as in "(415) 555-2671", are part of a number.
    """
    while span.endswith(")") and span.count(")") > span.count("("):
        span = span[:-1]
    while span.startswith("(") and span.count("(") > span.count(")"):
        span, offset = span[1:], offset + 1
    if span.startswith("(") and span.endswith(")") and span.count("(") == 1:
        span, offset = span[1:-1], offset + 1
    return offset, span


def _mask_numbers(text: str) -> str:
    out: list[str] = []
    last = 0
    for m in _SPAN_RE.finditer(text):
        offset, span = _trim_parens(m.start(), m.group(0))
        for start, end, kind in _span_items(span):
            out.append(text[last : offset + start])
            out.append(BUILTIN_MASKS[kind])
            last = offset + end
    out.append(text[last:])
    return "".join(out)


def _mask_custom(text: str, rules: Sequence[CompiledRule]) -> str:
    head, tail = text[:SCAN_LIMIT], text[SCAN_LIMIT:]
    for rule in rules:

        def repl(m: re.Match[str], mask: str = rule.mask) -> str:
            # A pattern that can match empty (a lone lookahead, \b) must not splice masks in.
            return mask if m.end() > m.start() else m.group(0)

        head = rule.regex.sub(repl, head)
    return head + tail


# --- public masking ------------------------------------------------------------------------------


def _compiled(rules: Sequence[CompiledRule] | Sequence[Mapping[str, Any]] | None) -> list[Any]:
    if not rules:
        return []
    if all(isinstance(r, CompiledRule) for r in rules):
        return list(rules)
    # Raw rule objects (as stored in the namespace document) are validated on the spot, so a
    # caller can never mask with a rule that would have been refused.
    return validate_pii_rules(list(rules))


def normalised(text: str) -> str:
    """NFKC with format characters (Unicode category Cf: zero-width spaces and joiners, soft
    hyphens, direction marks) removed: the form PII is looked for in."""
    folded = unicodedata.normalize("NFKC", text)
    return "".join(ch for ch in folded if unicodedata.category(ch) != "Cf")


def mask_text(
    text: str, rules: Sequence[CompiledRule] | Sequence[Mapping[str, Any]] | None = None
) -> str:
    """Mask every PII match in ``text`` and return the masked string.

    The detectors read the normalised form (``normalised``): when they find something there,
    the masked normalised text is answered; when they find nothing, ``text`` as it was.

    The namespace's own rules run first: they are the more specific ones, and their masks must
    not be broken up by a built-in detector reading part of the same text. Then emails, IBANs,
    and finally number spans (cards and phones): an email or IBAN holds digits that must not be
    read as a phone. Custom rules scan only the first ``SCAN_LIMIT`` characters (see above); the
    built-in detectors are linear and scan the whole string.
    """
    if not text:
        return text
    compiled = _compiled(rules)
    plain = text if text.isascii() else normalised(text)
    masked = plain
    if compiled:
        masked = _mask_custom(masked, compiled)
    masked = _EMAIL_RE.sub(BUILTIN_MASKS["email"], masked)
    masked = _mask_ibans(masked)
    masked = _mask_numbers(masked)
    return text if masked == plain else masked


def _masked_key(key: str, target: dict[str, Any], compiled: list[Any]) -> str:
    """An object key masked like a value; two keys masking alike stay apart (``#2``...)."""
    masked = mask_text(key, compiled)
    if masked == key or masked not in target:
        return masked
    n = 2
    while f"{masked}#{n}" in target:
        n += 1
    return f"{masked}#{n}"


def mask_value(
    value: Any, rules: Sequence[CompiledRule] | Sequence[Mapping[str, Any]] | None = None
) -> Any:
    """Return a copy of a JSON value with every string masked, at any depth.

    Used for ``pii: true`` fields of type text, string, array and object. Dict keys are masked
    too (a key can carry an address as well as a value can), and numbers, booleans and null
    pass through. The walk is iterative, so a deeply nested value cannot exhaust the stack.
    """
    compiled = _compiled(rules)
    if isinstance(value, str):
        return mask_text(value, compiled)
    if not isinstance(value, (list, dict)):
        return value
    root: list[Any] | dict[str, Any] = [] if isinstance(value, list) else {}
    stack: list[tuple[Any, list[Any] | dict[str, Any]]] = [(value, root)]
    while stack:
        source, target = stack.pop()
        # A list's indexes are never used as keys: only a dict target takes ``key``.
        items: Iterable[tuple[Any, Any]] = (
            enumerate(source) if isinstance(source, list) else source.items()
        )
        for key, item in items:
            if isinstance(item, str):
                new: Any = mask_text(item, compiled)
            elif isinstance(item, list):
                new = []
                stack.append((item, new))
            elif isinstance(item, dict):
                new = {}
                stack.append((item, new))
            else:
                new = item
            if isinstance(target, list):
                target.append(new)
            else:
                target[_masked_key(key, target, compiled)] = new
    return root
