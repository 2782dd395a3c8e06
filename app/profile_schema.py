"""The namespace profile schema: the rules a schema must meet, and what follows from one.

This module owns everything Loom derives from a structured-profile schema without touching Redis
or HTTP:

- ``validate_profile_schema`` holds a document to the seed's schema rules and raises
  ``SchemaRuleViolation`` naming the broken rule (and the property path, where there is one);
- ``output_cap_estimate`` / ``max_tokens_for`` size the model's output cap for a full answer;
- ``schema_sha256`` is the hash a built profile carries, blind to titles and property order;
- ``validate_answer`` holds a model's answer to the schema, turning every bad value into null;
- ``null_profile`` is the all-null profile.

Rule names (the ``rule`` of each ``SchemaRuleViolation``):

- ``not_object``: not a JSON object, ``type`` is not ``"object"``, or no ``properties`` object
- ``too_large``: the canonical JSON of the document is over 16 KiB
- ``malformed``: not a well-formed Draft 2020-12 schema, or a pattern that does not compile
- ``unsupported_keyword``: a top-level keyword, or one on a boolean or array, Loom does not take
- ``required_forbidden``: ``required`` at the top level (every property is in every profile)
- ``additional_properties``: ``additionalProperties`` present and not exactly ``false``
- ``property_count``: fewer than 1 or more than 64 properties
- ``property_type``: a property that is not an object with one of the five types
- ``missing_description``: a property without a non-empty string ``description``
- ``array_items``: an array whose ``items`` is missing or not of one scalar type
- ``max_items``: ``maxItems`` above 50
- ``string_constraint``: a string keyword other than enum/pattern/minLength/maxLength, or a bad one
- ``number_constraint``: a number keyword other than minimum/maximum, or a bad one
- ``too_many_values``: a full answer of more than 256 values
- ``output_cap``: the output-cap estimate of a full answer is above 16,384 tokens

Field paths are dotted document paths such as ``properties.languages.items.type``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from typing import Any, TypeGuard

from jsonschema import Draft202012Validator, SchemaError

from app.errors import SchemaRuleViolation
from app.json_patterns import NOT_BLANK_PATTERN

MAX_SCHEMA_BYTES = 16 * 1024
# Objects and arrays nested deeper than this are refused before jsonschema reads the document:
# its meta-validation recurses per level and a few hundred levels exhaust the stack. A profile
# schema needs a handful (properties, an array's items, an enum).
MAX_SCHEMA_DEPTH = 32
MIN_PROPERTIES = 1
MAX_PROPERTIES = 64
MAX_ARRAY_ITEMS = 50
# An array without maxItems can still hold up to MAX_ARRAY_ITEMS values (validate_answer holds it
# there), so it is counted at that ceiling in the value count and the output-cap estimate.
DEFAULT_ARRAY_ITEMS = MAX_ARRAY_ITEMS
MAX_ANSWER_VALUES = 256
MAX_OUTPUT_CAP_TOKENS = 16_384
# The seed's LLM_MAX_TOKENS: the base output allowance a schema's estimate is added to (the
# chat client's default, app.model.chat).
DEFAULT_BASE_TOKENS = 32

CHARS_PER_TOKEN = 2
STRING_TOKENS_UNBOUNDED = 48
SCALAR_TOKENS = 12
# Two quotes, a colon and a comma around every key of the answer object.
KEY_PUNCTUATION_CHARS = 4

# JSON numbers are doubles in most clients; past 2^53 an integer no longer round-trips exactly.
MAX_SAFE_INTEGER = 2**53

SCALAR_TYPES = frozenset({"string", "number", "integer", "boolean"})
PROPERTY_TYPES = SCALAR_TYPES | {"array"}

# Annotations a reader (or the model) may see; they never change what an answer may hold.
_ANNOTATIONS = frozenset({"type", "description", "title"})
_STRING_KEYWORDS = _ANNOTATIONS | {"enum", "pattern", "minLength", "maxLength"}
# The same constraints typed records use: nothing beyond a closed range.
_NUMBER_KEYWORDS = _ANNOTATIONS | {"minimum", "maximum"}
_BOOLEAN_KEYWORDS = _ANNOTATIONS
_ARRAY_KEYWORDS = _ANNOTATIONS | {"items", "maxItems"}
# `$schema`, `$id` and `$comment` are harmless identifiers; anything else at the top level
# (patternProperties, allOf, $defs, if/then ...) would change what an answer may hold.
_TOP_LEVEL_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "additionalProperties",
        "title",
        "description",
        "$schema",
        "$id",
        "$comment",
    }
)

_INVALID = object()  # sentinel: validate_answer found the value bad


# --- canonical JSON --------------------------------------------------------------------------


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, real UTF-8: two equal documents give equal text."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def _canonical_bytes(value: Any) -> bytes:
    return canonical_json(value).encode("utf-8")


# --- schema rules ----------------------------------------------------------------------------


def _fail(rule: str, message: str, field: str | None = None) -> SchemaRuleViolation:
    if field is None:
        return SchemaRuleViolation(rule, message)
    return SchemaRuleViolation(rule, f"{field}: {message}", field=field)


def _deepest(doc: Any) -> tuple[int, str]:
    """How deep objects and arrays nest in ``doc``, and the path of the first deepest one.
    Iterative, so the walk itself cannot run out of stack; it stops one level past the cap."""
    deepest, where = 0, ""
    stack: list[tuple[Any, int, str]] = [(doc, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        if depth > deepest:
            deepest, where = depth, path
        if depth > MAX_SCHEMA_DEPTH:
            break
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1, f"{path}.{key}" if path else str(key)))
    return deepest, where


def _is_int(value: Any) -> TypeGuard[int]:
    # bool is an int subclass in Python but never a JSON integer.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def validate_profile_schema(doc: Any) -> None:
    """Raise ``SchemaRuleViolation`` unless ``doc`` meets every profile schema rule.

    Order: shape and size first, so a huge document is refused before any deeper work (the
    meta-validation walks the whole document); then Draft 2020-12 meta-validation, so every
    later rule reads a well-formed schema; then Loom's own rules, top level before properties,
    and the whole-answer budgets last, since they assume every property is well-typed.
    """
    if not isinstance(doc, dict):
        raise _fail("not_object", "the profile schema must be a JSON object")
    depth, path = _deepest(doc)
    if depth > MAX_SCHEMA_DEPTH:
        raise _fail("too_deep", f"the profile schema nests {depth} levels, over "
                    f"{MAX_SCHEMA_DEPTH}", path)
    try:
        size = len(_canonical_bytes(doc))
    except (TypeError, ValueError) as exc:
        # NaN, Infinity or a value JSON cannot carry: not a schema anyone could have sent.
        raise _fail("malformed", f"the profile schema is not plain JSON: {exc}") from exc
    if size > MAX_SCHEMA_BYTES:
        raise _fail(
            "too_large",
            f"the profile schema is {size} bytes of canonical JSON, over {MAX_SCHEMA_BYTES}",
        )
    try:
        Draft202012Validator.check_schema(doc)
    except SchemaError as exc:
        field = exc.json_path.removeprefix("$").removeprefix(".") or None
        raise _fail("malformed", f"not a valid JSON Schema: {exc.message}", field) from exc

    if doc.get("type") != "object":
        raise _fail("not_object", 'the profile schema must have "type": "object"', "type")
    properties = doc.get("properties")
    if not isinstance(properties, dict):
        raise _fail("not_object", "the profile schema must have a properties object", "properties")
    if "required" in doc:
        raise _fail(
            "required_forbidden",
            "required is not allowed: every property is in every profile, null when unknown",
            "required",
        )
    if "additionalProperties" in doc and doc["additionalProperties"] is not False:
        raise _fail(
            "additional_properties",
            "additionalProperties may only be false",
            "additionalProperties",
        )
    for keyword in doc:
        if keyword not in _TOP_LEVEL_KEYWORDS:
            raise _fail(
                "unsupported_keyword", f"{keyword} is not supported in a profile schema", keyword
            )
    if not MIN_PROPERTIES <= len(properties) <= MAX_PROPERTIES:
        raise _fail(
            "property_count",
            f"a profile schema has {MIN_PROPERTIES} to {MAX_PROPERTIES} properties, "
            f"not {len(properties)}",
            "properties",
        )

    for name, prop in properties.items():
        _check_property(name, prop)

    values = answer_value_count(doc)
    if values > MAX_ANSWER_VALUES:
        raise _fail(
            "too_many_values",
            f"a full answer holds {values} values (one per property, maxItems per array, "
            f"{DEFAULT_ARRAY_ITEMS} for an array without maxItems), over {MAX_ANSWER_VALUES}",
            "properties",
        )
    estimate = output_cap_estimate(doc)
    if estimate > MAX_OUTPUT_CAP_TOKENS:
        raise _fail(
            "output_cap",
            f"a full answer is estimated at {estimate} tokens, over {MAX_OUTPUT_CAP_TOKENS}; "
            "lower maxLength or maxItems",
            "properties",
        )


def _check_property(name: str, prop: Any) -> None:
    field = f"properties.{name}"
    if not isinstance(prop, dict):
        raise _fail("property_type", "a property must be an object with a type", field)
    kind = prop.get("type")
    if not isinstance(kind, str) or kind not in PROPERTY_TYPES:
        raise _fail(
            "property_type",
            "type must be one of string, number, integer, boolean or array",
            f"{field}.type",
        )
    description = prop.get("description")
    if not isinstance(description, str) or not description.strip():
        # The description is what the model reads to know what to put there.
        raise _fail(
            "missing_description",
            "a property needs a non-empty description",
            f"{field}.description",
        )
    if kind == "array":
        _check_array(prop, field)
    else:
        _check_scalar(prop, kind, field)


def _check_array(prop: dict[str, Any], field: str) -> None:
    for keyword in prop:
        if keyword not in _ARRAY_KEYWORDS:
            raise _fail(
                "unsupported_keyword",
                f"{keyword} is not supported on an array (only items and maxItems)",
                f"{field}.{keyword}",
            )
    items = prop.get("items")
    items_field = f"{field}.items"
    if not isinstance(items, dict):
        raise _fail("array_items", "an array needs items with one scalar type", items_field)
    kind = items.get("type")
    if not isinstance(kind, str) or kind not in SCALAR_TYPES:
        raise _fail(
            "array_items",
            "items must have type string, number, integer or boolean",
            f"{items_field}.type",
        )
    if "maxItems" in prop:
        max_items = prop["maxItems"]
        if not _is_int(max_items) or not 0 <= max_items <= MAX_ARRAY_ITEMS:
            raise _fail(
                "max_items",
                f"maxItems must be an integer from 0 to {MAX_ARRAY_ITEMS}",
                f"{field}.maxItems",
            )
    _check_scalar(items, kind, items_field)


def _check_scalar(prop: dict[str, Any], kind: str, field: str) -> None:
    if kind == "string":
        _check_string(prop, field)
    elif kind in ("number", "integer"):
        _check_number(prop, field)
    else:
        for keyword in prop:
            if keyword not in _BOOLEAN_KEYWORDS:
                raise _fail(
                    "unsupported_keyword",
                    f"{keyword} is not supported on a boolean",
                    f"{field}.{keyword}",
                )


def _check_string(prop: dict[str, Any], field: str) -> None:
    for keyword in prop:
        if keyword not in _STRING_KEYWORDS:
            raise _fail(
                "string_constraint",
                f"{keyword} is not supported on a string "
                "(only enum, pattern, minLength and maxLength)",
                f"{field}.{keyword}",
            )
    if "enum" in prop:
        enum = prop["enum"]
        if not isinstance(enum, list) or not enum or not all(isinstance(v, str) for v in enum):
            raise _fail(
                "string_constraint", "enum must be a non-empty list of strings", f"{field}.enum"
            )
    for keyword in ("minLength", "maxLength"):
        if keyword in prop and (not _is_int(prop[keyword]) or prop[keyword] < 0):
            raise _fail(
                "string_constraint",
                f"{keyword} must be a non-negative integer",
                f"{field}.{keyword}",
            )
    if prop.get("minLength", 0) > prop.get("maxLength", math.inf):
        raise _fail("string_constraint", "minLength is above maxLength", f"{field}.minLength")
    if "pattern" in prop:
        pattern = prop["pattern"]
        if not isinstance(pattern, str):
            raise _fail("string_constraint", "pattern must be a string", f"{field}.pattern")
        try:
            # Answers are checked with Python's re, so that is the dialect that must accept it.
            re.compile(pattern)
        except re.error as exc:
            raise _fail(
                "malformed", f"pattern does not compile: {exc}", f"{field}.pattern"
            ) from exc


def _check_number(prop: dict[str, Any], field: str) -> None:
    for keyword in prop:
        if keyword not in _NUMBER_KEYWORDS:
            raise _fail(
                "number_constraint",
                f"{keyword} is not supported on a number (only minimum and maximum)",
                f"{field}.{keyword}",
            )
    for keyword in ("minimum", "maximum"):
        if keyword in prop and not _is_number(prop[keyword]):
            raise _fail(
                "number_constraint", f"{keyword} must be a finite number", f"{field}.{keyword}"
            )
    if prop.get("minimum", -math.inf) > prop.get("maximum", math.inf):
        raise _fail("number_constraint", "minimum is above maximum", f"{field}.minimum")


# --- the rules as JSON Schema ---------------------------------------------------------------


def _scalar_branches(description: dict[str, Any], required: list[str]) -> list[dict[str, Any]]:
    """A string, a number or integer, and a boolean property (or array item), each with the
    keywords its check takes and no other."""
    text = {"type": "string"}
    count = {"type": "integer", "minimum": 0}
    kinds: list[tuple[list[str], dict[str, Any]]] = [
        (["string"], {"enum": {"type": "array", "minItems": 1, "items": text},
                      "pattern": text, "minLength": count, "maxLength": count}),
        (["number", "integer"], {"minimum": {"type": "number"}, "maximum": {"type": "number"}}),
        (["boolean"], {}),
    ]
    return [
        {"type": "object", "required": required, "additionalProperties": False,
         "properties": {"type": {"type": "string", "enum": names}, "description": description,
                        "title": text, **keywords}}
        for names, keywords in kinds
    ]


def profile_schema_json_schema() -> dict[str, Any]:
    """A profile schema document as JSON Schema (OpenAPI 3.0 words): every rule of
    ``validate_profile_schema`` JSON Schema can state, the Draft 2020-12 meta-schema's on the
    keywords Loom takes included (``$id``'s pattern; ``$schema``'s and ``$id``'s formats are
    not checked without a URI library, so not stated either).

    What it cannot state (the size of the canonical JSON, a pattern that compiles, minLength
    at most maxLength and minimum at most maximum, a full answer's value count and output-cap
    estimate) ``profile_schema.set``'s request schema states as ``x-loom-rules``
    (``app.schemas.rules``); the validator stays the authority."""
    text = {"type": "string"}
    # What the model reads to know what to put there: a string str.strip() leaves non-empty.
    described = {"type": "string", "pattern": NOT_BLANK_PATTERN}
    array = {
        "type": "object",
        "required": ["type", "description", "items"],
        "additionalProperties": False,
        "properties": {
            "type": {"type": "string", "enum": ["array"]},
            "description": described,
            "title": text,
            "items": {"anyOf": _scalar_branches(text, ["type"])},
            "maxItems": {"type": "integer", "minimum": 0, "maximum": MAX_ARRAY_ITEMS},
        },
    }
    prop = {"anyOf": [*_scalar_branches(described, ["type", "description"]), array]}
    return {
        "type": "object",
        "required": ["type", "properties"],
        "additionalProperties": False,
        "properties": {
            "type": {"type": "string", "enum": ["object"]},
            "properties": {"type": "object", "minProperties": MIN_PROPERTIES,
                           "maxProperties": MAX_PROPERTIES, "additionalProperties": prop},
            "additionalProperties": {"type": "boolean", "enum": [False]},
            "title": text,
            "description": text,
            "$schema": text,
            "$id": {"type": "string", "pattern": "^[^#]*#?$"},
            "$comment": text,
        },
    }


# --- sizing a full answer --------------------------------------------------------------------


def _properties(doc: Mapping[str, Any]) -> dict[str, Any]:
    properties = doc.get("properties") if isinstance(doc, Mapping) else None
    return properties if isinstance(properties, dict) else {}


def _array_items(prop: Mapping[str, Any]) -> int:
    max_items = prop.get("maxItems")
    return max_items if _is_int(max_items) else DEFAULT_ARRAY_ITEMS


def answer_value_count(doc: Mapping[str, Any]) -> int:
    """Values in a full answer: one per property, maxItems per array (50 without maxItems)."""
    total = 0
    for prop in _properties(doc).values():
        if isinstance(prop, Mapping) and prop.get("type") == "array":
            total += _array_items(prop)
        else:
            total += 1
    return total


def _tokens(chars: int) -> int:
    return -(-chars // CHARS_PER_TOKEN)  # ceiling division


def _value_tokens(prop: Mapping[str, Any]) -> int:
    if prop.get("type") != "string":
        return SCALAR_TOKENS
    bounds: list[int] = []
    if _is_int(prop.get("maxLength")):
        bounds.append(prop["maxLength"])
    enum = prop.get("enum")
    if isinstance(enum, list) and enum:
        bounds.append(max(len(str(value)) for value in enum))
    if not bounds:
        return STRING_TOKENS_UNBOUNDED
    # With both, the smaller is the real bound: validate_answer enforces each of them.
    return _tokens(min(bounds))


def output_cap_estimate(doc: Mapping[str, Any]) -> int:
    """Tokens a full answer may take, by the seed's formula.

    How Loom reads the seed's formula, exactly:

    - Each property key costs ``ceil((len(key) + 4) / 2)`` tokens: the key's characters plus
      its two quotes, its colon and its comma, at two characters a token, rounded up per key.
    - Each value costs, per value (one for a scalar property; ``maxItems`` for an array, 50
      when it has none, each sized by the array's ``items``):

      - a string with ``maxLength`` and/or ``enum``: ``ceil(n / 2)`` where ``n`` is the
        ``maxLength`` or the length of the longest ``enum`` value (the smaller when both are
        given, since an answer is held to both);
      - a string with neither: 48 tokens;
      - a number, an integer or a boolean: 12 tokens.

    Nothing else is counted: the braces, brackets, string quotes and commas between array items
    are left to the base (``LLM_MAX_TOKENS``) that ``max_tokens_for`` adds. Lengths are in
    characters (Python ``len``). A document that fails ``validate_profile_schema`` still gets
    a best-effort number, but only a validated one means anything.
    """
    total = 0
    for name, prop in _properties(doc).items():
        total += _tokens(len(name) + KEY_PUNCTUATION_CHARS)
        if not isinstance(prop, Mapping):
            continue
        if prop.get("type") == "array":
            items = prop.get("items")
            item_schema = items if isinstance(items, Mapping) else {}
            total += _array_items(prop) * _value_tokens(item_schema)
        else:
            total += _value_tokens(prop)
    return total


def max_tokens_for(doc: Mapping[str, Any], base: int = DEFAULT_BASE_TOKENS) -> int:
    """The model's max_tokens for a full answer: the task's base plus the schema's estimate."""
    return base + output_cap_estimate(doc)


# --- identity of a schema --------------------------------------------------------------------


def _without_titles(prop: Any) -> Any:
    # Only the `title` keyword goes; a *property* named "title" is data and stays, which is why
    # this walks the schema's shape instead of dropping every "title" key it meets.
    if not isinstance(prop, dict):
        return prop
    stripped = {k: v for k, v in prop.items() if k != "title"}
    if "items" in stripped:
        stripped["items"] = _without_titles(stripped["items"])
    return stripped


def schema_sha256(doc: Mapping[str, Any]) -> str:
    """sha256 hex of the properties' canonical JSON with every title removed.

    Sorted keys make property order irrelevant, and titles are ignored by the rules, so neither
    a reorder nor a retitle makes built profiles stale. Descriptions count: the model reads them.
    """
    properties = {name: _without_titles(prop) for name, prop in _properties(doc).items()}
    return hashlib.sha256(_canonical_bytes(properties)).hexdigest()


# --- holding an answer to the schema ---------------------------------------------------------


def null_profile(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Every property of the schema, each null: what a user with no settled facts gets."""
    return {name: None for name in _properties(doc)}


def _check_string_value(prop: Mapping[str, Any], value: Any) -> Any:
    if not isinstance(value, str):
        return _INVALID
    if "enum" in prop and value not in prop["enum"]:
        return _INVALID
    # Lengths before the pattern: a value past maxLength never reaches the regex engine.
    if len(value) < prop.get("minLength", 0) or len(value) > prop.get("maxLength", math.inf):
        return _INVALID
    # JSON Schema patterns are unanchored, hence search rather than match.
    if "pattern" in prop:
        try:
            if re.search(prop["pattern"], value) is None:
                return _INVALID
        except (re.error, TypeError):
            # A stored schema from before a rule change: a pattern Loom cannot run proves nothing.
            return _INVALID
    return value


def _check_number_value(prop: Mapping[str, Any], value: Any, integer: bool) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _INVALID
    if isinstance(value, float):
        if not math.isfinite(value):
            return _INVALID
        if integer:
            # JSON Schema counts 3.0 as an integer; store it as one.
            if not value.is_integer():
                return _INVALID
            value = int(value)
    if isinstance(value, int) and abs(value) > MAX_SAFE_INTEGER:
        return _INVALID
    if value < prop.get("minimum", -math.inf) or value > prop.get("maximum", math.inf):
        return _INVALID
    return value


def _check_value(prop: Mapping[str, Any], value: Any) -> Any:
    kind = prop.get("type")
    if kind == "string":
        return _check_string_value(prop, value)
    if kind in ("number", "integer"):
        return _check_number_value(prop, value, integer=kind == "integer")
    if kind == "boolean":
        return value if isinstance(value, bool) else _INVALID
    return _INVALID


def _check_array_value(prop: Mapping[str, Any], value: Any) -> Any:
    if not isinstance(value, list) or len(value) > _array_items(prop):
        return _INVALID
    items = prop.get("items")
    item_schema = items if isinstance(items, Mapping) else {}
    checked = [_check_value(item_schema, item) for item in value]
    # One bad item drops the whole array: a filtered list would read as the complete answer
    # when the model said something else, and the seed drops a bad value, not part of it.
    if any(item is _INVALID for item in checked):
        return _INVALID
    return checked


def validate_answer(doc: Mapping[str, Any], answer: Any) -> dict[str, Any]:
    """The profile to store: every schema property, each value held to its schema or null.

    A value of the wrong type, outside its enum, pattern, length or range, a number that is not
    finite, an integer past 2^53 in magnitude, or a boolean where a number is expected becomes
    null. An array with any bad item or more items than its maxItems (50 without maxItems)
    becomes null as a whole. Keys the schema does not declare are dropped. An answer that is
    not an object gives the all-null profile. Properties keep the schema's order.
    """
    profile = null_profile(doc)
    if not isinstance(answer, Mapping):
        return profile
    for name, prop in _properties(doc).items():
        if name not in answer or answer[name] is None or not isinstance(prop, Mapping):
            continue
        if prop.get("type") == "array":
            checked = _check_array_value(prop, answer[name])
        else:
            checked = _check_value(prop, answer[name])
        profile[name] = None if checked is _INVALID else checked
    return profile
