"""A store written by the earlier row layout (every field stored, the current version kept twice,
one pointer key per memory_id) reads the same before, during and after the release step moves
it; the moved store answers history, revert, delete_version, redact, export and erasure as a
store written by this layout does, and a second run of the step writes nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.release import memory_layout_step, run_release
from app.store import keys
from app.store.memory_row import ROW_DEFAULTS, Location, pad_version
from tests.test_erasure import NS, ORG, OTHER, PLANTED, USER, everything, make_world, plant

MARK = "MARK-LAYOUT"


@pytest.fixture
def world(redis_url, tmp_path, model):
    return make_world(redis_url, tmp_path, model)


def rows_of(redis: Any, user: str) -> list[Location]:
    members = redis.zrange(keys.memory_keys(ORG, NS, user), 0, -1)
    return [Location.from_member(ORG, NS, user, m) for m in members]


def back_to_the_earlier_layout(redis: Any, user: str, only: str | None = None) -> None:
    """Rewrite the user's rows (``only``: the row of that key) as the earlier layout left
    them: every field stored, each snapshot with every field, the current version among the
    snapshots, and each memory_id's pointer a string key of its own."""
    pointers = keys.memory_pointers(ORG, NS)
    for location in rows_of(redis, user):
        if only is not None and location.key != only:
            continue
        row_key, versions = location.row_key(), keys.memory_versions(*location.parts())
        row = {**ROW_DEFAULTS, **redis.hgetall(row_key)}
        redis.hset(row_key, mapping=row)
        for padded, raw in redis.hgetall(versions).items():
            redis.hset(versions, padded, json.dumps({**ROW_DEFAULTS, **json.loads(raw)}))
        redis.hset(versions, pad_version(row["version"]), json.dumps(row))
        value = redis.hget(pointers, row["memory_id"])
        if value is not None:
            redis.set(keys.memory_pointer(ORG, NS, row["memory_id"]), value)
            redis.hdel(pointers, row["memory_id"])


def on_this_layout(redis: Any, user: str) -> None:
    for location in rows_of(redis, user):
        row = redis.hgetall(location.row_key())
        assert {k: v for k, v in row.items() if ROW_DEFAULTS.get(k) == v} == {}, location
        stored = redis.hgetall(keys.memory_versions(*location.parts()))
        assert pad_version(row["version"]) not in stored
        for raw in stored.values():
            snapshot = json.loads(raw)
            assert {k: v for k, v in snapshot.items() if ROW_DEFAULTS.get(k) == v} == {}
        assert redis.hget(keys.memory_pointers(ORG, NS), row["memory_id"]) is not None
        assert redis.get(keys.memory_pointer(ORG, NS, row["memory_id"])) is None


def reads(world: Any, user: str) -> dict[str, Any]:
    """What a caller reads back of the user's rows: the export (every row, tombstones too, with
    its versions), each row by id and its history, a search, the rendered profile."""
    package = world.post("subject.export", user_id=user)
    # When it was read, and who read the profile (this function's own render among them).
    package.pop("exported_at")
    package.pop("profile_reads")
    package["counts"].pop("activity_entries")
    ids = [row["memory_id"] for row in [*package["memory_rows"], *package["profile_sections"]]]
    return {
        "export": package,
        "get": [world.post("memory.get", user_id=user, memory_id=mid) for mid in ids],
        "history": [world.post("memory.history", user_id=user, memory_id=mid, limit=50)
                    for mid in ids],
        "search": world.post("memory.search", user_id=user, query="Samuel Berlin ticket"),
        "render": world.post("profile.render", user_id=user)["rendered"],
    }


