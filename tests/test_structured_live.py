"""Structured-profile rules in the running system: a real gunicorn, ``python -m jobs.scheduler``
and ``python -m jobs.worker`` on one Redis, a scripted model on loopback, 1 s passes.

Each test asserts what ``profile.structured`` answers over HTTP and how many model calls the
worker made for its user (each user's facts name them, and the model answers from the facts).
The cooldown (10 s) is longer than the rules that skip it need, so a rule that waited for it
shows; the in-process tests with the injected clock hold the exact times.
"""

from __future__ import annotations

import re
import threading
import time
from datetime import UTC, datetime, timedelta, timezone

import pytest
import requests

from tests.conftest import TEST_SECRET
from tests.support.model_server import ScriptedAnswer
from tests.support.processes import StructuredStack, wait_for
from tests.test_structured_worker import SCHEMA

NS = {"namespace": "live", "agent": "chat"}
COOLDOWN = 10
REFUSAL_RETRY = 5
ROW = {"agent": "-", "key": "structured_profile"}
WORKER = "worker:structured_profile"


# The cities a fact may name, and the time zone the model answers for each.
TIME_ZONES = {"Lisbon": "Europe/Lisbon", "Berlin": "Europe/Berlin"}


class FactModel:
    """Answers each build from its facts: ``Call me <name>`` gives preferred_name, a fact
    naming a city of TIME_ZONES the time zone. A name in ``cut_off`` is cut off at the output
    cap once."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, str | None]] = []
        self.cut_off: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, body):
        text = body["messages"][-1]["content"]
        names = re.findall(r"Call me (\w+)", text)
        name = names[0] if names else None
        with self.lock:
            self.calls.append((time.time(), name))
            if name in self.cut_off:
                self.cut_off.discard(name)
                return ScriptedAnswer(content='{"preferred_name": "', finish_reason="length")
        city = next((city for city in TIME_ZONES if city in text), None)
        return {"preferred_name": name, "languages": None,
                "timezone": TIME_ZONES[city] if city else None}

    def times(self, name: str) -> list[float]:
        with self.lock:
            return [at for at, called in self.calls if called == name]


class Loom:
    def __init__(self, url: str, model: FactModel) -> None:
        self.url = url
        self.model = model
        self.session = requests.Session()
        # A new connection each request: these tests idle for seconds between requests,
        # and a kept-alive connection reused just as gunicorn's keep-alive timeout
        # (LOOM_WEB_KEEPALIVE_SECONDS, 5 s) closes it fails without an answer.
        self.session.headers["Connection"] = "close"

    def post(self, op: str, **body):
        response = self.session.post(f"{self.url}/v1/{op}", json={**NS, **body}, timeout=10)
        assert response.status_code < 500, response.text
        return response

    def call(self, op: str, **body):
        response = self.post(op, **body)
        assert response.status_code == 200, response.text
        return response.json()

    def structured(self, user: str):
        return self.call("profile.structured", user_id=user)

    def name(self, user: str, name: str, **fields):
        return self.call("memory.set", user_id=user, key="name", value=f"Call me {name}",
                         **fields)

    def wait_ready(self, user: str, name: str | None, timeout: float = 30):
        return wait_for(
            lambda: (out := self.structured(user))["status"] == "ready"
            and out["profile"]["preferred_name"] == name and out,
            timeout, f"{user}'s profile to be ready as {name}", every=0.1)


@pytest.fixture(scope="module")
def loom(redis_server_url, tmp_path_factory):
    fact_model = FactModel()
    with StructuredStack(
        redis_server_url, tmp_path_factory.mktemp("structured-live"), fact_model, TEST_SECRET,
        workers=2,
        LOOM_STRUCTURED_PROFILE_INTERVAL_SECONDS="1",
        LOOM_STRUCTURED_PROFILE_IDLE_INTERVAL_SECONDS="1",
        LOOM_STRUCTURED_PROFILE_SCAN_MAX_AGE_SECONDS="1",
        LOOM_STRUCTURED_PROFILE_COOLDOWN_SECONDS=str(COOLDOWN),
        LOOM_STRUCTURED_PROFILE_REFUSAL_RETRY_SECONDS=str(REFUSAL_RETRY),
    ) as stack:
        client = Loom(stack.url, fact_model)
        client.call("profile_schema.set", json_schema=SCHEMA)
        stack.start_jobs()
        yield client


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat().replace("+00:00", "Z")


@pytest.mark.slow
def test_a_callers_overwrite_of_a_built_profile_is_rebuilt(loom):
    loom.name("u-1", "Ann")
    loom.wait_ready("u-1", "Ann")
    loom.call("memory.set", user_id="u-1", **ROW, memory_type="profile",
              value={"preferred_name": "Forged"})
    out = loom.structured("u-1")
    assert out["profile"]["preferred_name"] != "Forged"  # pending, or rebuilt already
    loom.wait_ready("u-1", "Ann", timeout=COOLDOWN - 2)  # pending: no cooldown to wait for
    row = loom.call("memory.get", user_id="u-1", **ROW)["memory"]
    assert row["written_by"] == WORKER
    assert len(loom.model.times("Ann")) == 2


@pytest.mark.slow
def test_a_redacted_built_profile_is_rebuilt(loom):
    loom.name("u-2", "Bea")
    loom.wait_ready("u-2", "Bea")
    loom.call("memory.redact", user_id="u-2", **ROW)
    loom.wait_ready("u-2", "Bea", timeout=COOLDOWN - 2)
    assert len(loom.model.times("Bea")) == 2


@pytest.mark.slow
def test_a_fact_passing_its_valid_to_reads_stale_and_is_rebuilt_without_cooldown(loom):
    valid_to = time.time() + 10
    loom.name("u-3", "Cat")
    loom.call("memory.set", user_id="u-3", key="tz", value="Lives in Lisbon for now",
              valid_to=_iso(valid_to))
    built = loom.wait_ready("u-3", "Cat", timeout=8)
    assert built["profile"]["timezone"] == "Europe/Lisbon"
    time.sleep(max(0.0, valid_to - time.time()) + 0.05)
    seen = []
    deadline = valid_to + COOLDOWN - 3
    while time.time() < deadline:
        out = loom.structured("u-3")
        seen.append((out["status"], out["profile"]["timezone"]))
        # Once the fact is past its valid_to, a profile still holding it is never ready (and
        # the rebuilt row reads stale until its build record lands).
        assert seen[-1] in (("stale", "Europe/Lisbon"), ("stale", None), ("ready", None)), seen
        if seen[-1] == ("ready", None):
            break
        time.sleep(0.1)
    assert seen[-1] == ("ready", None), seen
    assert len(loom.model.times("Cat")) == 2


@pytest.mark.slow
def test_a_refusal_is_retried_when_refusal_retry_seconds_pass_not_a_cooldown_later(loom):
    loom.name("u-6", "Dan")
    loom.wait_ready("u-6", "Dan")
    loom.model.cut_off.add("Daniel")
    changed = time.time()
    loom.name("u-6", "Daniel")
    wait_for(lambda: loom.model.times("Daniel"), COOLDOWN + 20, "the cut-off build")
    (cut_off,) = loom.model.times("Daniel")
    assert cut_off - changed >= COOLDOWN - 0.5  # an edit waits for its cooldown
    out = loom.structured("u-6")
    assert out["status"] == "stale" and out["profile"]["preferred_name"] == "Dan"
    retried = wait_for(lambda: loom.model.times("Daniel")[1:], REFUSAL_RETRY + COOLDOWN + 20,
                       "the retry")[0]
    # Tried again once REFUSAL_RETRY_SECONDS passed (give or take a pass), not a cooldown on.
    assert REFUSAL_RETRY - 0.5 <= retried - cut_off < REFUSAL_RETRY + COOLDOWN / 2
    loom.wait_ready("u-6", "Daniel", timeout=5)
    assert len(loom.model.times("Daniel")) == 2


@pytest.mark.slow
def test_the_all_null_profile_is_never_written_over_a_callers_row(loom):
    loom.name("u-7", "Eve")
    loom.wait_ready("u-7", "Eve")
    loom.call("memory.delete", user_id="u-7", key="name")
    loom.wait_ready("u-7", None, timeout=COOLDOWN - 2)  # all facts gone: all null, no call
    loom.call("memory.set", user_id="u-7", **ROW, memory_type="profile",
              value={"preferred_name": "Mine"})
    time.sleep(5)  # several passes
    row = loom.call("memory.get", user_id="u-7", **ROW)["memory"]
    assert row["value"] == {"preferred_name": "Mine"} and row["written_by"] != WORKER
    assert loom.structured("u-7")["status"] == "pending"
    assert len(loom.model.times("Eve")) == 1


@pytest.mark.slow
def test_a_blacklisted_user_gets_no_model_call_until_the_blacklist_is_lifted(loom):
    assert loom.call("structured.blacklist", user_id="u-9", blacklisted=True)["changed"]
    loom.name("u-9", "Fay")
    time.sleep(5)  # a pending user would be built at the next pass
    assert loom.model.times("Fay") == []
    assert loom.structured("u-9")["status"] == "pending"
    assert loom.call("structured.blacklist", user_id="u-9", blacklisted=False)["changed"]
    loom.wait_ready("u-9", "Fay", timeout=COOLDOWN - 2)
    assert len(loom.model.times("Fay")) == 1


@pytest.mark.slow
def test_field_list_rules_hold_through_gunicorn(loom):
    """Issue 13 point 10 over the wire: default caps, exact updated_at, control characters,
    the schema's property order."""
    written = loom.call("working_memory.set", block_key="state", content="x", char_limit=100)
    assert written["char_limit"] == 100
    assert loom.call("working_memory.set", block_key="state", content="y")["char_limit"] == 4096
    loom.call("profile.set", label="persona", value="Terse.", char_limit=100)
    assert loom.call("profile.set", label="persona", value="x" * 500)["char_limit"] == 8192

    for index in range(20):  # a float rounds about half of all versions' microseconds up
        version = loom.call("working_memory.set", block_key=f"t{index}", content="x")["version"]
        block = loom.call("working_memory.get", block_key=f"t{index}")
        moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=version // 1000)
        assert block["updated_at"] == moment.isoformat().replace("+00:00", "Z")

    for op, field, body in (("working_memory.set", "block_key", {"content": "x"}),
                            ("profile.set", "label", {"value": "x"})):
        for bad in ("two\nlines", "nul\x00byte"):
            response = loom.post(op, **{field: bad}, **body)
            assert response.status_code == 422, response.text
            assert field in response.json()["error"]["fields"]

    text = loom.post("profile.structured", user_id="u-order").text
    positions = [text.index(f'"{name}"') for name in SCHEMA["properties"]]
    assert positions == sorted(positions)


