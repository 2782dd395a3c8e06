"""Reads cost what they answer: the Redis commands of a render, a pack and a list page.

Every call here runs through the Flask app against the real server, with a client that records
each command sent (tests/support/command_log.py). A read is made in a small namespace, then the
namespace is filled with rows it must not answer (other users, other agents, other labels,
other sessions, facts), and the same read is made again: it must send the same commands, read
no row key of the filler, and answer the same. A model of the render built from every row (the
rule profile.render had before the indexes) checks that the indexes answer exactly that.
"""

from __future__ import annotations

import itertools
import random
import threading
from typing import Any

import pytest

from app.auth import row_visible
from app.store import keys
from app.store.identity import Identity
from tests.conftest import ON_CLUSTER, make_app
from tests.support.command_log import CommandLog, recording_client
from tests.support.erasure_worker import run_erasure_jobs

# The command log wraps a one-server client: what a request costs is counted on one server.
pytestmark = pytest.mark.skipif(ON_CLUSTER, reason="counts commands on a single server")

NS = "support"
AGENT = "triage-bot"
USER = "u-42"
SESSION = "s-1"


class Loom:
    def __init__(self, redis_url: str, tmp_path: Any) -> None:
        self.log = CommandLog()
        self.redis = recording_client(redis_url, self.log)
        self.app = make_app(redis_url, tmp_path, redis=self.redis)
        self.client = self.app.test_client()

    def post(self, op: str, **body: Any) -> dict[str, Any]:
        response = self.client.post(f"/v1/{op}", json={"namespace": NS, "agent": AGENT, **body})
        assert response.status_code == 200, response.get_json()
        return response.get_json()

    def section(self, label: str, value: str, **identity: str) -> None:
        self.post("profile.set", label=label, value=value, **identity)

    def measured(self, op: str, **body: Any) -> tuple[dict[str, Any], CommandLog]:
        self.post(op, **body)  # warm: scripts loaded, connections open
        with self.log.recording() as log:
            out = self.post(op, **body)
        return out, log.snapshot()


@pytest.fixture
def loom(redis_url, tmp_path):
    return Loom(redis_url, tmp_path)


def the_answer(loom: Loom) -> None:
    """What the measured reads answer: namespace sections, the user's, a session's."""
    loom.section("persona", "Terse. Cite ticket ids.")
    loom.section("persona", "Other bot's persona.", agent="billing-bot")
    loom.section("preferences", "Prefers EUR invoices.", user_id=USER)
    loom.section("preferences", "In this chat: answer in German.", user_id=USER,
                 session_id=SESSION)
    loom.section("notes", "Asked about refunds twice.", user_id=USER)


FILLER_USERS = [f"other-{n:03d}" for n in range(40)]
FILLER_AGENT = "filler-bot"
LABELS = ("persona", "preferences", "notes")


def fill(loom: Loom, kinds: set[str]) -> None:
    """Rows the measured read must not answer, nor read: ``users`` other users' sections under
    every label and other agents; ``other_labels`` other users' and the namespace's sections
    under other labels; ``labels`` the user's under other labels too; ``agents`` the user's
    and the namespace's sections by another agent; ``sessions`` the user's and the namespace's
    sections of other sessions; and always the user's facts."""
    for n, user in enumerate(FILLER_USERS):
        if "users" in kinds:
            for label in LABELS:
                loom.section(label, f"filler {label} {n}", user_id=user, agent=FILLER_AGENT)
                loom.section(label, f"filler {label} {n}", user_id=user)
        if "users" in kinds or "other_labels" in kinds:
            loom.section(f"filler-{n}", f"filler section {n}", user_id=user)
    for n in range(15):
        if "other_labels" in kinds or "labels" in kinds:
            loom.section(f"namespace-filler-{n}", f"namespace filler {n}")
        if "labels" in kinds:
            loom.section(f"user-filler-{n}", f"the user's other section {n}", user_id=USER)
        if "agents" in kinds:
            loom.section(LABELS[n % 3], f"filler agent {n}", user_id=USER,
                         agent=f"{FILLER_AGENT}-{n}")
            loom.section(LABELS[n % 3], f"filler agent {n}", agent=f"{FILLER_AGENT}-{n}")
        if "sessions" in kinds:
            loom.section(LABELS[n % 3], f"another session {n}", user_id=USER,
                         session_id=f"s-other-{n}")
            loom.section(LABELS[n % 3], f"another session {n}", session_id=f"s-other-{n}")
        loom.post("memory.set", key=f"fact-{n}", value=f"fact {n}", user_id=USER)


