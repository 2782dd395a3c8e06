"""context.pack (seed 000, "How context.pack loads them") through the Flask app and real Redis.

Covers the layers (run, session, agent, narrowest first), session_block, the per-section
budgets (whole blocks and sections dropped, listed), the stable prefix and its hash, the profile
section against profile.render, the read scope, profile.activity, and that agent state never
enters a pack.
"""

from __future__ import annotations

import hashlib

import pytest

from app.clock import FrozenClock
from app.ops.context import NO_QUERY_SECTIONS
from tests.auth_support import auth_app, bearer, mint
from tests.support.api import op_helpers

NS = {"namespace": "support", "agent": "triage-bot"}
call, ok = op_helpers(NS)
USER = {"user_id": "u-42"}


def block(client, key, content, **scope):
    ok(client, "working_memory.set", block_key=key, content=content, **USER, **scope)


def pack(client, headers=None, **body):
    return ok(client, "context.pack", headers, **USER, **body)


def tag(key, content):
    return f'<working-memory block="{key}">{content}</working-memory>'


def section(out, name):
    (found,) = [s for s in out["sections"] if s["name"] == name]
    return found


def layered(client):
    block(client, "state", "run text", session_id="s-1", run_id="run-7")
    block(client, "brief", "session text", session_id="s-1")
    block(client, "habits", "agent text")
    # Other runs and sessions of the same agent and user stay out.
    block(client, "state", "another run", session_id="s-1", run_id="run-8")
    block(client, "brief", "another session", session_id="s-2")


# --- layers -------------------------------------------------------------------------------------


def test_a_run_pack_carries_the_run_then_the_session_then_the_agent(client):
    layered(client)
    out = pack(client, session_id="s-1", run_id="run-7")
    expected = "\n".join(
        [tag("state", "run text"), tag("brief", "session text"), tag("habits", "agent text")]
    )
    assert out["pack"] == expected
    memory = section(out, "working_memory")
    assert [(b["layer"], b["block_key"]) for b in memory["blocks"]] == [
        ("run", "state"), ("session", "brief"), ("agent", "habits")
    ]
    assert memory["chars"] == len(expected) and memory["dropped"] == []
    assert [b["chars"] for b in memory["blocks"]] == [
        len(tag("state", "run text")), len(tag("brief", "session text")),
        len(tag("habits", "agent text")),
    ]


def test_a_session_pack_carries_the_session_and_the_agent_but_no_run(client):
    layered(client)
    out = pack(client, session_id="s-1")
    assert out["pack"] == tag("brief", "session text") + "\n" + tag("habits", "agent text")
    assert [b["layer"] for b in section(out, "working_memory")["blocks"]] == ["session", "agent"]


def test_an_agent_pack_and_a_run_without_a_session(client):
    layered(client)
    block(client, "cursor", "sessionless run", run_id="run-9")
    assert pack(client)["pack"] == tag("habits", "agent text")
    out = pack(client, run_id="run-9")
    # The run's session layer is the agent layer (session_id '-'): read once, not twice.
    assert out["pack"] == tag("cursor", "sessionless run") + "\n" + tag("habits", "agent text")
    assert [b["layer"] for b in section(out, "working_memory")["blocks"]] == ["run", "agent"]


def test_layers_belong_to_the_packs_agent_and_user(client):
    layered(client)
    ok(client, "working_memory.set", block_key="x", content="another user", user_id="u-7")
    ok(client, "working_memory.set", block_key="x", content="another agent", agent="other-bot",
       **USER)
    text = pack(client, session_id="s-1", run_id="run-7")["pack"]
    assert "another user" not in text and "another agent" not in text


# --- session_block ------------------------------------------------------------------------------


