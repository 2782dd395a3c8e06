"""Fields and base schemas every op shares.

``IdentityArgs`` carries the identity tuple of the wire conventions; plane schemas subclass it.
``StrictInt``, ``StrictBool`` and ``Text`` refuse the coercions marshmallow allows by default
(``"12"`` as an int, ``true`` as 1, ``0`` as false), so a wrong type anywhere is a 422 naming
the field.
"""

from __future__ import annotations

import re
from datetime import UTC
from functools import cache
from typing import Any

from marshmallow import EXCLUDE, INCLUDE, Schema, ValidationError, fields, validate

IDENTITY_FIELDS = ("org", "namespace", "agent", "user_id", "session_id", "run_id")
IDENTITY_MAX_LENGTH = 256


class StrictInt(fields.Integer):
    """An integer that must arrive as a JSON integer (no strings, floats or booleans: a strict
    ``Integer`` refuses booleans too)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(strict=True, **kwargs)


class StrictBool(fields.Boolean):
    """A boolean that must arrive as JSON true or false (not 0, 1 or "yes")."""

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> Any:
        if not isinstance(value, bool):
            raise self.make_error("invalid")
        return value


class StrictFloat(fields.Float):
    """A finite number that must arrive as a JSON number."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_nan=False, **kwargs)

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.make_error("invalid")
        return super()._deserialize(value, attr, data, **kwargs)


# no_control_characters as the OpenAPI document states it (app.schemas.openapi).
CONTROL_FREE_PATTERN = r"^[^\x00-\x1f\x7f]*$"
_CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f]")


def no_control_characters(value: str) -> None:
    if _CONTROL_CHARACTER.search(value):
        raise ValidationError("must not contain control characters")


class PlainText(fields.String):
    """A string field that converts exactly as ``fields.String`` does and adds validators
    only: a subclass must not change the conversion (``app.schemas.fastload`` checks such a
    field itself, by its validators)."""


