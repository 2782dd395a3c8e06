"""profile.set / append / replace / render / activity (seed 003) through the Flask app."""

from __future__ import annotations

import hashlib
import json

import pytest

from app.clock import FrozenClock
from tests.auth_support import auth_app, bearer, mint
from tests.support.api import op_helpers

NS = {"namespace": "support", "agent": "triage-bot"}
call, ok = op_helpers(NS)
WRITE_FIELDS = {"version", "version_text", "memory_id", "content_sha256", "namespace", "label",
                "char_limit", "value_length", "ignored_args"}


def canonical(text):
    return json.dumps(text, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def section(client, label, **identity):
    out = ok(client, "memory.get", key=label, memory_type="profile", **identity)
    return out["memory"]["value"] if out["found"] else None


# --- profile.set -------------------------------------------------------------------------------


def test_set_answers_every_field(client):
    out = ok(client, "profile.set", label="persona", value="Terse. Cite ticket ids.")
    assert set(out) == WRITE_FIELDS
    assert out["namespace"] == "support" and out["label"] == "persona"
    assert out["char_limit"] == 8192
    assert out["value_length"] == len('"Terse. Cite ticket ids."')
    expected_sha = hashlib.sha256(canonical("Terse. Cite ticket ids.").encode()).hexdigest()
    assert out["content_sha256"] == expected_sha
    assert out["memory_id"].startswith("mem_") and out["version"] > 10**18
    assert out["version_text"] == str(out["version"])  # above 2^53: exact only as text
    assert section(client, "persona") == "Terse. Cite ticket ids."


def test_set_replaces_and_history_keeps_prior_versions(client):
    first = ok(client, "profile.set", label="persona", value="one")
    second = ok(client, "profile.set", label="persona", value="two")
    assert second["memory_id"] == first["memory_id"] and second["version"] > first["version"]
    history = ok(client, "memory.history", key="persona")["versions"]
    assert [v["value"] for v in history] == ["two", "one"]
    assert all(v["memory_type"] == "profile" for v in history)


@pytest.mark.parametrize(
    "text,length",
    [
        ("", 2),
        ("é" * 10, 12),  # non-ASCII is kept: one character each
        ("日本語", 5),
        ("😀", 3),  # one code point
        ('say "hi"', 12),  # each quote is escaped: two characters
        ("a\nb", 6),  # a newline is \n: two characters
        ("\u0001", 8),  # a control character is \u0001: six characters
    ],
)
def test_value_length_is_the_canonical_json_length(client, text, length):
    out = ok(client, "profile.set", label="l", value=text)
    assert out["value_length"] == length == len(canonical(text))


def test_the_default_cap_is_measured_on_canonical_json_with_non_ascii(client):
    out = ok(client, "profile.set", label="l", value="é" * 8190)
    assert out["value_length"] == 8192
    status, out = call(client, "profile.set", label="l", value="é" * 8191)
    assert status == 422 and out["error"]["code"] == "CHAR_LIMIT_EXCEEDED"
    assert out["error"]["value_length"] == 8193 and out["error"]["char_limit"] == 8192
    # 4095 newlines encode as 8190 characters, plus the quotes: 8192.
    assert ok(client, "profile.set", label="n", value="\n" * 4095)["value_length"] == 8192
    status, _ = call(client, "profile.set", label="n", value="\n" * 4096)
    assert status == 422


def test_char_limit_set_kept_and_refused(client):
    out = ok(client, "profile.set", label="l", value="abc", char_limit=10)
    assert out["char_limit"] == 10
    assert ok(client, "profile.set", label="l", value="12345678", char_limit=10)["char_limit"] == 10
    status, out = call(client, "profile.set", label="l", value="123456789", char_limit=10)
    assert status == 422 and out["error"]["value_length"] == 11
    assert out["error"]["char_limit"] == 10
    assert section(client, "l") == "12345678"
    # Left out, the seed's default (8,192) applies.
    assert ok(client, "profile.set", label="l", value="123456789")["char_limit"] == 8192
    assert ok(client, "profile.set", label="l", value="x" * 20, char_limit=30)["char_limit"] == 30


@pytest.mark.parametrize(
    "field,value",
    [("char_limit", 0), ("char_limit", 65537), ("char_limit", "100"), ("value", 5),
     ("value", None), ("label", ""), ("label", "a\tb"), ("label", "k" * 513),
     ("source_trace", "memory.delete_version:1800000000000000000"),
     ("if_match_sha256", "a" * 65)],
)
def test_bad_set_fields_are_422_naming_the_field(client, field, value):
    status, out = call(client, "profile.set", **{"label": "l", "value": "v", field: value})
    assert status == 422 and field in out["error"]["fields"], out
    assert section(client, "l") is None


def test_label_and_value_are_required(client):
    status, out = call(client, "profile.set")
    assert status == 422 and {"label", "value"} <= set(out["error"]["fields"])


def test_source_trace_is_stored(client):
    ok(client, "profile.set", label="l", value="v", source_trace="dashboard:edit")
    row = ok(client, "memory.get", key="l")["memory"]
    assert row["source_trace"] == "dashboard:edit" and row["memory_type"] == "profile"
    assert row["actor"] == "triage-bot"


def test_if_match_sha256(client):
    first = ok(client, "profile.set", label="l", value="one")
    status, out = call(client, "profile.set", label="l", value="two", if_match_sha256="f" * 64)
    assert status == 409 and out["error"]["code"] == "HASH_MISMATCH"
    assert section(client, "l") == "one"
    second = ok(client, "profile.set", label="l", value="two",
                if_match_sha256=first["content_sha256"])
    status, _ = call(client, "profile.set", label="l", value="three",
                     if_match_sha256=first["content_sha256"])
    assert status == 409
    ok(client, "profile.set", label="l", value="three", if_match_sha256=second["content_sha256"])
    assert section(client, "l") == "three"
    status, _ = call(client, "profile.set", label="new", value="x", if_match_sha256="a" * 64)
    assert status == 409 and section(client, "new") is None


def test_a_key_holding_a_fact_is_not_a_section(client):
    ok(client, "memory.set", key="persona", value="a fact")
    for op_name, extra in (("profile.set", {"value": "v"}),
                           ("profile.append", {"addition": "v"})):
        status, out = call(client, op_name, label="persona", **extra)
        assert status == 409 and out["error"]["code"] == "MEMORY_TYPE_MISMATCH", op_name
    status, out = call(client, "profile.replace", label="persona", old="fact", new="x")
    assert status == 404
    assert ok(client, "memory.get", key="persona")["memory"]["value"] == "a fact"


# --- profile.append ----------------------------------------------------------------------------


def test_append_creates_with_the_default_cap_then_appends(client):
    out = ok(client, "profile.append", label="prefs", addition="Prefers EUR invoices.")
    assert set(out) == WRITE_FIELDS
    assert out["char_limit"] == 8192 and out["value_length"] == len('"Prefers EUR invoices."')
    ok(client, "profile.append", label="prefs", addition="Writes in German.")
    last = ok(client, "profile.append", label="prefs", addition="No calls.", separator=" | ")
    value = "Prefers EUR invoices.\nWrites in German. | No calls."
    assert section(client, "prefs") == value
    assert last["value_length"] == len(canonical(value))
    assert last["content_sha256"] == hashlib.sha256(canonical(value).encode()).hexdigest()
    history = ok(client, "memory.history", key="prefs")["versions"]
    assert [v["value"] for v in history] == [
        value, "Prefers EUR invoices.\nWrites in German.", "Prefers EUR invoices."
    ]


def test_append_keeps_the_sections_cap_and_refuses_past_it(client):
    ok(client, "profile.set", label="l", value="12345", char_limit=12)
    out = ok(client, "profile.append", label="l", addition="67", separator=" ")
    assert out["char_limit"] == 12 and out["value_length"] == 10
    status, out = call(client, "profile.append", label="l", addition="xyz")
    assert status == 422 and out["error"]["code"] == "CHAR_LIMIT_EXCEEDED"
    # "12345 67\nxyz": the newline is two characters in JSON, plus the quotes.
    assert (out["error"]["value_length"], out["error"]["char_limit"]) == (15, 12)
    assert section(client, "l") == "12345 67"


def test_append_over_the_default_cap_on_a_new_section_writes_nothing(client):
    status, out = call(client, "profile.append", label="l", addition="x" * 8191)
    assert status == 422 and out["error"]["char_limit"] == 8192
    assert section(client, "l") is None


def test_append_after_a_delete_starts_over(client):
    ok(client, "profile.set", label="l", value="old", char_limit=50)
    ok(client, "memory.delete", key="l", memory_type="profile")
    out = ok(client, "profile.append", label="l", addition="new")
    assert section(client, "l") == "new" and out["value_length"] == 5


def test_append_requires_label_and_addition(client):
    status, out = call(client, "profile.append")
    assert status == 422 and {"label", "addition"} <= set(out["error"]["fields"])


# --- profile.replace ---------------------------------------------------------------------------


def test_replace_every_occurrence(client):
    ok(client, "profile.set", label="l", value="EUR, then EUR again")
    out = ok(client, "profile.replace", label="l", old="EUR", new="CHF")
    assert set(out) == WRITE_FIELDS
    assert section(client, "l") == "CHF, then CHF again"
    assert out["value_length"] == len(canonical("CHF, then CHF again"))
    ok(client, "profile.replace", label="l", old=" again", new="")
    assert section(client, "l") == "CHF, then CHF"


def test_replace_errors(client):
    status, out = call(client, "profile.replace", label="missing", old="a", new="b")
    assert status == 404 and out["error"]["code"] == "PROFILE_SECTION_NOT_FOUND"
    ok(client, "profile.set", label="l", value="abc", char_limit=6)
    status, out = call(client, "profile.replace", label="l", old="zzz", new="b")
    assert status == 422 and out["error"]["code"] == "SUBSTRING_NOT_FOUND"
    status, out = call(client, "profile.replace", label="l", old="b", new="long")
    assert status == 422 and out["error"]["code"] == "CHAR_LIMIT_EXCEEDED"
    for body in ({"old": "", "new": "x"}, {"old": "a"}):
        status, out = call(client, "profile.replace", label="l", **body)
        assert status == 422 and out["error"]["code"] == "VALIDATION_ERROR"
    assert section(client, "l") == "abc"


def test_a_locked_section_refuses_set_append_and_replace(client):
    ok(client, "profile.set", label="l", value="keep")
    ok(client, "memory.lock", key="l")
    for op_name, extra in (("profile.set", {"value": "x"}),
                           ("profile.append", {"addition": "x"}),
                           ("profile.replace", {"old": "keep", "new": "x"})):
        status, out = call(client, op_name, label="l", **extra)
        assert status == 409 and out["error"]["code"] == "MEMORY_LOCKED", op_name
    ok(client, "memory.unlock", key="l")
    ok(client, "profile.append", label="l", addition="more")
    history = ok(client, "memory.history", key="l")["versions"]
    assert [(v["value"], v["locked"]) for v in history] == [
        ("keep\nmore", False), ("keep", False), ("keep", True), ("keep", False)
    ]


def test_history_after_set_append_replace_and_lock(client):
    ok(client, "profile.set", label="l", value="a")
    ok(client, "profile.append", label="l", addition="b")
    ok(client, "profile.replace", label="l", old="b", new="c")
    ok(client, "memory.lock", key="l")
    versions = ok(client, "memory.history", key="l")["versions"]
    assert [v["value"] for v in versions] == ["a\nc", "a\nc", "a\nb", "a"]
    assert [v["locked"] for v in versions] == [True, False, False, False]
    numbers = [v["version"] for v in versions]
    assert numbers == sorted(numbers, reverse=True) and len(set(numbers)) == 4


# --- the SDK's get / list / delete ---------------------------------------------------------------


def test_memory_ops_serve_the_sdk_section_wrappers(client):
    ok(client, "profile.set", label="persona", value="Terse.")
    ok(client, "profile.set", label="prefs", value="EUR.")
    ok(client, "memory.set", key="fact", value="not a section")
    got = ok(client, "memory.get", key="persona", memory_type="profile")
    assert got["found"] and got["memory"]["value"] == "Terse."
    listed = ok(client, "memory.list", memory_type="profile")["memories"]
    assert [row["key"] for row in listed] == ["persona", "prefs"]
    assert ok(client, "memory.delete", key="persona", memory_type="profile")["deleted"] is True
    assert ok(client, "profile.render")["labels"] == ["prefs"]
    assert ok(client, "memory.get", key="persona", memory_type="profile")["found"] is False


# --- profile.render ----------------------------------------------------------------------------


def test_render_formats_exactly(client):
    ok(client, "profile.set", label="persona", value="Terse.", user_id="-")
    ok(client, "profile.set", label="prefs", value="EUR & CHF", user_id="u-42")
    xml = ok(client, "profile.render", user_id="u-42", read_scope="own_user")
    assert xml["rendered"] == (
        '<profile label="persona">Terse.</profile>\n'
        '<profile label="prefs" user_id="u-42">EUR &amp; CHF</profile>'
    )
    assert xml["section_count"] == 2 and xml["labels"] == ["persona", "prefs"]
    assert xml["total_chars"] == len(xml["rendered"])
    md = ok(client, "profile.render", user_id="u-42", read_scope="own_user", format="markdown")
    assert md["rendered"] == "## persona\nTerse.\n\n## prefs\nEUR & CHF"
    assert md["total_chars"] == len(md["rendered"])
    status, out = call(client, "profile.render", format="html")
    assert status == 422 and "format" in out["error"]["fields"]


def test_render_escapes_labels_in_attributes(client):
    ok(client, "profile.set", label='a"<b', value="v")
    assert ok(client, "profile.render")["rendered"] == '<profile label="a&quot;&lt;b">v</profile>'


def test_render_of_nothing_is_empty(client):
    out = ok(client, "profile.render")
    assert (out["rendered"], out["section_count"], out["total_chars"], out["labels"]) == (
        "", 0, 0, []
    )


def test_render_labels_in_the_given_order(client):
    for label in ("a", "b", "c"):
        ok(client, "profile.set", label=label, value=label.upper())
    out = ok(client, "profile.render", labels=["c", "missing", "a", "c"])
    assert out["labels"] == ["c", "a"]
    assert out["rendered"] == '<profile label="c">C</profile>\n<profile label="a">A</profile>'
    assert ok(client, "profile.render", labels=[])["section_count"] == 0
    status, out = call(client, "profile.render", labels=["x"] * 101)
    assert status == 422 and "labels" in out["error"]["fields"]


def test_render_spans_every_agent_unless_this_agent(client):
    ok(client, "profile.set", label="persona", value="from the console", agent="console")
    ok(client, "profile.set", label="style", value="mine")
    everyone = ok(client, "profile.render")
    assert everyone["labels"] == ["persona", "style"]
    mine = ok(client, "profile.render", scope="this_agent")
    assert mine["labels"] == ["style"] and "console" not in mine["rendered"]
    status, out = call(client, "profile.render", scope="everyone")
    assert status == 422 and "scope" in out["error"]["fields"]


def test_render_read_scopes_across_users_and_session_ids(client):
    ok(client, "profile.set", label="ns", value="namespace-level")
    ok(client, "profile.set", label="u42", value="user 42", user_id="u-42")
    ok(client, "profile.set", label="u7", value="user 7", user_id="u-7", agent="other-bot")
    ok(client, "profile.set", label="s1", value="s-1 text", user_id="u-42", session_id="s-1")
    ok(client, "profile.set", label="s2", value="s-2 text", user_id="u-42", session_id="s-2")
    ok(client, "profile.set", label="anon", value="anonymous s-1 text", session_id="s-1")

    everything = ok(client, "profile.render", user_id="u-42")  # read_scope namespace
    assert sorted(everything["labels"]) == ["anon", "ns", "s1", "s2", "u42", "u7"]
    own_user = ok(client, "profile.render", user_id="u-42", read_scope="own_user")
    assert sorted(own_user["labels"]) == ["ns", "s1", "s2", "u42"]
    own_session = ok(client, "profile.render", user_id="u-42", session_id="s-1",
                     read_scope="own_session")
    # Rows of that session_id (its user's and user '-') and the namespace-level ones.
    assert sorted(own_session["labels"]) == ["anon", "ns", "s1"]
    other = ok(client, "profile.render", user_id="u-7", read_scope="own_user", scope="this_agent")
    assert other["labels"] == ["ns"]  # u7's section is other-bot's


def test_render_orders_namespace_sections_before_user_and_session_ones(client):
    ok(client, "profile.set", label="p", value="by-session-id", user_id="u-42", session_id="s-1")
    ok(client, "profile.set", label="p", value="user", user_id="u-42")
    ok(client, "profile.set", label="p", value="namespace")
    out = ok(client, "profile.render", user_id="u-42", session_id="s-1",
             read_scope="own_session")
    assert out["labels"] == ["p", "p"]
    assert out["rendered"].index("namespace") < out["rendered"].index("by-session-id")
    out = ok(client, "profile.render", user_id="u-42", read_scope="own_user")
    assert [line.split(">")[1].split("<")[0] for line in out["rendered"].split("\n")] == [
        "namespace", "user", "by-session-id"
    ]


def test_render_leaves_out_deleted_redacted_and_expired_sections(client):
    ok(client, "profile.set", label="gone", value="x")
    ok(client, "memory.delete", key="gone")
    ok(client, "profile.set", label="scrubbed", value="secret")
    ok(client, "memory.redact", key="scrubbed")
    ok(client, "memory.set", key="expired", value="old", memory_type="profile",
       valid_at="2000-01-01T00:00:00Z", valid_to="2001-01-01T00:00:00Z")
    ok(client, "memory.set", key="structured", value={"b": 1, "a": "é"}, memory_type="profile")
    out = ok(client, "profile.render")
    assert out["labels"] == ["structured"]
    assert out["rendered"] == '<profile label="structured">{"a":"é","b":1}</profile>'


def test_render_refuses_a_scope_above_the_tokens(app_factory):
    client = auth_app(app_factory).test_client()
    token = mint(client, namespace="support", role="viewer", read_scope="own_user")
    status, out = call(client, "profile.render", bearer(token), read_scope="namespace")
    assert status == 403 and out["error"]["code"] == "AUTH_INSUFFICIENT"
    assert call(client, "profile.render", bearer(token))[0] == 200


def test_a_token_pinned_to_a_user_renders_only_that_user(app_factory):
    client = auth_app(app_factory).test_client()
    admin = mint(client, namespace="support", role="admin")
    ok(client, "profile.set", bearer(admin), label="theirs", value="v", user_id="u-7")
    ok(client, "profile.set", bearer(admin), label="ns", value="v")
    pinned = mint(client, namespace="support", role="viewer", read_user_id="u-42")
    assert ok(client, "profile.render", bearer(pinned))["labels"] == ["ns"]


def test_writer_and_viewer_roles(app_factory):
    client = auth_app(app_factory).test_client()
    viewer = mint(client, namespace="support", role="viewer")
    writer = mint(client, namespace="support", role="writer")
    for op_name, body in (("profile.set", {"label": "l", "value": "v"}),
                          ("profile.append", {"label": "l", "addition": "v"}),
                          ("profile.replace", {"label": "l", "old": "v", "new": "w"})):
        status, out = call(client, op_name, bearer(viewer), **body)
        assert status == 403 and out["error"]["code"] == "AUTH_INSUFFICIENT", op_name
        assert call(client, op_name, bearer(writer), **body)[0] == 200, op_name
    assert call(client, "profile.render", bearer(viewer))[0] == 200
    assert call(client, "profile.activity", bearer(viewer))[0] == 200


# --- profile.activity --------------------------------------------------------------------------


def activity(client, **body):
    return ok(client, "profile.activity", user_id="u-42", **body)["entries"]


def test_reads_are_recorded_per_agent_and_client(app_factory):
    clock = FrozenClock()
    client = app_factory(clock=clock).test_client()
    written = ok(client, "profile.set", label="persona", value="v", user_id="u-42")
    assert activity(client) == []  # writes are not reads
    ok(client, "profile.render", {"X-Loom-Client": "desktop-client/1.2"}, user_id="u-42")
    clock.advance(5)
    got = ok(client, "memory.get", {"User-Agent": "cursor/0.4"},
             memory_id=written["memory_id"], user_id="u-42", agent="ide-bot")
    assert got["found"]
    clock.advance(5)
    ok(client, "memory.set", key="fact", value="v", user_id="u-42")
    ok(client, "memory.get", {"X-Loom-Client": "not-a-profile-read"}, key="fact", user_id="u-42")
    entries = activity(client)
    assert [(e["agent"], e["client"], e["op"]) for e in entries] == [
        ("ide-bot", "cursor/0.4", "memory.get"),
        ("triage-bot", "desktop-client/1.2", "profile.render"),
    ]
    assert entries[0]["last_read_at"] == "2027-01-15T08:00:05Z"
    # Another read by the same agent and client moves its one entry to the front.
    clock.advance(5)
    ok(client, "profile.render", {"X-Loom-Client": "desktop-client/1.2"}, user_id="u-42")
    entries = activity(client)
    assert [e["agent"] for e in entries] == ["triage-bot", "ide-bot"]
    assert ok(client, "profile.activity", user_id="u-7")["entries"] == []


def test_the_console_is_known_by_its_in_process_call_never_by_a_header(app_factory):
    client = app_factory(clock=FrozenClock()).test_client()
    ok(client, "profile.set", label="persona", value="v", user_id="u-42")
    ok(client, "profile.render", {"X-Loom-Client": "loom-console"}, user_id="u-42",
       agent="dashboard")
    ok(client, "profile.render", {"User-Agent": "loom-console/9"}, user_id="u-42",
       agent="dashboard-ua")
    assert sorted((e["agent"], e["client"]) for e in activity(client)) == [
        ("dashboard", "loom-console"), ("dashboard-ua", "loom-console/9")]
    # The console's own page reads the profile in process, and is left out.
    page = client.get("/console/ns/support/user", query_string={"user_id": "u-42"})
    assert page.status_code == 200 and "persona" in page.get_data(as_text=True)
    assert len(activity(client)) == 2


def test_activity_answers_at_most_twenty_most_recent_first(app_factory):
    clock = FrozenClock()
    client = app_factory(clock=clock).test_client()
    for i in range(25):
        ok(client, "profile.render", {"X-Loom-Client": f"client-{i:02d}"}, user_id="u-42")
        clock.advance(1)
    entries = activity(client)
    assert [e["client"] for e in entries] == [f"client-{i:02d}" for i in range(24, 4, -1)]


def test_lookback_days_default_and_cap(app_factory):
    clock = FrozenClock()
    client = app_factory(clock=clock).test_client()
    ok(client, "profile.render", {"X-Loom-Client": "old"}, user_id="u-42")
    clock.advance(8 * 86400)
    ok(client, "profile.render", {"X-Loom-Client": "new"}, user_id="u-42")
    assert [e["client"] for e in activity(client)] == ["new"]  # default 7 days
    assert [e["client"] for e in activity(client, lookback_days=9)] == ["new", "old"]
    clock.advance(23 * 86400)  # "old" is now 31 days back, "new" 23
    assert [e["client"] for e in activity(client, lookback_days=365)] == ["new"]  # capped at 30
    for bad in (0, -1, "7", 2.5):
        status, out = call(client, "profile.activity", user_id="u-42", lookback_days=bad)
        assert status == 422 and "lookback_days" in out["error"]["fields"]
