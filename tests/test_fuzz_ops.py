"""Any body, to any op: a clear 4xx or an answer, never a 500."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.ops import load_ops

OPS = [declared for declared in load_ops()]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40),
    st.sampled_from(["", "-", "*", "xml", "cas", "merge_by_key", "conversation", "subject",
                     "2027-01-01T00:00:00Z", "{a/b}", "a:b", "%7B", "u-1", "admin"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=8,
)


@pytest.fixture(scope="module")
def fuzz_client(redis_server_url, tmp_path_factory):
    from tests.conftest import make_app

    client = make_app(redis_server_url, tmp_path_factory.mktemp("fuzz")).test_client()
    # Turn the optional planes on, so their deeper paths are fuzzed too.
    registry = {declared.name: declared for declared in OPS}
    for name in ("features.set", "object_types.set", "profile_schema.set"):
        example = {**registry[name].example, "namespace": "fuzz"}
        if name == "features.set":
            example["features"] = {**example.get("features", {}), "agent_state": True}
        assert client.post(f"/v1/{name}", json=example).status_code == 200, name
    return client


@pytest.mark.parametrize("declared", OPS, ids=lambda d: d.name)
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_no_body_makes_a_500(fuzz_client, declared, data):
    names = sorted(declared.args().load_fields) + ["unexpected"]
    body = data.draw(st.dictionaries(st.sampled_from(names), values, max_size=len(names)))
    body.setdefault("namespace", "fuzz")
    body.setdefault("agent", "fuzzer")
    # Half the time start from the op's valid example, so deeper code paths are reached too.
    if declared.example and data.draw(st.booleans()):
        body = {**declared.example, **{k: v for k, v in body.items() if k not in ("org",)},
                "namespace": "fuzz"}
    path = declared.http_path
    for name in re.findall(r"<(?:\w+:)?(\w+)>", path):
        path = re.sub(rf"<(?:\w+:)?{name}>", "fuzz-subject", path)
    if declared.http_method == "GET":
        response = fuzz_client.get(path, query_string={k: str(v) for k, v in body.items()})
    else:
        response = fuzz_client.open(path, method=declared.http_method, json=body)
    assert response.status_code < 500, (declared.name, body, response.get_json())
    assert response.is_json