class IdentityText(PlainText):
    """An identity component: 1 to 256 characters, no control characters."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            validate=[validate.Length(min=1, max=IDENTITY_MAX_LENGTH), no_control_characters],
            **kwargs,
        )


class IdentityArgs(Schema):
    """The identity tuple. org, namespace and agent are required, but a token may fill them,
    so a missing one is reported after the token is read (IDENTITY_INCOMPLETE)."""

    class Meta:
        # Unknown input fields are accepted and named in the answer's ignored_args, so the
        # OpenAPI document must not declare additionalProperties: false.
        unknown = EXCLUDE

    org = IdentityText(load_default=None, metadata={"description": "The tenant."})
    namespace = IdentityText(
        load_default=None, metadata={"description": (
            "The namespace the op reads or writes. Required (422 IDENTITY_INCOMPLETE when "
            "missing) unless the caller's token fixes it, and always with auth off.")}
    )
    agent = IdentityText(
        load_default=None, metadata={"description": (
            "The writing or reading agent. Required like namespace, for the ops that act "
            "as an agent.")}
    )
    user_id = IdentityText(
        load_default="-", metadata={"description": "The end user; '-' for none."}
    )
    session_id = IdentityText(
        load_default="-", metadata={"description": "The session or conversation; '-' for none."}
    )
    run_id = IdentityText(
        load_default="-", metadata={"description": "The agent run (task scope); '-' for none."}
    )


@cache
def null_means_absent(schema_class: type[Schema]) -> frozenset[str]:
    """The input keys of ``schema_class`` for which a JSON null reads as the key left out.

    A strict-mode tool client sends every argument, null for the ones it leaves out. An
    optional field that refuses null (it has a default of its own: ``session_id`` is '-',
    ``tags`` is []) takes that null as absent. A field that accepts null keeps it, since there
    null is a value (agent state's ``if_version`` and ``subject``); a required field keeps it
    too, and its 422 names it.
    """
    return frozenset(
        field.data_key or name
        for name, field in schema_class().load_fields.items()
        if not field.required and not field.allow_none
    )


def without_absent_nulls(schema_class: type[Schema], body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without the nulls that mean "left out" (``null_means_absent``)."""
    if None not in body.values():
        return body  # the common case costs one scan
    absent = null_means_absent(schema_class)
    return {key: value for key, value in body.items() if value is not None or key not in absent}


class VersionText(fields.String):
    """The ``<name>_text`` an answer carries beside each integer ``version`` or ``*_version``
    field: the same number as decimal text. Loom's versions are nanosecond instants, above
    2^53, where a JSON number read as a double (JavaScript's ``JSON.parse``) is not exact;
    a small counter carries it too, so a client reads every version one way. Every answer
    schema declares it (``tests/test_answer_contract.py``) and, with ``LOOM_VALIDATE_ANSWERS``
    on, every answer that carries the version carries its text (``app.schemas.contract``)."""

    def __init__(self, **kwargs: Any) -> None:
        metadata = {"description": "The version beside it as decimal text: exact in every "
                    "JSON reader.", **kwargs.pop("metadata", {})}
        super().__init__(metadata=metadata, **kwargs)


def is_version_field(name: str) -> bool:
    """Whether an integer answer field named ``name`` is a version (and so needs its text)."""
    return name == "version" or name.endswith("_version")


class Answer(Schema):
    """Every answer lists the input fields it did not use."""

    ignored_args = fields.List(
        fields.String(), metadata={"description": "Input fields the op did not use."}
    )


class ErrorDetail(Schema):
    """The error's code and message, then the details of that code (``fields``, ``field``,
    ``retry_after``, ``erasure_id``, ...): open to further properties."""

    class Meta:
        unknown = INCLUDE

    code = fields.String(required=True)
    message = fields.String(required=True)


class ErrorAnswer(Schema):
    error = fields.Nested(ErrorDetail, required=True)


def _moment_pattern(from_epoch: bool) -> str:
    """An RFC 3339 date-time as the ops read it, as one regular expression: a real calendar
    date from year 1, ``T``, a time to the second (fraction optional), then ``Z``, an offset or
    neither (a time with no offset is UTC, as ``datetime.isoformat()`` writes a naive one); with
    ``from_epoch``, a date written from 1970-01-01 on, and no instant before
    1970-01-01T00:00:00Z."""
    leap = r"(?:\d\d(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
    day_of = {31: r"(?:0[1-9]|[12]\d|3[01])", 30: r"(?:0[1-9]|[12]\d|30)",
              28: r"(?:0[1-9]|1\d|2[0-8])"}
    after_january = (rf"(?:(?:0[3578]|1[02])-{day_of[31]}|(?:0[469]|11)-{day_of[30]}"
                     rf"|02-{day_of[28]})")
    month_day = rf"(?:01-{day_of[31]}|{after_january})"
    clock = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d+)?"
    offset = r"(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)?"
    if not from_epoch:
        year = r"(?:000[1-9]|00[1-9]\d|0[1-9]\d\d|[1-9]\d{3})"  # datetime starts at year 1
        date = rf"(?:{year}-{month_day}|{leap}-02-29)"
        return rf"^{date}T{clock}{offset}$"
    # 1971 on, or 1970 from 2 January (no offset reaches back past a whole day) ...
    leap_since = (r"(?:19(?:7[26]|8[048]|9[26])|[2-9]\d(?:0[48]|[2468][048]|[13579][26])"
                  r"|(?:[2468][048]|[3579][26])00)")
    later = (rf"(?:(?:197[1-9]|19[89]\d|[2-9]\d{{3}})-{month_day}|{leap_since}-02-29"
             rf"|1970-(?:{after_january}|01-(?:0[2-9]|[12]\d|3[01])))"
             rf"T{clock}{offset}")
    # ... or 1 January 1970 at UTC or west of it, or east of it at a clock hour past the
    # offset's (an offset's own hour with minutes to spare is refused: the one case it
    # leaves out for a pattern of this size).
    east = "|".join(
        rf"(?:{'|'.join(f'{hour:02d}' for hour in range(offset_hour + 1, 24))})"
        rf":[0-5]\d:[0-5]\d(?:\.\d+)?\+{offset_hour:02d}:[0-5]\d"
        for offset_hour in range(23))
    first_day = (rf"1970-01-01T(?:{clock}(?:Z|-(?:[01]\d|2[0-3]):[0-5]\d|\+00:00)?|{east})")
    return rf"^(?:{later}|{first_day})$"


MOMENT_PATTERN = _moment_pattern(from_epoch=False)
EPOCH_MOMENT_PATTERN = _moment_pattern(from_epoch=True)


class Moment(fields.AwareDateTime):
    """An instant as an RFC 3339 date-time with its offset (``Z`` or ``+hh:mm``) or none (then
    UTC: plain Python's ``isoformat()`` of a naive datetime), held to the pattern the OpenAPI
    document gives it, so the document and the op accept the same text.
    ``from_epoch`` refuses an instant before 1970-01-01 (a time stored as nanoseconds since)."""

    def __init__(self, *, from_epoch: bool = False, **kwargs: Any) -> None:
        pattern = EPOCH_MOMENT_PATTERN if from_epoch else MOMENT_PATTERN
        error = ("must be an RFC 3339 date-time (no offset reads as UTC), from 1970-01-01"
                 if from_epoch else "must be an RFC 3339 date-time (no offset reads as UTC)")
        metadata = {**kwargs.pop("metadata", {}), "pattern": pattern}
        validators = [validate.Regexp(pattern, error=error)]
        super().__init__(format="iso", default_timezone=UTC, metadata=metadata, **kwargs)
        self._text_check = validators[0]

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> Any:
        if isinstance(value, str):
            self._text_check(value)
        return super()._deserialize(value, attr, data, **kwargs)
