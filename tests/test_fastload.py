"""The fast argument loader answers exactly what marshmallow answers, for every op's schema."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from marshmallow import (
    EXCLUDE,
    Schema,
    ValidationError,
    fields,
    post_load,
    validate,
    validates_schema,
)

from app.ops import load_ops
from app.schemas.common import PlainText, StrictInt
from app.schemas.fastload import compile_loader, fast_load

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


def test_the_profile_write_schemas_take_the_fast_path():
    from app.ops import profile

    for schema_class in (profile.ProfileSetArgs, profile.ProfileAppendArgs,
                         profile.ProfileRenderArgs):
        assert compile_loader(schema_class()).__name__ == "load", schema_class.__name__


def test_a_schema_not_declared_fast_is_loaded_by_marshmallow_with_its_hooks():
    class WithHook(Schema):
        name = fields.String()

        @validates_schema
        def _check(self, data, **kwargs):
            raise ValidationError("never")

    assert compile_loader(WithHook()).__name__ == "slow"
    with pytest.raises(ValidationError):
        compile_loader(WithHook())({"name": "x"})


def test_a_subclass_of_a_fast_schema_opts_in_on_its_own():
    """A subclass may add a hook: the declaration of its parent does not speak for it."""

    @fast_load
    class Plain(Schema):
        name = fields.String()

    class Shouting(Plain):
        @post_load
        def _upper(self, data, **kwargs):
            return {name: value.upper() for name, value in data.items()}

    assert compile_loader(Plain()).__name__ == "load"
    assert compile_loader(Shouting()).__name__ == "slow"
    assert compile_loader(Shouting())({"name": "hi"}) == {"name": "HI"}


def test_a_fast_schema_with_a_field_of_its_own_conversion_is_refused_at_compile():
    class Upper(fields.String):
        def _deserialize(self, value, attr, data, **kwargs):
            return super()._deserialize(value, attr, data, **kwargs).upper()

    @fast_load
    class Shouting(Schema):
        word = Upper()

    with pytest.raises(TypeError, match="word"):
        compile_loader(Shouting())


def test_plain_text_validators_still_refuse_on_the_fast_path():
    @fast_load
    class Named(Schema):
        name = PlainText(required=True, validate=validate.Length(max=3))
        count = StrictInt(load_default=1)

    load = compile_loader(Named())
    assert load({"name": "abc"}) == {"name": "abc", "count": 1}
    with pytest.raises(ValidationError) as refused:
        load({"name": "abcd", "count": True})
    assert set(refused.value.messages) == {"name", "count"}
