"""A refused build is tried again when LOOM_STRUCTURED_PROFILE_REFUSAL_RETRY_SECONDS pass, to
the second, with the injected clock (the end-to-end test with real processes is in
test_structured_live)."""

from __future__ import annotations

from tests.test_structured_worker import SCHEMA, World, answer


def test_a_cut_off_build_is_retried_at_refusal_retry_seconds_to_the_second(
    redis_url, tmp_path, model
):
    w = World(redis_url, tmp_path, model, structured_profile_cooldown_seconds=600,
              structured_profile_scan_max_age_seconds=1,
              structured_profile_refusal_retry_seconds=1000)
    w.post("profile_schema.set", json_schema=SCHEMA)
    w.fact("name", "Call me Sam")
    model.script(answer(preferred_name="Sam"))
    w.run_pass()
    w.fact("name", "Call me Samuel")
    w.clock.advance(601)
    model.script('{"preferred_name": "Sa', finish_reason="length")
    w.run_pass()  # the refusal, at t
    assert len(w.calls()) == 2
    for _ in range(9):
        w.clock.advance(111)  # t + 999 at the last: every pass rescans, none retries
        w.run_pass()
    assert len(w.calls()) == 2 and w.structured()["status"] == "stale"
    w.clock.advance(1.5)  # t + 1000.5: the wait is over; a cooldown more would be t + 1600
    model.script(answer(preferred_name="Samuel"))
    w.run_pass()
    assert len(w.calls()) == 3
    out = w.structured()
    assert out["status"] == "ready" and out["profile"]["preferred_name"] == "Samuel"


def test_a_blacklisted_users_retry_at_refusal_retry_seconds_is_refused_again_without_a_call(
    redis_url, tmp_path, model
):
    w = World(redis_url, tmp_path, model, structured_profile_scan_max_age_seconds=1,
              structured_profile_refusal_retry_seconds=1000)
    w.post("profile_schema.set", json_schema=SCHEMA)
    w.post("structured.blacklist", user_id="u-42", blacklisted=True)
    w.fact("name", "Call me Sam")
    refusals = []
    for _ in range(4):
        w.run_pass()
        refusals.append(w.post("usage.get")["refusals"])
        w.clock.advance(999)
    w.run_pass()
    refusals.append(w.post("usage.get")["refusals"])
    # Refused at t, then tried again at t + 1998 (the first pass past t + 1000), and so on.
    assert refusals[0] == 1 and refusals[-1] == 3
    assert w.calls() == []