FILLER_MARKS = ("filler", "other-")


def rows_read(log: CommandLog) -> list[str]:
    """The memory row keys the call read."""
    return [c[1] for c in log.named("HGETALL", "HMGET", "HGET") if c[1].startswith("loom:mem:")]


OWN_USER = {"users"}
READS = [
    ("profile.render", {"labels": ["persona", "preferences"], "read_scope": "own_user",
                        "user_id": USER}, OWN_USER | {"labels"}),
    ("profile.render", {"labels": ["persona", "notes"], "user_id": USER},
     {"other_labels", "labels"}),
    ("profile.render", {"read_scope": "own_user", "user_id": USER}, {"users"}),
    ("profile.render", {"scope": "this_agent", "user_id": USER, "read_scope": "own_user"},
     OWN_USER | {"agents"}),
    ("profile.render", {"scope": "this_agent", "labels": ["persona", "notes"],
                        "user_id": USER}, {"agents", "labels", "other_labels"}),
    ("profile.render", {"read_scope": "own_session", "user_id": USER,
                        "session_id": SESSION}, {"users", "sessions"}),
    ("profile.render", {"read_scope": "own_session", "labels": ["preferences"],
                        "user_id": USER, "session_id": SESSION},
     {"users", "sessions", "labels"}),
    ("profile.render", {"read_scope": "own_session", "scope": "this_agent", "labels": [
        "persona", "preferences"], "user_id": USER, "session_id": SESSION},
     {"users", "sessions", "labels", "agents"}),
    ("context.pack", {"read_scope": "own_user", "user_id": USER}, {"users"}),
    ("context.pack", {"labels": ["persona", "preferences"], "read_scope": "own_user",
                      "user_id": USER, "session_id": SESSION}, OWN_USER | {"labels"}),
]


@pytest.mark.parametrize(("op", "body", "kinds"), READS,
                         ids=[f"{op}-{n}" for n, (op, _, _) in enumerate(READS)])
def test_a_read_sends_the_same_commands_however_full_the_namespace(loom, op, body, kinds):
    the_answer(loom)
    small, small_log = loom.measured(op, **body)
    fill(loom, kinds)
    full, full_log = loom.measured(op, **body)

    assert full == small
    assert full_log.round_trips == small_log.round_trips
    assert len(full_log.commands) == len(small_log.commands)
    for mark in FILLER_MARKS:
        assert not [k for k in rows_read(full_log) if mark in k], mark
    answered = full["section_count"] if op == "profile.render" else len(
        full["sections"][1]["labels"])
    assert len(rows_read(full_log)) == answered


def test_a_namespace_render_of_labels_reads_only_users_holding_them(loom):
    the_answer(loom)
    fill(loom, {"other_labels", "labels", "facts"})
    out, log = loom.measured("profile.render", labels=["persona", "notes"])
    assert out["labels"] == ["persona", "persona", "notes"]
    assert len(rows_read(log)) == 3
    assert not log.touching("other-")  # no filler user's slot is read at all


def test_a_namespace_render_of_a_shared_label_reads_only_that_label(loom):
    the_answer(loom)
    fill(loom, {"users", "labels"})
    out, log = loom.measured("profile.render", labels=["preferences"])
    # The user's two and the forty filler users' by two agents each.
    assert out["section_count"] == 2 + 40 * 2
    assert len(rows_read(log)) == out["section_count"]
    assert all(k.endswith(":preferences") for k in rows_read(log))


