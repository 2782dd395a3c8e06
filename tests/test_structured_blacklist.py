"""structured.blacklist: an admin keeps the worker from building one user's structured profile.

Through the Flask app, with real Redis, the injected clock and the scripted model over HTTP: the
worker refuses a blacklisted user's build as it refuses a locked profile row (no model call),
serves the row as it stands, and tries again at once when the blacklist is lifted.
"""

from __future__ import annotations

import threading

from app.store import keys

# The fixtures come from the worker tests: pytest passes them by name.
# ruff: noqa: F811
from tests.test_structured_worker import NS, answer, world  # noqa: F401

USER = "u-42"


def _blacklist(w, on, user=USER):
    response = w.client.post("/v1/structured.blacklist",
                                 json={"namespace": NS, "user_id": user, "blacklisted": on})
    return response.status_code, response.get_json()


def test_a_user_blacklisted_before_any_build_gets_no_model_call_until_lifted(world, model):
    status, out = _blacklist(world, True)
    assert status == 200 and out["blacklisted"] is True and out["changed"] is True
    assert out["blacklisted_at"] is not None
    world.fact("name", "Call me Sam")
    for _ in range(3):
        world.run_pass()
        world.clock.advance(700)  # past the cooldown and the scan age, every time
    assert world.calls() == []
    assert world.structured()["status"] == "pending"
    assert world.post("usage.get")["refusals"] >= 1

    status, out = _blacklist(world, False)
    assert status == 200 and out == {**out, "blacklisted": False, "changed": True,
                                     "blacklisted_at": None}
    model.script(answer(preferred_name="Sam"))
    world.clock.advance(61)  # the namespace's next scan; far inside REFUSAL_RETRY_SECONDS
    world.run_pass()
    out = world.structured()
    assert out["status"] == "ready" and out["profile"]["preferred_name"] == "Sam"
    assert len(world.calls()) == 1


def test_a_built_profile_is_served_as_it_stands_while_blacklisted(world, model):
    world.fact("name", "Call me Sam")
    model.script(answer(preferred_name="Sam"))
    world.run_pass()
    assert _blacklist(world, True)[1]["changed"] is True
    world.fact("name", "Call me Samuel")
    world.clock.advance(601)
    world.run_pass()
    world.clock.advance(22000)  # REFUSAL_RETRY_SECONDS (21600) pass: tried again, refused again
    world.run_pass()
    out = world.structured()
    assert out["status"] == "stale" and out["profile"]["preferred_name"] == "Sam"
    assert len(world.calls()) == 1

    _blacklist(world, False)
    model.script(answer(preferred_name="Samuel"))
    world.clock.advance(61)
    world.run_pass()
    out = world.structured()
    assert out["status"] == "ready" and out["profile"]["preferred_name"] == "Samuel"
    assert len(world.calls()) == 2


def test_lifting_a_blacklist_on_a_current_profile_costs_no_call(world, model):
    world.fact("name", "Call me Sam")
    model.script(answer(preferred_name="Sam"))
    world.run_pass()
    _blacklist(world, True)
    _blacklist(world, False)
    world.clock.advance(700)
    world.run_pass()
    assert len(world.calls()) == 1 and world.structured()["status"] == "ready"


def test_blacklisting_is_idempotent_audited_by_a_keyed_digest_and_needs_a_user(world):
    first = _blacklist(world, True)[1]
    again = _blacklist(world, True)[1]
    assert (first["changed"], again["changed"]) == (True, False)
    assert first["blacklisted_at"] == again["blacklisted_at"]
    assert first["user_digest"] == again["user_digest"] and len(first["user_digest"]) == 64
    assert _blacklist(world, False)[1]["changed"] is True
    assert _blacklist(world, False)[1]["changed"] is False
    entries = world.post("audit.list")["entries"]
    blacklist = [e for e in entries if e["action"] == "structured.blacklist"]
    assert [e["blacklisted"] for e in blacklist] == [False, True]  # newest first, changes only
    assert all(e["user_digest"] == first["user_digest"] for e in blacklist)
    assert USER not in str(entries)  # the audit list outlives an erasure: no raw user id
    assert _blacklist(world, True, user="u-7")[1]["user_digest"] != first["user_digest"]

    status, out = _blacklist(world, True, user="-")
    assert status == 422 and out["error"]["code"] == "IDENTITY_INCOMPLETE"
    response = world.client.post("/v1/structured.blacklist",
                                 json={"namespace": NS, "user_id": USER})
    assert response.status_code == 422 and "blacklisted" in response.get_json()["error"]["fields"]
    response = world.client.post("/v1/structured.blacklist",
                                 json={"namespace": NS, "user_id": USER, "blacklisted": "yes"})
    assert response.status_code == 422 and "blacklisted" in response.get_json()["error"]["fields"]


def test_blacklisting_a_user_being_erased_is_refused(world):
    marker = keys.user_erasing("default", NS, USER)
    world.services.redis.hset(marker, "since", 1)
    try:
        status, out = _blacklist(world, True)
    finally:
        world.services.redis.delete(marker)
    assert status == 409 and out["error"]["code"] == "USER_BEING_ERASED"
    assert world.services.redis.zscore(keys.structured_blacklist("default", NS), USER) is None


def test_concurrent_toggles_audit_exactly_the_changes_that_happened(world):
    barrier = threading.Barrier(8)
    answers: list[dict] = []
    lock = threading.Lock()

    def toggle(writer):
        client = world.app.test_client()
        barrier.wait()
        for i in range(10):
            on = (writer + i) % 2 == 0
            response = client.post("/v1/structured.blacklist",
                                   json={"namespace": NS, "user_id": USER, "blacklisted": on})
            assert response.status_code == 200
            with lock:
                answers.append(response.get_json())

    threads = [threading.Thread(target=toggle, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    changes = [a for a in answers if a["changed"]]
    audited = [e for e in world.post("audit.list", limit=200)["entries"]
               if e["action"] == "structured.blacklist"]
    assert len(audited) == len(changes) > 0
    states = [e["blacklisted"] for e in reversed(audited)]  # oldest first
    assert states[0] is True
    assert all(a != b for a, b in zip(states, states[1:], strict=False))  # each one flips it
    stored = world.services.redis.zscore(keys.structured_blacklist("default", NS), USER) is not None
    assert stored is states[-1]


def test_an_erasure_removes_the_blacklist_entry_and_its_census_stays_clean(world):
    from app.store.erasure import ErasureStore

    _blacklist(world, True)
    _blacklist(world, True, user="u-other")
    receipt = world.services.store(ErasureStore).erase("default", NS, USER, actor="test")
    assert receipt["status"] == "done" and receipt["census"]["clean"]
    blacklisted = keys.structured_blacklist("default", NS)
    assert world.services.redis.zscore(blacklisted, USER) is None
    assert world.services.redis.zscore(blacklisted, "u-other") is not None
