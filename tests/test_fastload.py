"""The fast argument loader answers exactly what marshmallow answers, for every op's schema."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from marshmallow import EXCLUDE, Schema, ValidationError, fields, validates_schema

from app.ops import load_ops
from app.schemas.fastload import compile_loader

SCHEMAS = sorted({declared.args for declared in load_ops()}, key=lambda c: c.__name__)

values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-5, max_value=20000),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=90),
    st.sampled_from(["xml", "markdown", "-", "scratchpad", "a\nb", "", "k" * 81]),
    st.lists(st.text(max_size=5), max_size=22),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _outcome(load, body):
    try:
        return ("ok", load(body))
    except ValidationError as error:
        return ("error", error.messages)


@pytest.mark.parametrize("schema_class", SCHEMAS, ids=lambda c: c.__name__)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_loader_matches_marshmallow(schema_class, data):
    schema = schema_class()
    names = [f.data_key or n for n, f in schema.load_fields.items()] + ["unknown_field"]
    body = data.draw(st.dictionaries(st.sampled_from(names), values, max_size=len(names)))
    fast = compile_loader(schema)
    assert _outcome(fast, body) == _outcome(
        lambda b: schema.load(b, unknown=EXCLUDE), body
    )


def test_the_working_memory_schemas_take_the_fast_path():
    from app.ops import working_memory as wm

    for schema_class in (wm.WorkingMemorySetArgs, wm.WorkingMemoryAppendArgs,
                         wm.WorkingMemoryKeyArgs, wm.WorkingMemoryRenderArgs):
        assert compile_loader(schema_class()).__name__ == "load", schema_class.__name__


def test_a_schema_hook_sends_the_schema_to_marshmallow():
    """The fast path reads marshmallow's private ``Schema._hooks``: if a marshmallow release
    keeps hooks elsewhere, this fails instead of a hook being skipped in silence."""

    class WithHook(Schema):
        name = fields.String()

        @validates_schema
        def _check(self, data, **kwargs):
            raise ValidationError("never")

    assert compile_loader(WithHook()).__name__ == "slow"
    with pytest.raises(ValidationError):
        compile_loader(WithHook())({"name": "x"})


def test_a_field_with_its_own_conversion_goes_to_marshmallow():
    """The fast path compares ``type(field)._deserialize`` with ``fields.String``'s own."""

    class Upper(fields.String):
        def _deserialize(self, value, attr, data, **kwargs):
            return super()._deserialize(value, attr, data, **kwargs).upper()

    class Shouting(Schema):
        word = Upper()

    assert compile_loader(Shouting()).__name__ == "slow"
    assert compile_loader(Shouting())({"word": "hi"}) == {"word": "HI"}
