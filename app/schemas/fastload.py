"""A fast path for loading op arguments, with marshmallow as the authority.

marshmallow's ``Schema.load`` costs ~25 µs per request for the small flat schemas ops use,
a quarter of Loom's own time on the working-memory hot path. A schema class opts in at its
declaration with ``@fast_load``, which says: no schema hooks (``pre_load``,
``validates_schema``, ...), and only plain fields: ``fields.String`` or a ``PlainText``
(a String that adds validators only), ``StrictInt``, and lists of those strings. For such a
schema ``compile_loader`` builds a loop that checks types, runs the fields' own validators
and fills defaults; anything it is not sure of (a wrong type, a failed validator, a missing
required field) goes to ``Schema.load``, so every answer and every 422 message is
marshmallow's. Every other schema is loaded by ``Schema.load`` alone. Only marshmallow's
public API is used: the field objects' declared options and validators.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

from marshmallow import EXCLUDE, Schema, ValidationError, fields, missing, validate

from app.schemas.common import _CONTROL_CHARACTER, PlainText, StrictInt, no_control_characters

Loader = Callable[[dict[str, Any]], dict[str, Any]]
SchemaT = TypeVar("SchemaT", bound=type[Schema])

# The schema classes declared with ``@fast_load`` (exactly these: a subclass opts in itself).
_FAST_SCHEMAS: set[type[Schema]] = set()


def fast_load(schema_class: SchemaT) -> SchemaT:
    """Declare that ``schema_class`` has no hooks and only plain fields (see the module)."""
    _FAST_SCHEMAS.add(schema_class)
    return schema_class


class _Slow(Exception):
    """This body needs marshmallow (it will answer or explain the 422)."""


def _kind(field: fields.Field) -> str | None:
    if type(field) is StrictInt:
        return "int"
    if type(field) is fields.String or isinstance(field, PlainText):
        return "str"
    if type(field) is fields.List and _kind(field.inner) == "str":
        return "list"
    return None


_NO_LIMIT = sys.maxsize


def _string_checks(
    validators: list[Any],
) -> tuple[tuple[int, int] | None, bool, tuple[Any, ...]]:
    """A string field's validators as (length bounds, control-free, the rest): the two that
    identity fields carry become a comparison and a regex search in the loop, not two calls
    each. A failed check still goes to marshmallow, which runs every validator itself."""
    bounds = None
    control_free = False
    rest = []
    for check in validators:
        if type(check) is validate.Length and check.equal is None and bounds is None:
            bounds = (
                0 if check.min is None else check.min,
                _NO_LIMIT if check.max is None else check.max,
            )
        elif check is no_control_characters:
            control_free = True
        else:
            rest.append(check)
    return bounds, control_free, tuple(rest)


def compile_loader(schema: Schema) -> Loader:
    def slow(body: dict[str, Any]) -> dict[str, Any]:
        return schema.load(body, unknown=EXCLUDE)

    if type(schema) not in _FAST_SCHEMAS:
        return slow
    plan = []
    for name, field in schema.load_fields.items():
        kind = _kind(field)
        if kind is None:
            raise TypeError(f"{type(schema).__name__} is declared @fast_load but its field "
                            f"{name!r} ({type(field).__name__}) is not a plain field")
        inner = field.inner.validators if isinstance(field, fields.List) else ()
        if kind == "str":
            bounds, control_free, validators = _string_checks(field.validators)
        else:
            bounds, control_free, validators = None, False, tuple(field.validators)
        plan.append(
            (field.data_key or name, name, kind, field.required, field.load_default,
             field.allow_none, bounds, control_free, validators, tuple(inner))
        )

    def fast(body: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for (key, name, kind, required, default, allow_none, bounds, control_free,
             validators, inner) in plan:
            if key not in body:
                if required:
                    raise _Slow
                if default is not missing:
                    out[name] = default() if callable(default) else default
                continue
            value = body[key]
            if value is None:
                if not allow_none:
                    raise _Slow
                out[name] = None
                continue
            if kind == "str":
                if type(value) is not str:
                    raise _Slow
                if bounds is not None and not bounds[0] <= len(value) <= bounds[1]:
                    raise _Slow
                # A printable string holds no control character (they are all unprintable):
                # one C call, and the regex only for a string with some unprintable one.
                if control_free and not value.isprintable() and _CONTROL_CHARACTER.search(
                        value):
                    raise _Slow
            elif kind == "int":
                if type(value) is not int:
                    raise _Slow
            else:
                if type(value) is not list or any(type(item) is not str for item in value):
                    raise _Slow
                for item in value:
                    for check in inner:
                        if check(item) is False:
                            raise _Slow
                value = list(value)
            for check in validators:
                if check(value) is False:
                    raise _Slow
            out[name] = value
        return out

    def load(body: dict[str, Any]) -> dict[str, Any]:
        try:
            return fast(body)
        except (_Slow, ValidationError):
            return slow(body)

    return load
