"""Scope ids: canonical forms, their validation errors, and the keyed digest Loom stores."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import pytest

from app.errors import ValidationFailed
from app.scope_ids import (
    MAX_SCOPE_ID_LENGTH,
    SCOPE_KINDS,
    canonical_scope,
    canonical_scope_id,
    canonical_subject,
    scope_digest,
    subject_digest,
)

SECRET = b"install-secret-for-tests"


def _fields(exc: pytest.ExceptionInfo[ValidationFailed]) -> dict[str, Any]:
    assert exc.value.status == 422
    assert exc.value.code == "VALIDATION_ERROR"
    return exc.value.details["fields"]


# --- conversation and task -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["conversation", "task"])
@pytest.mark.parametrize("raw", ["c-123", " padded ", "+33 6 12 34 56 78", "ABC", "a:b:c"])
def test_conversation_and_task_ids_are_exact(kind: str, raw: str) -> None:
    assert canonical_scope_id(kind, raw, "ns") == raw


def test_conversation_ids_differing_by_case_stay_distinct() -> None:
    assert canonical_scope_id("conversation", "Abc", "ns") != canonical_scope_id(
        "conversation", "abc", "ns"
    )


# --- object ------------------------------------------------------------------------------------


def test_object_id_gets_the_namespace() -> None:
    assert canonical_scope_id("object", "order:123", "shop") == "order:shop:123"


def test_object_id_already_canonical_is_kept() -> None:
    assert canonical_scope_id("object", "order:shop:123", "shop") == "order:shop:123"


def test_object_id_with_colons_keeps_the_rest() -> None:
    assert canonical_scope_id("object", "order:other:9:1", "shop") == "order:shop:other:9:1"


def test_same_object_in_two_namespaces_differs() -> None:
    assert canonical_scope_id("object", "order:1", "a") != canonical_scope_id(
        "object", "order:1", "b"
    )


@pytest.mark.parametrize("raw", ["order", "order:", ":123", "Order:1", "1order:1", "or-der:1"])
def test_object_id_shape_refused(raw: str) -> None:
    with pytest.raises(ValidationFailed) as info:
        canonical_scope_id("object", raw, "shop")
    assert list(_fields(info)) == ["scope.id"]


# --- subject -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, canonical",
    [
        ("Ana.Lopez@Example.COM", "ana.lopez@example.com"),
        ("  ana@example.com\n", "ana@example.com"),
        ("+33 6 12 34 56 78", "+33612345678"),
        ("0033 6 12 34 56 78", "+33612345678"),
        ("0033612345678", "+33612345678"),
        ("+1 (415) 555-2671", "+14155552671"),
        ("+1.415.555.2671", "+14155552671"),
        (" +44 20-7946-0958 ", "+442079460958"),
        ("+12345678", "+12345678"),  # 8 digits, the shortest
        ("+123456789012345", "+123456789012345"),  # 15 digits, the longest
        ("cust-42", "cust-42"),
        ("  cust-42  ", "cust-42"),
        ("CUST-42", "CUST-42"),  # a customer id keeps its case
        ("0612345678", "0612345678"),  # a national number has no country: a customer id
        ("12345", "12345"),
    ],
)
def test_subject_canonical_forms(raw: str, canonical: str) -> None:
    assert canonical_scope_id("subject", raw, "ns") == canonical
    assert canonical_subject(raw) == canonical


def test_phone_spellings_meet() -> None:
    forms = ["+33 6 12 34 56 78", "0033612345678", "+33-6-12-34-56-78", "+33 (6) 12.34.56.78"]
    assert {canonical_subject(f) for f in forms} == {"+33612345678"}


@pytest.mark.parametrize(
    "raw",
    [
        "+1234567",  # 7 digits
        "+1234567890123456",  # 16 digits
        "+0612345678",  # a country code never starts with 0
        "000612345678",  # 00 then 0
        "+",
        "00",
        "+() ",
    ],
)
def test_bad_phone_handles_refused(raw: str) -> None:
    with pytest.raises(ValidationFailed) as info:
        canonical_subject(raw)
    assert list(_fields(info)) == ["scope.id"]


@pytest.mark.parametrize("raw", ["a@b@c", "@example.com", "ana@", "an a@example.com"])
def test_bad_email_handles_refused(raw: str) -> None:
    with pytest.raises(ValidationFailed) as info:
        canonical_subject(raw)
    assert list(_fields(info)) == ["scope.id"]


def test_subject_error_path_can_be_named() -> None:
    with pytest.raises(ValidationFailed) as info:
        canonical_subject("+1", path="subject")
    assert list(_fields(info)) == ["subject"]


# --- ids and kinds refused ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", SCOPE_KINDS)
@pytest.mark.parametrize("raw", [None, 42, "", "   ", "x" * (MAX_SCOPE_ID_LENGTH + 1), ["a"]])
def test_bad_ids_refused(kind: str, raw: Any) -> None:
    with pytest.raises(ValidationFailed) as info:
        canonical_scope_id(kind, raw, "ns")
    assert list(_fields(info)) == ["scope.id"]


def test_longest_id_accepted() -> None:
    raw = "x" * MAX_SCOPE_ID_LENGTH
    assert canonical_scope_id("task", raw, "ns") == raw


@pytest.mark.parametrize("kind", ["user", "", None, "Conversation", 1])
def test_bad_kind_refused(kind: Any) -> None:
    with pytest.raises(ValidationFailed) as info:
        canonical_scope_id(kind, "x", "ns")
    assert list(_fields(info)) == ["scope.kind"]


def test_canonical_scope_reads_the_body_member() -> None:
    assert canonical_scope({"kind": "object", "id": "order:1"}, "shop") == (
        "object",
        "order:shop:1",
    )
    assert canonical_scope({"kind": "subject", "id": "A@B.io"}, "shop") == ("subject", "a@b.io")


@pytest.mark.parametrize(
    "scope, path",
    [
        ("conversation:1", "scope"),
        (None, "scope"),
        ({"id": "1"}, "scope.kind"),
        ({"kind": "task"}, "scope.id"),
    ],
)
def test_canonical_scope_errors(scope: Any, path: str) -> None:
    with pytest.raises(ValidationFailed) as info:
        canonical_scope(scope, "shop")
    assert list(_fields(info)) == [path]


# --- digests -----------------------------------------------------------------------------------


def test_digest_is_deterministic_hex_sha256() -> None:
    a = scope_digest(SECRET, "org", "ns", "conversation", "c-1")
    b = scope_digest(SECRET, "org", "ns", "conversation", "c-1")
    assert a == b
    assert len(a) == 64 and int(a, 16) >= 0


def test_digest_never_contains_the_raw_id() -> None:
    raw = "+33612345678"
    assert raw not in scope_digest(SECRET, "org", "ns", "conversation", raw)


def test_digest_is_an_hmac_over_a_length_prefixed_encoding() -> None:
    parts = [b"loom.agent_state.scope.v1", b"org", b"ns", b"task", b"t-1"]
    message = b"".join(len(p).to_bytes(4, "big") + p for p in parts)
    expected = hmac.new(SECRET, message, hashlib.sha256).hexdigest()
    assert scope_digest(SECRET, "org", "ns", "task", "t-1") == expected


@pytest.mark.parametrize(
    "other",
    [
        ("org2", "ns", "conversation", "c-1"),
        ("org", "ns2", "conversation", "c-1"),
        ("org", "ns", "task", "c-1"),
        ("org", "ns", "conversation", "c-2"),
    ],
)
def test_digest_separates_org_namespace_kind_and_id(other: tuple[str, str, str, str]) -> None:
    base = scope_digest(SECRET, "org", "ns", "conversation", "c-1")
    assert scope_digest(SECRET, *other) != base


def test_digest_depends_on_the_secret() -> None:
    a = scope_digest(SECRET, "org", "ns", "task", "t")
    assert scope_digest(b"another-secret", "org", "ns", "task", "t") != a
    assert scope_digest(bytearray(SECRET), "org", "ns", "task", "t") == a


@pytest.mark.parametrize(
    "left, right",
    [
        (("a:b", "c", "task", "x"), ("a", "b:c", "task", "x")),
        (("ab", "c", "task", "x"), ("a", "bc", "task", "x")),
        (("o", "n", "task", "xy"), ("o", "nx", "task", "y")),
        (("o", "", "task", "x"), ("", "o", "task", "x")),
    ],
)
def test_no_concatenation_ambiguity(
    left: tuple[str, str, str, str], right: tuple[str, str, str, str]
) -> None:
    assert scope_digest(SECRET, *left) != scope_digest(SECRET, *right)


def test_digest_handles_non_ascii() -> None:
    a = scope_digest(SECRET, "orgé", "ns", "subject", "zoë@example.com")
    assert a == scope_digest(SECRET, "orgé", "ns", "subject", "zoë@example.com")
    assert a != scope_digest(SECRET, "orge", "ns", "subject", "zoë@example.com")


@pytest.mark.parametrize("secret", [b"", "text-secret", None])
def test_digest_needs_a_non_empty_bytes_secret(secret: Any) -> None:
    with pytest.raises(ValueError):
        scope_digest(secret, "org", "ns", "task", "t")


def test_digest_refuses_unknown_kind() -> None:
    with pytest.raises(ValidationFailed) as info:
        scope_digest(SECRET, "org", "ns", "user", "t")
    assert list(_fields(info)) == ["scope.kind"]


# --- subject digest ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "handle, scope_id",
    [
        (" Ana@Example.com ", "ana@example.com"),
        ("0033 6 12 34 56 78", "+33 612 345 678"),
        ("cust-42", " cust-42 "),
    ],
)
def test_subject_digest_meets_the_subject_scope_digest(handle: str, scope_id: str) -> None:
    canonical = canonical_scope_id("subject", scope_id, "ns")
    assert subject_digest(SECRET, "org", "ns", handle) == scope_digest(
        SECRET, "org", "ns", "subject", canonical
    )


def test_subject_digest_differs_from_a_conversation_with_the_same_id() -> None:
    # A conversation id that looks like a phone number is not the customer's phone.
    phone = "+33612345678"
    assert subject_digest(SECRET, "org", "ns", phone) != scope_digest(
        SECRET, "org", "ns", "conversation", phone
    )


def test_subject_digest_separates_orgs_and_namespaces() -> None:
    base = subject_digest(SECRET, "org", "ns", "ana@x.io")
    assert subject_digest(SECRET, "org2", "ns", "ana@x.io") != base
    assert subject_digest(SECRET, "org", "ns2", "ana@x.io") != base


def test_subject_digest_errors_name_subject() -> None:
    with pytest.raises(ValidationFailed) as info:
        subject_digest(SECRET, "org", "ns", "+12")
    assert list(_fields(info)) == ["subject"]


# --- the OpenAPI document's patterns say what these functions do -------------------------------

_HANDLE_ALPHABET = "+0019 .-()@a\t\u00a0\u2003x"


def _accepted(check: Any, value: str) -> bool:
    try:
        check(value)
    except ValidationFailed:
        return False
    return True


def test_the_handle_pattern_accepts_exactly_the_handles_canonical_subject_takes():
    """Exhaustive over short strings of the characters the rules turn on: '+', '00', digits,
    separators, '@', letters and Unicode spaces."""
    import itertools
    import re

    from app.scope_ids import HANDLE_PATTERN, handle_pattern

    pattern = re.compile(HANDLE_PATTERN)
    samples = ["".join(chars) for length in range(1, 5)
               for chars in itertools.product("+0 1@a", repeat=length)]
    samples += ["+41 79 123 45 67", "0041791234567", "+1 (555) 010-9999", "00 41 79 123 45 6",
                "+4179123456789012", "+417912345678901", "  sam@Example.com ", "a@b@c",
                "cust-42", "\u2003+41791234567\u00a0", "+41791234567\t", "(+41) 79"]
    disagree = [value for value in samples
                if bool(pattern.fullmatch(value)) != _accepted(canonical_subject, value)]
    assert disagree == []
    # The identity-text form also bars control characters, and says nothing else new.
    control_free = re.compile(handle_pattern(control_free=True))
    samples += ["+41791234567\x1c", "\tcust", "cu\x7fst", "a@b\n", "cust\x1f"]
    disagree = [value for value in samples if bool(control_free.fullmatch(value)) != (
        _accepted(canonical_subject, value) and not re.search("[\x00-\x1f\x7f]", value))]
    assert disagree == []


def test_strings_drawn_from_the_handle_and_object_patterns_are_accepted():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from app.scope_ids import HANDLE_PATTERN, OBJECT_ID_PATTERN

    @settings(max_examples=300, deadline=None)
    @given(st.from_regex(HANDLE_PATTERN), st.text(alphabet=_HANDLE_ALPHABET, max_size=12))
    def handles(drawn: str, text: str) -> None:
        import re

        assert _accepted(canonical_subject, drawn)
        assert bool(re.fullmatch(HANDLE_PATTERN, text)) == _accepted(canonical_subject, text)

    @settings(max_examples=200, deadline=None)
    @given(st.from_regex(OBJECT_ID_PATTERN).filter(lambda v: len(v) <= MAX_SCOPE_ID_LENGTH))
    def objects(drawn: str) -> None:
        assert _accepted(lambda v: canonical_scope_id("object", v, "shop"), drawn)

    handles()
    objects()


def test_a_scope_member_other_than_kind_and_id_is_refused_naming_it():
    with pytest.raises(ValidationFailed) as caught:
        canonical_scope({"kind": "conversation", "id": "c-1", "kidn": "task"}, "shop")
    assert _fields(caught) == {"scope.kidn": ["a scope has only kind and id"]}
