"""Key building: the hash tag holds for any id, and distinct identities never share a key."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.store import keys

ids = st.text(min_size=1, max_size=12)


def _tag_of(key: str) -> str:
    # Redis Cluster hashes the text between the first '{' and the next '}'.
    start = key.index("{")
    return key[start + 1 : key.index("}", start)]


@given(ids, ids, ids)
def test_user_tag_is_one_tag_holding_all_three_components(org, namespace, user):
    tag = keys.user_tag(org, namespace, user)
    assert tag.count("{") == 1 and tag.count("}") == 1
    assert _tag_of(tag).count("/") == 2


@given(ids, ids, ids, ids, ids, ids)
def test_distinct_identities_get_distinct_scope_keys(a, b, c, d, e, f):
    one = keys.working_memory_scope(a, b, c, d, e, f)
    other = keys.working_memory_scope(b, a, c, d, e, f)
    assert (one == other) == (a == b)


def test_separators_in_ids_cannot_collide():
    assert keys.user_tag("a/b", "c") != keys.user_tag("a", "b/c")
    assert keys.working_memory_scope("o", "n", "u", "a:b", "-", "-") != keys.working_memory_scope(
        "o", "n", "u", "a", "b", "-"
    )
    assert keys.escape("%7B") != keys.escape("{")


def test_a_users_keys_share_one_slot():
    scope = keys.working_memory_scope("o", "n", "u-1", "bot", "s", "r")
    index = keys.working_memory_scopes("o", "n", "u-1")
    assert _tag_of(scope) == _tag_of(index)