def test_a_this_agent_render_reads_only_that_agents_rows(loom):
    the_answer(loom)
    fill(loom, {"agents"})
    out, log = loom.measured("profile.render", scope="this_agent")
    assert out["labels"] == ["notes", "persona", "preferences", "preferences"]
    assert len(rows_read(log)) == 4
    assert not log.touching(FILLER_AGENT)


def test_a_render_needs_at_most_three_round_trips(loom):
    the_answer(loom)
    fill(loom, {"users", "labels", "agents", "sessions"})
    _, own = loom.measured("profile.render", user_id=USER, read_scope="own_user",
                           labels=["persona"])
    _, wide = loom.measured("profile.render", user_id=USER, labels=["persona"])
    # Beyond the render's own reads, the request does its fixed work (the read's record in
    # profile.activity); the namespace render adds one round trip for the namespace index.
    assert wide.round_trips == own.round_trips + 1
    assert own.round_trips <= 4


def test_pages_of_a_list_read_their_page(loom):
    for n in range(120):
        loom.post("memory.set", key=f"fact-{n:03d}", value=f"fact {n}", user_id=USER)
    for n in range(3):
        loom.section(f"z-section-{n}", f"section {n}", user_id=USER)
    for n in range(30):
        loom.post("memory.set", key=f"gone-{n:03d}", value="x", user_id=USER)
        loom.post("memory.delete", key=f"gone-{n:03d}", user_id=USER)

    out, log = loom.measured("memory.list", user_id=USER, memory_type="profile", limit=2)
    assert [m["key"] for m in out["memories"]] == ["z-section-0", "z-section-1"]
    assert out["next_cursor"]
    assert len(rows_read(log)) == 2

    out, log = loom.measured("memory.list", user_id=USER, limit=5, cursor=out["next_cursor"],
                             memory_type="profile")
    assert [m["key"] for m in out["memories"]] == ["z-section-2"]
    assert out["next_cursor"] == ""
    assert len(rows_read(log)) == 1

    out, log = loom.measured("memory.list", user_id=USER, limit=10, key_prefix="fact-1")
    assert [m["key"] for m in out["memories"]] == [f"fact-{n}" for n in range(100, 110)]
    assert len(rows_read(log)) == 10

    # Tombstones are skipped by the index, not read and dropped.
    out, log = loom.measured("memory.list", user_id=USER, limit=3, key_prefix="g")
    assert out["memories"] == [] and out["next_cursor"] == ""
    assert rows_read(log) == []
    out, log = loom.measured("memory.list", user_id=USER, limit=3, key_prefix="g",
                             include_deleted=True)
    assert [m["key"] for m in out["memories"]] == ["gone-000", "gone-001", "gone-002"]
    assert len(rows_read(log)) == 3


# --- the indexes answer what a scan of every row would -----------------------------------------


def reference_render(loom: Loom, identity: Identity, read_scope: str, scope: str,
                     labels: list[str] | None) -> list[tuple[str, str, str, str]]:
    """profile.render's rule applied to every row of the namespace (no index)."""
    redis = loom.redis
    rows = []
    for key in redis.scan_iter(match="loom:mem:*", count=1000):
        if redis.type(key) != "hash":
            continue
        r = redis.hgetall(key)
        if r.get("memory_type") != "profile" or r.get("deleted") == "1":
            continue
        if r.get("redacted") == "1":
            continue
        if scope == "this_agent" and r["agent"] != identity.agent:
            continue
        if not row_visible(read_scope, identity, r["user_id"], r["session_id"]):
            continue
        rows.append(r)
    rows.sort(key=lambda r: (r["key"], r["user_id"] != "-", r["user_id"],
                             r["session_id"] != "-", r["session_id"], r["agent"]))
    if labels is not None:
        rows = [r for label in dict.fromkeys(labels) for r in rows if r["key"] == label]
    return [(r["key"], r["user_id"], r["session_id"], r["agent"]) for r in rows]