def test_session_block_leaves_out_other_projects_notes_in_the_agent_layer(client):
    block(client, "session:projectA", "A: step 3")
    block(client, "session:projectB", "B: step 9")
    block(client, "habits", "agent text")
    block(client, "session:projectB", "B in the session layer", session_id="s-1")
    everything = pack(client, session_id="s-1")["pack"]
    assert "A: step 3" in everything and "B: step 9" in everything
    out = pack(client, session_id="s-1", session_block="session:projectA")
    assert out["pack"] == "\n".join([
        tag("session:projectB", "B in the session layer"),
        tag("habits", "agent text"),
        tag("session:projectA", "A: step 3"),
    ])
    # Leaving out is not dropping for the budget.
    assert section(out, "working_memory")["dropped"] == []
    # A project with no note yet: every session:* note of the agent layer is left out.
    out = pack(client, session_block="session:projectC")
    assert out["pack"] == tag("habits", "agent text")


@pytest.mark.parametrize("value", ["projectA", "session:", "", 7, "session:" + "x" * 80])
def test_session_block_must_name_a_session_note(client, value):
    status, out = call(client, "context.pack", session_block=value)
    assert status == 422 and list(out["error"]["fields"]) == ["session_block"]


# --- budgets ------------------------------------------------------------------------------------


def test_a_block_that_does_not_fit_is_dropped_whole_and_later_ones_still_fit(client):
    block(client, "a", "x" * 100, session_id="s-1", run_id="r")
    block(client, "b", "y" * 500, session_id="s-1")
    block(client, "c", "z" * 50)
    sizes = [len(tag("a", "x" * 100)), len(tag("b", "y" * 500)), len(tag("c", "z" * 50))]
    exact = sum(sizes) + 2  # two "\n" between three blocks
    whole = pack(client, session_id="s-1", run_id="r", working_memory_chars=exact)
    assert section(whole, "working_memory")["dropped"] == []
    assert whole["total_chars"] == exact

    # One character short: the last (broadest) block goes.
    short = pack(client, session_id="s-1", run_id="r", working_memory_chars=exact - 1)
    assert [d["block_key"] for d in section(short, "working_memory")["dropped"]] == ["c"]

    budget = sizes[0] + 1 + sizes[2] + 10
    out = pack(client, session_id="s-1", run_id="r", working_memory_chars=budget)
    memory = section(out, "working_memory")
    assert memory["dropped"] == [{"layer": "session", "block_key": "b", "chars": sizes[1]}]
    assert out["pack"] == tag("a", "x" * 100) + "\n" + tag("c", "z" * 50)
    assert memory["chars"] == len(out["pack"]) <= budget
    assert memory["budget"] == budget
    # Never cut mid-text: every kept block is whole.
    assert "yyy" not in out["pack"]

    nothing = pack(client, session_id="s-1", run_id="r", working_memory_chars=0)
    assert nothing["pack"] == "" and len(section(nothing, "working_memory")["dropped"]) == 3


def test_profile_sections_are_dropped_whole_for_their_budget(client):
    ok(client, "profile.set", label="persona", value="Terse.")
    ok(client, "profile.set", label="prefs", value="p" * 300, **USER)
    ok(client, "profile.set", label="tone", value="Warm.", **USER)
    first = '<profile label="persona">Terse.</profile>'
    last = '<profile label="tone" user_id="u-42">Warm.</profile>'
    out = pack(client, profile_chars=len(first) + 1 + len(last))
    profile = section(out, "profile")
    assert profile["labels"] == ["persona", "tone"]
    assert profile["dropped"] == [{
        "label": "prefs", "agent": "triage-bot",
        "chars": len('<profile label="prefs" user_id="u-42"></profile>') + 300,
    }]
    assert out["pack"] == first + "\n" + last
    assert pack(client, profile_chars=0)["pack"] == ""


@pytest.mark.parametrize("name", ["working_memory_chars", "profile_chars"])
@pytest.mark.parametrize("value", [-1, 262145, "100", 1.5, True])
def test_budgets_out_of_bounds_are_422_naming_the_field(client, name, value):
    status, out = call(client, "context.pack", **{name: value})
    assert status == 422 and list(out["error"]["fields"]) == [name]


