"""A structured_profile pass in one process, on the injected clock: the half-time rule, the
pass's limit, and the lease's fence on every build write (seed 000, Passes).

The scripted model moves the frozen clock forward while it "thinks", so a slow model call is
a clock step, not a sleep.
"""

from __future__ import annotations

import threading

import pytest

from app.store import keys
from app.store.identity import Identity
from app.store.lease import LeaseLost, LeaseStore
from app.store.memory import Content, MemoryStore
from app.store.structured import WORKER, BuildRecord, StructuredStore, profile_location
from jobs.structured_profile import LEASE, run_pass
from tests.test_structured_worker import SCHEMA, World, answer

USERS = [f"u-{i}" for i in range(4)]


def slow_world(redis_url, tmp_path, model, **settings):
    w = World(redis_url, tmp_path, model, **{"structured_profile_max_pass_seconds": 100,
                                            "structured_profile_cooldown_seconds": 0,
                                            **settings})
    w.post("profile_schema.set", json_schema=SCHEMA)
    for user in USERS:
        w.fact("name", f"I am {user}", user=user)
    return w


def called_users(world):
    """The user each model call was about, in order (the fact names them)."""
    found = []
    for call in world.calls():
        text = call.body["messages"][-1]["content"]
        found.append(next(user for user in USERS if f"I am {user}" in text))
    return found


def test_a_slow_pass_takes_no_user_in_its_second_half(redis_url, tmp_path, model):
    world = slow_world(redis_url, tmp_path, model)

    def thirty_seconds(request):
        world.clock.advance(30)  # each call takes 30 s of a 100 s pass
        return answer(preferred_name="Built")

    model.default = thirty_seconds
    first = world.run_pass()
    # Taken at 0 s and 30 s; at 60 s the pass is in its second half and takes nobody.
    assert [user for _ns, user, _outcome in first["built"]] == USERS[:2]
    assert called_users(world) == USERS[:2]
    statuses = [world.structured(user)["status"] for user in USERS]
    assert statuses == ["ready", "ready", "pending", "pending"]

    world.clock.advance(1)
    second = world.run_pass()
    # The users not reached stayed listed: the next pass takes them first, with no new scan.
    assert [user for _ns, user, _outcome in second["built"]] == USERS[2:]
    assert called_users(world) == USERS
    assert all(world.structured(user)["status"] == "ready" for user in USERS)


def test_a_build_past_the_limit_writes_nothing_and_is_retried_without_backoff(
    redis_url, tmp_path, model
):
    world = slow_world(redis_url, tmp_path, model)
    world.post("memory.delete", user_id="u-1", key="name")
    world.post("memory.delete", user_id="u-2", key="name")
    world.post("memory.delete", user_id="u-3", key="name")

    def past_the_limit(request):
        world.clock.advance(150)
        return answer(preferred_name="Too late")

    model.default = past_the_limit
    world.run_pass()
    out = world.structured("u-0")
    assert out["status"] == "pending" and out["version"] == 0  # abandoned: nothing written
    assert world.post("usage.get")["failures"] == 0

    model.default = lambda request: answer(preferred_name="On time")
    world.clock.advance(1)  # no 300 s backoff: the next pass builds it
    world.run_pass()
    out = world.structured("u-0")
    assert out["status"] == "ready" and out["profile"]["preferred_name"] == "On time"
    history = world.post("memory.history", user_id="u-0", key="structured_profile", agent="-")
    assert len(history["versions"]) == 1
    assert len(world.calls()) == 2