def test_a_store_of_the_earlier_layout_reads_the_same_and_moves_once(world, redis_url):
    plant(world, USER, MARK)
    plant(world, OTHER, "MARK-OTHER")
    redis = world.services.redis
    before, other = reads(world, USER), reads(world, OTHER)
    assert len(before["history"][0]["versions"]) >= 1
    back_to_the_earlier_layout(redis, USER)
    back_to_the_earlier_layout(redis, OTHER)
    assert redis.exists(keys.memory_pointer(ORG, NS, before["get"][0]["memory"]["memory_id"]))
    # Read in the earlier form, before the move: the same answers.
    assert reads(world, USER) == before

    said: list[str] = []
    # The release a platform runs while the earlier version serves leaves the rows as they
    # are: an earlier-version process could not read the moved form.
    run_release(world.services, said.append)
    assert not any("memory layout" in line for line in said), said
    assert redis.exists(keys.memory_pointer(ORG, NS, before["get"][0]["memory"]["memory_id"]))
    assert reads(world, USER) == before
    # The contract run, after the deploy, moves them.
    run_release(world.services, said.append, contract=True)
    assert any("memory layout:" in line and "0 rows" not in line for line in said), said
    on_this_layout(redis, USER)
    on_this_layout(redis, OTHER)
    assert reads(world, USER) == before and reads(world, OTHER) == other

    # A process of the earlier version writes one row in its form during the move: read the
    # same, and the next run moves that row alone.
    back_to_the_earlier_layout(redis, USER, only="tz")
    assert reads(world, USER) == before
    again = memory_layout_step(world.services, said.append)
    assert again.changed == 2  # the row, and its pointer
    on_this_layout(redis, USER)
    moved = everything(redis_url)
    assert memory_layout_step(world.services, said.append).changed == 0
    assert everything(redis_url) == moved


def test_the_moved_store_writes_and_erases_as_this_layout(world):
    plant(world, USER, MARK)
    redis = world.services.redis
    back_to_the_earlier_layout(redis, USER)
    # A write over a row of the earlier form: it keeps every version once.
    world.fact("name", f"{MARK} call me Sammy", USER)
    history = world.post("memory.history", user_id=USER, key="name")["versions"]
    assert [v["value"] for v in history] == [
        f"{MARK} call me Sammy", f"{MARK} call me Samuel", f"{MARK} call me Sam"]
    # A redact of a row still in the earlier form counts its one version once.
    assert world.post("memory.redact", user_id=USER, key="tz")["versions_redacted"] == 1
    memory_layout_step(world.services, lambda _line: None)
    on_this_layout(redis, USER)

    def current() -> dict[str, Any]:
        return world.post("memory.get", user_id=USER, key="name")["memory"]

    oldest = history[-1]["version"]
    reverted = world.post("memory.revert", user_id=USER, key="name", version=oldest)
    assert current()["value"] == f"{MARK} call me Sam"
    assert current()["from_version"] == oldest
    # The current version, which lives in the row only, can be deleted as any other.
    world.post("memory.delete_version", user_id=USER, key="name", version=reverted["version"])
    after = world.post("memory.history", user_id=USER, key="name", limit=50)["versions"]
    assert reverted["version"] not in [v["version"] for v in after]
    assert after[0]["change"] == "delete_version"
    assert after[0]["value"] == f"{MARK} call me Sammy"
    world.post("memory.delete", user_id=USER, key="name")
    world.post("memory.restore", user_id=USER, key="name")
    assert current()["value"] == f"{MARK} call me Sammy"
    redacted = world.post("memory.redact", user_id=USER, key="name")
    assert redacted["versions_redacted"] == len(
        world.post("memory.history", user_id=USER, key="name", limit=50)["versions"])

    package = world.post("subject.export", user_id=USER)
    names = {row["key"]: row for row in package["memory_rows"]}
    assert [v["version"] for v in names["name"]["versions"]] == sorted(
        v["version"] for v in world.post("memory.history", user_id=USER, key="name",
                                          limit=50)["versions"])
    versions = package["counts"]["memory_versions"]
    receipt = world.erase()
    assert receipt["status"] == "done", receipt
    assert receipt["counts"]["memory_versions"] == versions > PLANTED["memory_versions"]
    assert redis.hlen(keys.memory_pointers(ORG, NS)) == 0
    assert list(redis.scan_iter(match=keys.memory_pointer_pattern(ORG, NS))) == []


def test_an_erasure_removes_pointers_of_both_layouts(world):
    plant(world, USER, MARK)
    plant(world, OTHER, "MARK-OTHER")
    redis = world.services.redis
    back_to_the_earlier_layout(redis, USER, only="tz")
    receipt = world.erase()
    assert receipt["status"] == "done", receipt
    assert receipt["counts"]["memory_versions"] == PLANTED["memory_versions"]
    left = redis.hgetall(keys.memory_pointers(ORG, NS))
    assert left and all(json.loads(value)[0] == OTHER for value in left.values())
    assert list(redis.scan_iter(match=keys.memory_pointer_pattern(ORG, NS))) == []