def test_default_budgets_are_16384_characters(client):
    out = pack(client)
    assert [s["budget"] for s in out["sections"]] == [16384, 16384]
    for key in "abcde":
        block(client, key, key * 4000)  # 5 blocks of ~4 050 characters: the fifth does not fit
    memory = section(pack(client), "working_memory")
    assert [b["block_key"] for b in memory["blocks"]] == ["a", "b", "c", "d"]
    assert [d["block_key"] for d in memory["dropped"]] == ["e"]


# --- the stable prefix --------------------------------------------------------------------------


def test_the_prefix_is_working_memory_then_the_profile_and_its_hash_ignores_the_query(client):
    block(client, "state", "cursor: 4812", run_id="run-7")
    ok(client, "profile.set", label="persona", value="Terse.", **USER)
    one = pack(client, run_id="run-7", query="refund policy")
    two = pack(client, run_id="run-7", query="where is my parcel?")
    expected = (tag("state", "cursor: 4812") + "\n"
                + '<profile label="persona" user_id="u-42">Terse.</profile>')
    assert one["pack"] == two["pack"] == expected
    assert one["stable_prefix_chars"] == len(expected) == one["total_chars"]
    assert one["stable_hash"] == two["stable_hash"] == hashlib.sha256(
        expected.encode()).hexdigest()
    # No fact answers either question: the memories section is there, and empty.
    assert [(q["name"], q["chars"], q["memories"]) for q in one["query_sections"]] == [
        ("memories", 0, [])]
    assert one["notes"] == [] and pack(client, run_id="run-7")["notes"] == [NO_QUERY_SECTIONS]

    block(client, "state", "cursor: 4813", run_id="run-7")
    three = pack(client, run_id="run-7", query="refund policy")
    assert three["stable_hash"] != one["stable_hash"]
    ok(client, "profile.set", label="persona", value="Brief.", **USER)
    assert pack(client, run_id="run-7")["stable_hash"] not in (
        one["stable_hash"], three["stable_hash"])


def test_an_empty_pack(client):
    out = pack(client, query="anything")
    assert (out["pack"], out["total_chars"], out["stable_prefix_chars"]) == ("", 0, 0)
    assert out["stable_hash"] == hashlib.sha256(b"").hexdigest()
    assert [(s["name"], s["chars"]) for s in out["sections"]] == [
        ("working_memory", 0), ("profile", 0)]


def test_markdown_joins_the_sections_as_render_does(client):
    block(client, "state", "cursor", run_id="run-7")
    block(client, "habits", "agent text")
    ok(client, "profile.set", label="persona", value="Terse.")
    out = pack(client, run_id="run-7", format="markdown")
    assert out["pack"] == "## state\ncursor\n\n## habits\nagent text\n\n## persona\nTerse."
    assert call(client, "context.pack", format="html")[0] == 422


# --- the profile section ------------------------------------------------------------------------


def test_the_profile_section_is_what_profile_render_renders(client):
    ok(client, "profile.set", label="persona", value="from the console", agent="console")
    ok(client, "profile.set", label="style", value="mine", **USER)
    ok(client, "profile.set", label="other-user", value="not u-42", user_id="u-7")
    ok(client, "memory.set", key="facts", value={"tz": "CET"}, memory_type="profile", **USER)
    for body in ({}, {"scope": "this_agent"}, {"read_scope": "own_user"},
                 {"labels": ["style", "persona"]}, {"format": "markdown"}):
        rendered = ok(client, "profile.render", **USER, **body)
        out = pack(client, **body)
        assert out["pack"] == rendered["rendered"], body
        assert section(out, "profile")["labels"] == rendered["labels"], body
    # Every agent's sections by default (scope namespace); the caller's only with this_agent.
    assert "from the console" in pack(client)["pack"]
    assert "from the console" not in pack(client, scope="this_agent")["pack"]


def test_a_pack_counts_as_a_profile_read(app_factory):
    clock = FrozenClock()
    client = app_factory(clock=clock).test_client()
    pack(client, {"X-Loom-Client": "desktop-client/1.2"}, query="q")
    entries = ok(client, "profile.activity", **USER)["entries"]
    assert [(e["agent"], e["client"], e["op"]) for e in entries] == [
        ("triage-bot", "desktop-client/1.2", "context.pack")]
    assert entries[0]["last_read_at"] == "2027-01-15T08:00:00Z"