@pytest.mark.slow
def test_a_recall_costs_no_build_and_a_restatement_one_after_the_cooldown(loom):
    loom.name("u-10", "Gil")
    loom.wait_ready("u-10", "Gil")
    assert len(loom.model.times("Gil")) == 1
    recalled = loom.call("memory.recall", user_id="u-10", key="name")
    assert recalled["digest_moved"] is False
    # Past a cooldown from the recall: the profile stayed ready and nobody built it again.
    until = time.time() + COOLDOWN + 3
    while time.time() < until:
        assert loom.structured("u-10")["status"] == "ready"
        time.sleep(0.5)
    assert len(loom.model.times("Gil")) == 1
    restated_at = time.time()
    restated = loom.call("memory.restate", user_id="u-10", key="name")
    assert restated["digest_moved"] is True
    assert loom.structured("u-10")["status"] == "stale"
    wait_for(lambda: loom.model.times("Gil")[1:], COOLDOWN + 20, "the restatement's rebuild")
    rebuilt = loom.model.times("Gil")[1]
    assert rebuilt - restated_at >= COOLDOWN - 0.5  # after the cooldown, not skipping it
    loom.wait_ready("u-10", "Gil", timeout=5)
    time.sleep(3)  # a few more passes: once only
    assert len(loom.model.times("Gil")) == 2