def test_the_indexes_render_what_a_scan_of_every_row_renders(loom):
    rng = random.Random(17)
    users, agents, sessions, labels = ["-", "u-1", "u-2", "u-3"], ["a", "b"], ["-", "s-1", "s-2"], [
        "persona", "notes", "prefs", "tone"]
    written = []
    for n in range(160):
        where = {"user_id": rng.choice(users), "agent": rng.choice(agents),
                 "session_id": rng.choice(sessions)}
        label = rng.choice(labels)
        roll = rng.random()
        if roll < 0.65 or not written:
            response = loom.client.post("/v1/profile.set", json={
                "namespace": NS, "label": label, "value": f"text {n}", **where})
            assert response.status_code in (200, 409)  # 409: the key holds a fact now
            written.append((label, where))
        elif roll < 0.8:
            old_label, old_where = rng.choice(written)
            loom.post("memory.delete", key=old_label, memory_type="profile", **old_where)
        elif roll < 0.9:
            old_label, old_where = rng.choice(written)
            loom.post("memory.set", key=old_label, value="now a fact", **old_where)
        else:
            old_label, old_where = rng.choice(written)
            response = loom.client.post("/v1/profile.append", json={
                "namespace": NS, "label": old_label, "addition": f"more {n}", **old_where})
            assert response.status_code in (200, 409)
    for user, agent, session, read_scope, scope, chosen in itertools.product(
        ["u-1", "u-3"], agents, ["s-1", "-"], ["namespace", "own_user", "own_session"],
        ["namespace", "this_agent"], [None, ["tone", "persona"], ["notes"]],
    ):
        if read_scope == "own_session" and session == "-":
            continue
        identity = Identity(org="default", namespace=NS, agent=agent, user_id=user,
                            session_id=session)
        body: dict[str, Any] = {"agent": agent, "user_id": user, "session_id": session,
                                "read_scope": read_scope, "scope": scope}
        if chosen is not None:
            body["labels"] = chosen
        response = loom.client.post("/v1/profile.render", json={"namespace": NS, **body})
        out = response.get_json()
        expected = reference_render(loom, identity, read_scope, scope, chosen)
        assert out["labels"] == [label for label, *_ in expected], body
        assert out["section_count"] == len(expected), body


def test_a_redacted_section_leaves_the_index_and_comes_back_when_written(loom):
    fact = loom.post("memory.set", key="name", value="Sam", user_id=USER)
    loom.section("persona", "plain", user_id=USER)
    loom.post("profile.set", label="summary", value="Calls himself Sam", user_id=USER,
              source_trace=f"profile.fold:summary:{fact['memory_id']}")
    index = keys.profile_sections("default", NS, USER)
    assert loom.redis.zcard(index) == 6  # two sections, three entries each
    loom.post("memory.redact", key="name", user_id=USER)
    assert loom.post("profile.render", user_id=USER, read_scope="own_user")["labels"] == [
        "persona"]
    assert loom.redis.zcard(index) == 3
    loom.section("summary", "rewritten", user_id=USER)
    assert loom.post("profile.render", user_id=USER, read_scope="own_user")["labels"] == [
        "persona", "summary"]
    assert loom.redis.zcard(index) == 6


# --- the indexes under concurrent writers -------------------------------------------------------