def test_a_pass_that_lost_its_lease_cannot_write_over_the_next_pass(redis_url, tmp_path, model):
    world = slow_world(redis_url, tmp_path, model)
    for user in USERS[1:]:
        world.post("memory.delete", user_id=user, key="name")
    first_in, first_go = threading.Event(), threading.Event()
    second_in, second_go = threading.Event(), threading.Event()
    calls = []

    def two_passes(request):
        calls.append(request)
        if len(calls) == 1:
            first_in.set()
            assert first_go.wait(10)
            return answer(preferred_name="From the stale pass")
        second_in.set()
        assert second_go.wait(10)
        return answer(preferred_name="From the holder")

    model.default = two_passes
    results: dict[str, dict] = {}
    first = threading.Thread(target=lambda: results.update(first=world.run_pass()))
    first.start()
    assert first_in.wait(10)
    # The first pass stalls past its lease (paused, partitioned): the lease lapses and the
    # next pass takes it, and the same user, while the first one's model call is still out.
    world.services.redis.delete(keys.worker_lease(LEASE))
    second = threading.Thread(target=lambda: results.update(second=run_pass(
        world.services, holder="next-worker", force=True)))
    second.start()
    assert second_in.wait(10)
    first_go.set()  # the stale pass's answer comes first: its write must be refused
    first.join(10)
    second_go.set()
    second.join(10)

    assert results["first"] == {"skipped": "lease lost"}
    outcomes = {user: outcome for _ns, user, outcome in results["second"]["built"]}
    assert outcomes["u-0"] == "built"
    out = world.structured("u-0")
    assert out["status"] == "ready" and out["profile"]["preferred_name"] == "From the holder"
    history = world.post("memory.history", user_id="u-0", key="structured_profile", agent="-")
    assert len(history["versions"]) == 1
    assert world.post("usage.get")["refusals"] == 0


def test_a_write_under_a_stale_token_is_refused_in_the_script(redis_url, tmp_path, model):
    world = slow_world(redis_url, tmp_path, model)
    leases = world.services.store(LeaseStore)
    memory = world.services.store(MemoryStore)
    location = profile_location("default", "support", "u-0")

    def write(fence, name):
        return memory.set(location, Content(memory_type="profile", value={"preferred_name": name},
                                            provenance="derived", actor=WORKER),
                          written_by=WORKER, fence=fence)

    stale = leases.acquire(LEASE, "stale", 60)
    stale_fence = leases.claim_fence(stale, "default", "support", "u-0", 60)
    assert stale_fence is not None and stale_fence.token == str(stale.token)
    world.services.redis.delete(keys.worker_lease(LEASE))  # lapsed
    holder = leases.acquire(LEASE, "holder", 60)
    assert holder is not None and holder.token > stale.token
    fence = leases.claim_fence(holder, "default", "support", "u-0", 60)
    with pytest.raises(LeaseLost):
        write(stale_fence, "stale")
    assert memory.read(location) is None
    with pytest.raises(LeaseLost):  # the stale pass cannot take the user back
        leases.claim_fence(stale, "default", "support", "u-0", 60)
    assert write(fence, "holder").row.value == {"preferred_name": "holder"}

    leases.release_fence(fence)  # a fence that is gone (lapsed, released) fences everyone off
    with pytest.raises(LeaseLost):
        write(fence, "after")
    assert memory.read(location).value == {"preferred_name": "holder"}
    # A caller's write carries no fence and is not held to one.
    memory.set(location, Content(memory_type="profile", value={"preferred_name": "caller"}),
               written_by="chat")


def test_a_build_record_under_a_stale_token_is_refused_with_its_row(
        redis_url, tmp_path, model):
    world = slow_world(redis_url, tmp_path, model)
    leases = world.services.store(LeaseStore)
    memory = world.services.store(MemoryStore)
    user = ("default", "support", "u-0")
    location = profile_location(*user)
    content = Content(memory_type="profile", value={"preferred_name": "Built"},
                      provenance="derived", actor=WORKER)
    record = StructuredStore.record_fields(
        *user, BuildRecord("sha", "schema", "digest", 1, 1, False))
    stale = leases.acquire(LEASE, "stale", 60)
    stale_fence = leases.claim_fence(stale, *user, 60)
    world.services.redis.delete(keys.worker_lease(LEASE))  # lapsed
    holder = leases.acquire(LEASE, "holder", 60)
    fence = leases.claim_fence(holder, *user, 60)

    with pytest.raises(LeaseLost):
        memory.set(location, content, written_by=WORKER, fence=stale_fence, record=record)
    redis = world.services.redis
    assert memory.read(location) is None
    assert not redis.exists(keys.structured_meta(*user))

    written = memory.set(location, content, written_by=WORKER, fence=fence, record=record)
    assert redis.hget(keys.structured_meta(*user), "digest") in ("digest", b"digest")
    assert written.row.value == {"preferred_name": "Built"}