# --- reach --------------------------------------------------------------------------------------


def test_a_token_bound_to_a_session_reads_no_agent_layer_of_its_user(app_factory):
    client = auth_app(app_factory).test_client()
    admin = bearer(mint(client, namespace="support", role="admin"))
    for scope in ({"session_id": "s-1"}, {}):
        ok(client, "working_memory.set", admin, block_key="k", content=f"at {scope}",
           **USER, **scope)
    assert pack(client, admin, session_id="s-1")["pack"].count("<working-memory") == 2
    bound = bearer(mint(client, namespace="support", role="viewer", session_id="s-1",
                        read_user_id="u-42"))
    out = pack(client, bound)
    assert out["pack"] == tag("k", "at {'session_id': 's-1'}")
    viewer = bearer(mint(client, namespace="support", role="viewer", read_scope="own_user"))
    assert call(client, "context.pack", viewer, read_scope="namespace")[0] == 403


def test_agent_state_never_enters_a_pack(client):
    ok(client, "features.set", agent=None, features={"agent_state": True})
    types = [{"type": "triage_state", "ownership": "agent", "fields": {"step": {"type": "string"}},
              "agent_state": {"scope": "conversation"}}]
    ok(client, "object_types.set", agent=None, types=types)
    response = client.put("/v1/agent-state", json={
        **NS, "scope": {"kind": "conversation", "id": "s-1"}, "body": {"step": "STATE-MARKER"}})
    assert response.get_json()["stored"] is True
    block(client, "state", "cursor", session_id="s-1")
    out = pack(client, session_id="s-1", query="STATE-MARKER")
    assert "STATE-MARKER" not in out["pack"]
    assert out["pack"] == tag("state", "cursor")


def test_the_querys_facts_follow_the_prefix_which_stays_the_same(client):
    block(client, "state", "cursor: 4812", run_id="run-7")
    ok(client, "profile.set", label="persona", value="Terse.", **USER)
    ok(client, "memory.set", key="refunds", value="Refunds take 5 days & need a receipt.",
       **USER)
    ok(client, "memory.set", key="parcel", value="The parcel ships from Leeds.", **USER)
    ok(client, "memory.set", key="other", value="Likes green tea.", **USER)
    base = pack(client, run_id="run-7", read_scope="own_user")
    one = pack(client, run_id="run-7", query="how long do refunds take", read_scope="own_user")
    two = pack(client, run_id="run-7", query="where does my parcel ship from",
               read_scope="own_user")
    prefix = base["pack"]
    assert one["stable_hash"] == two["stable_hash"] == base["stable_hash"]
    assert one["stable_prefix_chars"] == two["stable_prefix_chars"] == len(prefix)
    refunds = ok(client, "memory.get", key="refunds", **USER)["memory"]["memory_id"]
    assert one["pack"] == prefix + "\n" + (
        f'<memory key="refunds" memory_id="{refunds}">'
        "Refunds take 5 days &amp; need a receipt.</memory>")
    assert two["pack"].startswith(prefix + "\n") and "Leeds" in two["pack"]
    assert "Refunds" not in two["pack"] and "green tea" not in one["pack"]
    (memories,) = one["query_sections"]
    assert memories["name"] == "memories" and memories["budget"] == 8192
    assert [m["key"] for m in memories["memories"]] == ["refunds"]
    assert one["total_chars"] == len(one["pack"])
    # Profile rows never come back as facts, and a budget drops a fact whole.
    small = pack(client, run_id="run-7", query="refunds receipt parcel", read_scope="own_user",
                 memory_chars=60, format="markdown")
    (section,) = small["query_sections"]
    assert [m["key"] for m in section["memories"]] == ["refunds"]
    assert [d["key"] for d in section["dropped"]] == ["parcel"]
    assert small["pack"].endswith("- refunds: Refunds take 5 days & need a receipt.")