def expected_indexes(loom: Loom, user: str) -> tuple[set[str], set[str]]:
    """The section and live index entries the user's rows call for."""
    redis = loom.redis
    sections: set[str] = set()
    live: set[str] = set()
    for member in redis.zrange(keys.memory_keys("default", NS, user), 0, -1):
        key, agent, session_id = member.split("\x00")
        row = redis.hgetall(keys.memory_row("default", NS, user, agent, session_id, key))
        if row.get("deleted") == "1":
            continue
        live |= {f"{row['memory_type']}\x00{member}", f"\x00{member}"}
        if row["memory_type"] == "profile" and row.get("redacted") != "1":
            sections |= {f"l\x00{key}\x00{agent}\x00{session_id}",
                         f"a\x00{agent}\x00{key}\x00{session_id}",
                         f"s\x00{session_id}\x00{key}\x00{agent}"}
    return sections, live


def test_the_indexes_match_the_rows_after_concurrent_writers(loom):
    labels, agents = ["persona", "notes", "prefs"], ["a", "b"]
    errors: list[Any] = []

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        client = loom.app.test_client()
        try:
            for n in range(60):
                where = {"namespace": NS, "user_id": USER, "agent": rng.choice(agents)}
                label = rng.choice(labels)
                roll = rng.random()
                if roll < 0.35:
                    body = {**where, "label": label, "value": f"w{seed}-{n}"}
                    op = "profile.set"
                elif roll < 0.6:
                    body = {**where, "label": label, "addition": f"w{seed}-{n}"}
                    op = "profile.append"
                elif roll < 0.75:
                    body = {**where, "key": label}
                    op = "memory.delete"
                elif roll < 0.85:
                    body = {**where, "key": label, "value": "a fact now"}
                    op = "memory.set"
                else:
                    body = {**where, "key": label}
                    op = "memory.redact"
                response = client.post(f"/v1/{op}", json=body)
                # 404: nothing to redact; 409: the key holds a fact, or a lost race retried out.
                if response.status_code not in (200, 404, 409):
                    errors.append((op, response.status_code, response.get_json()))
        except Exception as exc:  # reported below, with the thread's seed
            errors.append((seed, repr(exc)))

    threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors[:3]

    sections, live = expected_indexes(loom, USER)
    assert set(loom.redis.zrange(keys.profile_sections("default", NS, USER), 0, -1)) == sections
    assert set(loom.redis.zrange(keys.memory_live("default", NS, USER), 0, -1)) == live
    identity = Identity(org="default", namespace=NS, agent="a", user_id=USER)
    out = loom.post("profile.render", agent="a", user_id=USER, read_scope="own_user")
    expected = reference_render(loom, identity, "own_user", "namespace", None)
    assert out["labels"] == [label for label, *_ in expected]


def test_erasure_removes_the_indexes_and_the_namespace_entries(loom):
    the_answer(loom)
    loom.post("memory.set", key="name", value="Sam", user_id=USER)
    loom.section("persona", "kept", user_id="u-kept")
    assert loom.redis.sismember(keys.profile_label_users("default", NS, "notes"), USER)
    started = loom.post("user.erase", user_id=USER)
    run_erasure_jobs(loom.app.extensions["loom"])  # a worker runs the saga
    receipt = loom.post("erasure.status", erasure_id=started["erasure_id"])
    assert receipt["status"] == "done" and receipt["census"]["clean"] is True
    assert not loom.redis.exists(keys.profile_sections("default", NS, USER),
                                 keys.memory_live("default", NS, USER))
    for label in ("preferences", "notes", "persona"):
        assert not loom.redis.sismember(keys.profile_label_users("default", NS, label), USER)
    assert not loom.redis.sismember(keys.profile_agent_users("default", NS, AGENT), USER)
    assert loom.redis.sismember(keys.profile_label_users("default", NS, "persona"), "u-kept")
    assert loom.post("profile.render", user_id=USER, read_scope="own_user")["labels"] == [
        "persona", "persona"]


def test_an_api_request_opens_no_console_session(loom):
    app = loom.app
    with app.test_request_context("/v1/working_memory.get", method="POST"):
        from flask import request

        assert app.session_interface.open_session(app, request) is None
    with app.test_request_context("/console/", method="GET"):
        from flask import request

        assert app.session_interface.open_session(app, request) is not None