# One instant written in each form a caller may send (all ISO 8601, which the op accepts).
VALID_TO_FORMS = {
    "microseconds and Z": lambda t: datetime.fromtimestamp(t, tz=UTC).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ"),
    "no fraction and Z": lambda t: datetime.fromtimestamp(int(t), tz=UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"),
    "milliseconds and +00:00": lambda t: datetime.fromtimestamp(t, tz=UTC).isoformat(
        timespec="milliseconds"),
    "microseconds and +05:30": lambda t: datetime.fromtimestamp(
        t, tz=timezone(timedelta(hours=5, minutes=30))).isoformat(timespec="microseconds"),
    "seconds and -08:00": lambda t: datetime.fromtimestamp(
        int(t), tz=timezone(timedelta(hours=-8))).isoformat(),
}


@pytest.mark.slow
def test_a_rebuild_after_a_facts_valid_to_never_carries_it_whatever_the_timestamps_form(loom):
    """Issue 40 point 1: a fact whose valid_to comes well after the first build leaves the
    profile when it passes, and the rebuild (the user's second model call) is made without it,
    for every form of the timestamp."""
    users = {form: (f"u-40-{index}", name) for index, (form, name) in
             enumerate(zip(VALID_TO_FORMS, ("Hal", "Ida", "Jon", "Kim", "Lou"), strict=True))}
    valid_to = time.time() + 15
    expires: dict[str, float] = {}  # each form's instant as stored (a form without a fraction
    for form, (user, name) in users.items():  # drops it)
        loom.name(user, name)
        loom.call("memory.set", user_id=user, key="tz", value="Lives in Berlin",
                  valid_to=VALID_TO_FORMS[form](valid_to))
        stored = loom.call("memory.get", user_id=user, key="tz")["memory"]["valid_to"]
        expires[form] = _seconds(stored)
        assert abs(expires[form] - valid_to) < 1, (form, stored)
    for form, (user, name) in users.items():
        built = wait_for(
            lambda u=user, n=name: (out := loom.structured(u))["status"] == "ready"
            and out["profile"]["preferred_name"] == n and out, 12, f"{form}: the first build")
        assert built["profile"]["timezone"] == "Europe/Berlin", form
        assert _seconds(built["built_at"]) < valid_to - 2, form  # well before it expires
        assert len(loom.model.times(name)) == 1, form
    time.sleep(max(0.0, valid_to - time.time()) + 0.05)
    rebuilt: dict[str, dict] = {}
    deadline = valid_to + COOLDOWN - 2  # the rule skips the cooldown
    while len(rebuilt) < len(users) and time.time() < deadline:
        for form, (user, _name) in users.items():
            out = loom.structured(user)
            # Past its valid_to, the fact's value is never served as ready.
            assert not (out["status"] == "ready" and out["profile"]["timezone"]), (form, out)
            if out["status"] == "ready":
                rebuilt.setdefault(form, out)
        time.sleep(0.1)
    assert set(rebuilt) == set(users), f"not rebuilt in time: {set(users) - set(rebuilt)}"
    time.sleep(3)  # a few more passes
    for form, (user, name) in users.items():
        out = loom.structured(user)
        assert out["status"] == "ready" and out["profile"] == {
            **dict.fromkeys(SCHEMA["properties"]), "preferred_name": name}, (form, out)
        assert _seconds(out["built_at"]) >= expires[form], form  # read after it passed
        assert len(loom.model.times(name)) == 2, form  # the rebuild asked the model again


def _seconds(moment: str) -> float:
    return datetime.fromisoformat(moment.replace("Z", "+00:00")).timestamp()
