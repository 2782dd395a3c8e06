"""Scope ids of agent state: their canonical form, and the keyed digest Loom stores instead.

Seed 002 names a state by its scope (a kind and an id) and its agent. The id travels in the
request body, never in a URL, because a conversation id can look like a phone number, and Loom
keeps it only as a keyed hash: the raw id appears nowhere in Redis. Two spellings of the same
scope must meet on the same digest, so ids are first put in a canonical form:

- ``conversation`` and ``task``: the id exactly as given (not even trimmed: these ids come from
  code, and two ids that differ by a space are two conversations);
- ``object``: the body gives ``"<type>:<id>"`` and Loom stores ``"<type>:<namespace>:<id>"``,
  the seed's form, so equal object ids in two namespaces never meet. A body that already gives
  ``"<type>:<namespace>:<id>"`` with this namespace is taken as canonical, so both spellings of
  the seed work; the consequence is that an object id that itself starts with
  ``"<namespace>:"`` must be written in the three-part form;
- ``subject``: the canonical form of one of the customer's handles: an email is trimmed and
  lower-cased; a phone number written with an international prefix (``+`` or ``00``) becomes
  E.164 (separators dropped, ``00`` read as ``+``, then ``+`` and 8 to 15 digits, the first not
  0); anything else is a customer id, trimmed. A national phone number without its country code
  is a customer id: Loom cannot guess the country, and guessing wrong would join two customers.

The digest is HMAC-SHA256 under the install's secret over a length-prefixed encoding of
(purpose, org, namespace, kind, canonical id), so no two different tuples encode to the same
bytes (``"a:b" + "c"`` never collides with ``"a" + "b:c"``), and the same id in two orgs, two
namespaces or two kinds gives unrelated digests. Pure module: no Redis, no Flask.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from app.errors import ValidationFailed
from app.json_patterns import PY_SPACE
from app.keyed import keyed_digest

SCOPE_KINDS = ("conversation", "task", "object", "subject")
MAX_SCOPE_ID_LENGTH = 1024

# Versioned purpose tag: another use of the same secret (or a later encoding) never produces
# a digest that could be mistaken for one of these.
_DIGEST_PURPOSE = b"loom.agent_state.scope.v1"

_OBJECT_TYPE_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")
_EMAIL_RE = re.compile(r"[^@\s]+@[^@\s]+")
_PHONE_SHAPE_RE = re.compile(r"(?:\+|00)[0-9 .\-()]*")
_E164_RE = re.compile(r"\+[1-9][0-9]{7,14}")


# The same rules as JSON Schema patterns (ECMA-262 and Python alike), for the OpenAPI
# document: a handle is, once trimmed, an email (one '@', no spaces), an international phone
# number (+ or 00, then 8 to 15 digits, the first not 0, separators allowed between them) or
# a customer id (no '@', and not shaped like a phone number). ``tests/test_scope_ids.py``
# holds each pattern to the function it describes.
_SEPARATORS = r"[ .\-()]"
_PHONE_PATTERN = rf"(?:\+|00){_SEPARATORS}*[1-9](?:{_SEPARATORS}*[0-9]){{7,14}}{_SEPARATORS}*"


def handle_pattern(control_free: bool = False) -> str:
    """The handle rules of ``canonical_subject`` as one pattern; ``control_free`` also bars
    control characters (a handle field that is an identity text)."""
    # Python's whitespace spelled out (str.strip() and re's \s read it), not ECMA-262's \s.
    bar = r"\x00-\x1f\x7f" if control_free else ""
    space = rf"(?:(?![{bar}])[{PY_SPACE}])" if control_free else rf"[{PY_SPACE}]"
    email = rf"[^@{PY_SPACE}{bar}]+@[^@{PY_SPACE}{bar}]+"
    customer_id = rf"(?!(?:\+|00)[0-9 .\-()]*{space}*$)[^@{PY_SPACE}{bar}][^@{bar}]*"
    return rf"^{space}*(?:{email}|{_PHONE_PATTERN}|{customer_id}){space}*$"


HANDLE_PATTERN = handle_pattern()
OBJECT_ID_PATTERN = r"^[a-z][a-z0-9_]{0,63}:[\s\S]+$"


def _fail(path: str, message: str) -> ValidationFailed:
    return ValidationFailed({path: [message]})


def _check_kind(kind: Any) -> str:
    if not isinstance(kind, str) or kind not in SCOPE_KINDS:
        raise _fail("scope.kind", f"must be one of: {', '.join(SCOPE_KINDS)}")
    return kind


def _check_id(raw: Any, path: str) -> str:
    if not isinstance(raw, str):
        raise _fail(path, "must be a string")
    if not raw.strip():
        raise _fail(path, "must not be empty")
    if len(raw) > MAX_SCOPE_ID_LENGTH:
        raise _fail(path, f"must be at most {MAX_SCOPE_ID_LENGTH} characters")
    return raw


def canonical_subject(handle: Any, path: str = "scope.id") -> str:
    """The canonical form of a customer handle (email, international phone, or customer id)."""
    value = _check_id(handle, path).strip()
    if "@" in value:
        if not _EMAIL_RE.fullmatch(value):
            raise _fail(path, "an email handle must be one local part, '@' and a domain")
        return value.lower()
    if _PHONE_SHAPE_RE.fullmatch(value):
        digits = re.sub(r"[ .\-()]", "", value)
        if digits.startswith("00"):
            digits = "+" + digits[2:]
        if not _E164_RE.fullmatch(digits):
            raise _fail(
                path,
                "a phone handle must give '+' (or 00), a country code and 8 to 15 digits in all",
            )
        return digits
    return value


def _canonical_object(raw: str, namespace: str, path: str) -> str:
    object_type, sep, rest = raw.partition(":")
    if not sep or not _OBJECT_TYPE_RE.fullmatch(object_type):
        raise _fail(path, "an object scope id must be '<type>:<id>', the type in [a-z][a-z0-9_]*")
    # Already in the seed's three-part form for this namespace: keep it as it is.
    ns_prefix = f"{namespace}:"
    if rest.startswith(ns_prefix) and len(rest) > len(ns_prefix):
        return raw
    if not rest:
        raise _fail(path, "an object scope id must name the object after the type")
    return f"{object_type}:{namespace}:{rest}"


def canonical_scope_id(kind: str, id: Any, namespace: str) -> str:
    """The canonical id of a scope; raises ``ValidationFailed`` on ``scope.kind`` / ``scope.id``."""
    kind = _check_kind(kind)
    if kind == "subject":
        return canonical_subject(id)
    raw = _check_id(id, "scope.id")
    if kind == "object":
        return _canonical_object(raw, namespace, "scope.id")
    return raw  # conversation and task ids are exact


def canonical_scope(scope: Any, namespace: str) -> tuple[str, str]:
    """Read a request's ``scope`` member (``{"kind", "id"}``) into (kind, canonical id)."""
    if not isinstance(scope, Mapping):
        raise _fail("scope", "must be an object with kind and id")
    # A scope is exactly its kind and id: a misspelt member is refused, not read as nothing
    # (the OpenAPI document closes the object too).
    unknown = sorted(str(key) for key in scope if key not in ("kind", "id"))
    if unknown:
        raise _fail(f"scope.{unknown[0]}", "a scope has only kind and id")
    kind = _check_kind(scope.get("kind"))
    return kind, canonical_scope_id(kind, scope.get("id"), namespace)


def scope_digest(secret: bytes, org: str, namespace: str, kind: str, canonical_id: str) -> str:
    """HMAC-SHA256 (hex) of one scope under the install's secret; what Loom stores and indexes."""
    kind = _check_kind(kind)
    return keyed_digest(secret, _DIGEST_PURPOSE, org, namespace, kind, canonical_id)


def subject_digest(
    secret: bytes, org: str, namespace: str, handle: Any, path: str = "subject"
) -> str:
    """The digest of a customer handle, equal to the digest of the ``subject`` scope it names.

    A state of another scope that names its customer in ``subject`` stores this digest, and a
    subject-scope state stores ``scope_digest(..., "subject", canonical_subject(handle))``: the
    two are the same value, so an erasure or a data package finds both with one lookup.
    """
    return scope_digest(secret, org, namespace, "subject", canonical_subject(handle, path))