def test_no_read_during_builds_sees_a_row_without_its_record(redis_url, tmp_path, model):
    """Issue 39 point 3: the worker writes a profile row and its build record in one step, and
    profile.structured (like the next pass's scan) reads both in one MULTI: a reader running
    through many builds never finds the worker's live row without the record of its content
    (the two-step write answered stale or pending between them)."""
    world = slow_world(redis_url, tmp_path, model, structured_profile_scan_max_age_seconds=1)
    structured = world.services.store(StructuredStore)
    identity = Identity("default", "support", user_id="u-0")
    builds = 40
    done = threading.Event()
    torn: list[tuple[str, str]] = []
    statuses: list[str] = []
    reads = [0]

    def read_all_the_time() -> None:
        while not done.is_set():
            snapshot = structured.snapshot(identity, for_build=False)
            found = structured.records("default", "support", ["u-0"])["u-0"]
            reads[0] += 1
            row, record = snapshot.row, snapshot.record
            if row is not None and row.written_by == WORKER and (
                    record is None or record.content_sha256 != row.content_sha256):
                torn.append((row.content_sha256, record.content_sha256 if record else ""))
            if row is not None and row.written_by == WORKER and not found[3]:
                torn.append(("records", row.content_sha256))
            # profile.structured's answer, from the same snapshot it reads.
            statuses.append(snapshot.read(world.clock.now_ns())["status"])

    reader = threading.Thread(target=read_all_the_time)
    reader.start()
    try:
        for index in range(builds):
            model.default = answer(preferred_name=f"Name {index}")
            world.fact("name", f"I am u-0, call me Name {index}", user="u-0")
            world.clock.advance(2)  # past the scan's age: the next pass scans again
            built = world.run_pass()
            assert ("u-0", "built") in [(user, outcome) for _ns, user, outcome in
                                        built["built"]], built
    finally:
        done.set()
        reader.join(10)
    assert reads[0] > builds  # the reader ran through the builds, not after them
    assert torn == []
    # Each build answers a new fact: between them the profile reads stale (a fact moved since
    # the build) or ready, never pending (no row served) once the first build landed.
    first_ready = statuses.index("ready")
    assert "pending" not in statuses[first_ready:], statuses
    out = world.structured("u-0")
    assert out["status"] == "ready" and out["profile"]["preferred_name"] == f"Name {builds - 1}"


def test_a_user_being_erased_cannot_be_taken(redis_url, tmp_path, model):
    world = slow_world(redis_url, tmp_path, model)
    leases = world.services.store(LeaseStore)
    lease = leases.acquire(LEASE, "holder", 60)
    world.services.redis.set(keys.user_erasing("default", "support", "u-0"), "1")
    assert leases.claim_fence(lease, "default", "support", "u-0", 60) is None
    assert not world.services.redis.exists(
        keys.worker_lease_fence(LEASE, "default", "support", "u-0"))


def test_the_lease_is_renewed_while_a_pass_runs(redis_url, tmp_path, model):
    # A TTL of 3 s (the whole limit when the limit is that short), a model call of 4 s: without
    # renewals the lease would lapse under the build.
    world = slow_world(redis_url, tmp_path, model, structured_profile_max_pass_seconds=3)
    for user in USERS[1:]:
        world.post("memory.delete", user_id=user, key="name")
    inside = threading.Event()
    ttls: list[int] = []

    def slow(request):
        inside.set()
        for _ in range(8):
            threading.Event().wait(0.5)
            ttls.append(world.services.redis.pttl(keys.worker_lease(LEASE)))
        return answer(preferred_name="Sam")

    model.default = slow
    result = world.run_pass()
    assert inside.is_set() and result["built"][0][1:] == ("u-0", "built")
    assert min(ttls) > 0, ttls  # never lapsed
    assert world.structured("u-0")["status"] == "ready"
    assert not world.services.redis.exists(keys.worker_lease(LEASE))  # released at the end
