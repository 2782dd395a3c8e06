"""memory.redact reaches the profile versions derived from the fact (seed 000, Erasure).

A profile version is derived from a fact when its source_trace names the fact's memory_id as a
whole ``:``/``,``-separated token (``profile.fold:<label>:<id>,<id>``, as the structured worker
writes it). Redacting the fact scrubs every such version, is refused whole while one of those
profile rows is locked, and reaches the same keys when retried. A version whose trace names no
memory id (``profile.fold:<label>`` alone) is not reached: it keeps its text until the user is
erased.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.test_erasure import NS, OTHER, USER, World, answer, make_world

FOLD = "profile.fold:persona"


@pytest.fixture
def world(redis_url, tmp_path, model):
    return make_world(redis_url, tmp_path, model)


def value_of(world: World, key: str, agent: str = "chat") -> Any:
    return world.post("memory.get", user_id=USER, key=key, agent=agent)["memory"]["value"]


def versions(world: World, key: str, user: str = USER, agent: str = "chat") -> list[dict]:
    return world.post("memory.history", user_id=user, key=key, agent=agent,
                      limit=100)["versions"]


def section(world: World, label: str, value: str, trace: str, user: str = USER) -> None:
    world.post("profile.set", user_id=user, label=label, value=value, source_trace=trace)


def redact(world: World, key: str, user: str = USER):
    return world.call("memory.redact", user_id=user, key=key)


def test_the_structured_profile_versions_built_from_the_fact_are_scrubbed(world, model):
    world.fact("name", "Call me Sam", USER)
    world.fact("tz", "Lives in Berlin", USER)
    model.script(answer(preferred_name="Sam", timezone="Europe/Berlin"))
    world.run_pass()
    lang = world.fact("lang", "Speaks Basque", USER)["memory_id"]
    world.clock.advance(601)
    model.script(answer(preferred_name="Sam-Basque", timezone="Europe/Berlin"))
    world.run_pass()
    built = versions(world, "structured_profile", agent="-")
    assert [v["value"]["preferred_name"] for v in built] == ["Sam-Basque", "Sam"]

    status, out = redact(world, "lang")
    assert status == 200 and out["redacted"] is True

    newer, older = versions(world, "structured_profile", agent="-")
    assert newer["value"] is None and newer["redacted"] is True
    assert newer["content_sha256"] == "" and lang in newer["source_trace"]  # trace kept
    assert older["value"]["preferred_name"] == "Sam"  # built before the fact existed
    assert lang not in older["source_trace"]
    row = world.post("memory.get", user_id=USER, key="structured_profile", agent="-")["memory"]
    assert row["value"] is None and row["redacted"] is True
    # The profile reads as not built: the next build starts from the remaining facts.
    assert world.post("profile.structured", user_id=USER)["status"] == "pending"


def test_sections_are_reached_by_their_trace_only(world):
    fact = world.fact("name", "Call me Sam", USER)
    mid = fact["memory_id"]
    section(world, "persona", "Sam, from the fact", f"{FOLD}:{mid}")
    section(world, "persona", "Sam again, from two facts", f"{FOLD}:mem_0000000000000000,{mid}")
    section(world, "untraced", "Sam, no ids recorded", FOLD)
    section(world, "longer", "Sam, a longer id", f"{FOLD}:{mid}x")
    section(world, "elsewhere", "Sam, traced elsewhere", f"{FOLD}:{mid}", user=OTHER)
    world.fact("copy", "Sam, a fact", USER, source_trace=f"{FOLD}:{mid}")

    status, _ = redact(world, "name")
    assert status == 200

    assert [v["value"] for v in versions(world, "persona")] == [None, None]
    render = world.post("profile.render", user_id=USER, read_scope="own_user")["rendered"]
    assert "from the fact" not in render and "two facts" not in render
    # Not reached: a trace naming no memory id (the seed's rule), a longer token, another
    # user's slot, a row that is no profile.
    assert versions(world, "untraced")[0]["value"] == "Sam, no ids recorded"
    assert versions(world, "longer")[0]["value"] == "Sam, a longer id"
    assert versions(world, "elsewhere", user=OTHER)[0]["value"] == "Sam, traced elsewhere"
    assert versions(world, "copy")[0]["value"] == "Sam, a fact"


def test_a_locked_profile_refuses_the_redact_and_a_retry_reaches_the_same_keys(world):
    mid = world.fact("name", "Call me Sam", USER)["memory_id"]
    section(world, "persona", "Sam v1", f"{FOLD}:{mid}")
    section(world, "persona", "Sam v2", f"{FOLD}:{mid}")
    world.post("memory.lock", user_id=USER, key="persona")

    status, out = redact(world, "name")
    assert status == 409 and out["error"]["code"] == "MEMORY_LOCKED"
    assert out["error"]["key"] == "persona"
    # Nothing moved: the fact and the section keep their text.
    assert value_of(world, "name") == "Call me Sam"
    assert [v["value"] for v in versions(world, "persona")] == ["Sam v2", "Sam v2", "Sam v1"]

    world.post("memory.unlock", user_id=USER, key="persona")
    status, _ = redact(world, "name")
    assert status == 200
    reached = versions(world, "persona")  # lock and unlock wrote versions too
    assert [v["value"] for v in reached] == [None, None, None, None]
    # A retry reaches the same keys and changes nothing else: no version is added.
    status, out = redact(world, "name")
    assert status == 200 and out["versions_redacted"] == 1
    assert versions(world, "persona") == reached


def test_redacting_the_fact_by_memory_id_reaches_the_same(world):
    mid = world.fact("name", "Call me Sam", USER)["memory_id"]
    section(world, "persona", "Sam", f"{FOLD}:{mid}")
    status, _ = world.call("memory.redact", memory_id=mid)
    assert status == 200
    assert versions(world, "persona")[0]["value"] is None


def test_a_redact_racing_lock_and_unlock_is_all_or_nothing(world):
    """A locker toggles the derived section's lock while the fact is redacted: each redact is
    either refused with nothing scrubbed, or scrubs the fact and the section together."""
    outcomes: dict[str, int] = {}
    for trial in range(12):
        key, label = f"fact-{trial}", f"persona-{trial}"
        mid = world.fact(key, f"text {trial}", USER)["memory_id"]
        section(world, label, f"derived {trial}", f"{FOLD}:{mid}")
        start = threading.Barrier(2)
        result: dict[str, Any] = {}

        def locker(label: str = label, start: threading.Barrier = start) -> None:
            client = world.app.test_client()
            start.wait()
            for i in range(6):
                op = "memory.lock" if i % 2 == 0 else "memory.unlock"
                client.post(f"/v1/{op}", json={"namespace": NS, "agent": "chat",
                                               "user_id": USER, "key": label})

        def redactor(key: str = key, start: threading.Barrier = start,
                     result: dict[str, Any] = result) -> None:
            client = world.app.test_client()
            start.wait()
            response = client.post("/v1/memory.redact", json={
                "namespace": NS, "agent": "chat", "user_id": USER, "key": key})
            result["status"] = response.status_code

        threads = [threading.Thread(target=locker), threading.Thread(target=redactor)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        fact_value = value_of(world, key)
        derived = [v["value"] for v in versions(world, label)]
        if result["status"] == 200:
            assert fact_value is None
            assert all(value is None for value in derived)
        else:
            assert result["status"] == 409
            assert fact_value == f"text {trial}"
            assert all(value == f"derived {trial}" for value in derived)
        outcomes[str(result["status"])] = outcomes.get(str(result["status"]), 0) + 1
    assert sum(outcomes.values()) == 12



def test_an_append_that_read_before_a_redact_does_not_write_the_text_back(app):
    """The append reads the section, a redact scrubs it, then the append writes: the write
    must see the scrub (compare-and-swap on the content hash too) and read again."""
    from app.store.memory import Location, MemoryStore

    services = app.extensions["loom"]
    client = app.test_client()
    who = {"namespace": "support", "agent": "bot", "user_id": "u-1"}
    client.post("/v1/profile.set", json={**who, "label": "notes", "value": "SECRET-TEXT"})
    store = services.store(MemoryStore)
    location = Location("default", "support", "u-1", "bot", "-", "notes")
    real_read = store.read
    state = {"redacted": False}

    def read_then_redact(where):
        row = real_read(where)
        if not state["redacted"]:
            state["redacted"] = True
            store.redact(location, written_by="admin")
        return row

    store.read = read_then_redact  # the redact lands between the append's read and its write
    try:
        store.append(location, "more", "\n", written_by="bot")
    finally:
        store.read = real_read
    versions = client.post("/v1/memory.history", json={**who, "key": "notes"}).get_json()
    assert "SECRET-TEXT" not in str(versions)
    current = client.post("/v1/memory.get", json={**who, "key": "notes"}).get_json()
    assert current["memory"]["value"] == "more"
