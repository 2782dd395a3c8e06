"""The console at /console through the Flask app over a real redis-server.

Signing in, the cookie, CSRF, and each page's reads and writes, which go through the op path
(role, reach, validation) and as the console client. The same flows in a real browser are in
``test_console_browser.py``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.auth_support import ADMIN_TOKEN, auth_app, bearer, mint
from tests.console_support import AGENT, NS, SECRET_OFFER, USER, agent_state_calls
from tests.support.api import op_helpers
from tests.support.erasure_worker import run_erasure_jobs

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


class Console:
    """A browser-like client of the console: keeps the cookie, sends each form's CSRF token."""

    def __init__(self, client) -> None:
        self.client = client
        self.csrf = ""

    def get(self, url: str, **options: Any):
        response = self.client.get(url, **options)
        found = CSRF.search(response.get_data(as_text=True))
        if found:
            self.csrf = found.group(1)
        return response

    def post(self, url: str, data: dict[str, Any], csrf: bool = True):
        if csrf:
            data = {"csrf_token": self.csrf, **data}
        return self.client.post(url, data=data)

    def sign_in(self, token: str):
        self.get("/console/sign-in")
        response = self.post("/console/sign-in", {"token": token, "next": "/console/"})
        if response.status_code == 302:
            self.get("/console/")  # the CSRF token changes with the sign-in
        return response


def desktop_client(token: str | None) -> dict[str, str]:
    """A desktop client's headers, signed in as ``token`` (the install admin unless given)."""
    return {**bearer(token or ADMIN_TOKEN), "X-Loom-Client": "desktop-app"}


_, ok = op_helpers(headers_for=desktop_client)


def text(response) -> str:
    return response.get_data(as_text=True)


@pytest.fixture
def app(app_factory):
    return auth_app(app_factory)


@pytest.fixture
def writer(client) -> str:
    return mint(client, namespace=NS, role="writer", label="console writer")


def persona(client, value: str = "Terse.") -> dict[str, Any]:
    return ok(client, "profile.set", namespace=NS, agent=AGENT, label="persona", value=value)


def section_url(agent: str = AGENT, label: str = "persona") -> str:
    return f"/console/ns/{NS}/section?agent={agent}&label={label}"


def test_pages_need_a_sign_in_and_a_refused_token_is_said_in_words(client):
    response = client.get(f"/console/ns/{NS}")
    assert response.status_code == 302
    assert response.headers["Location"].startswith(f"/console/sign-in?next=/console/ns/{NS}")
    console = Console(client)
    refused = console.sign_in("loom_nope_nope")
    assert refused.status_code == 401
    assert "That token was refused" in text(refused)


def test_the_session_cookie_is_signed_httponly_strict_and_sign_out_clears_it(client, writer):
    console = Console(client)
    signed_in = console.sign_in(writer)
    assert signed_in.status_code == 302
    cookie = signed_in.headers["Set-Cookie"]
    assert cookie.startswith("loom_console=")
    for flag in ("HttpOnly", "SameSite=Strict", "Path=/console"):
        assert flag in cookie
    assert console.get(f"/console/ns/{NS}").status_code == 200
    # A cookie whose signature does not match is no session at all.
    client.set_cookie("loom_console", cookie.split(";")[0].split("=", 1)[1][:-2] + "xx",
                      path="/console")
    assert client.get(f"/console/ns/{NS}").status_code == 302
    console.sign_in(writer)
    assert console.post("/console/sign-out", {}).status_code == 302
    assert client.get(f"/console/ns/{NS}").status_code == 302


def test_a_form_without_its_csrf_token_is_refused_and_changes_nothing(client, writer):
    persona(client, "Terse.")
    console = Console(client)
    console.sign_in(writer)
    refused = console.post(f"/console/ns/{NS}/section",
                           {"agent": AGENT, "label": "persona", "value": "Chatty."}, csrf=False)
    assert refused.status_code == 400
    assert "security token (CSRF)" in text(refused)
    forged = console.post(f"/console/ns/{NS}/section",
                          {"agent": AGENT, "label": "persona", "value": "Chatty.",
                           "csrf_token": "forged"}, csrf=False)
    assert forged.status_code == 400
    got = ok(client, "memory.get", namespace=NS, agent=AGENT, key="persona")
    assert got["memory"]["value"] == "Terse."


def test_a_writer_edits_the_persona_and_profile_render_serves_it(client, writer):
    persona(client, "Terse.")
    console = Console(client)
    console.sign_in(writer)
    page = console.get(section_url())
    sha = re.search(r'name="if_match_sha256" value="([0-9a-f]+)"', text(page)).group(1)
    saved = console.post(f"/console/ns/{NS}/section", {
        "agent": AGENT, "label": "persona", "user_id": "-", "session_id": "-",
        "value": "Terse. Cite ticket ids.", "if_match_sha256": sha,
    })
    assert saved.status_code == 302
    rendered = ok(client, "profile.render", namespace=NS, agent="other-bot")["rendered"]
    assert rendered == '<profile label="persona">Terse. Cite ticket ids.</profile>'
    # The page the save leads back to confirms it; the same page opened plainly does not.
    back = text(console.get(saved.headers["Location"]))
    assert 'id="saved">Saved section <code>persona</code>.' in back
    assert 'id="saved"' not in text(console.get(f"/console/ns/{NS}"))


def test_an_edit_from_a_stale_page_is_refused_and_shows_the_current_text(client, writer):
    persona(client, "Terse.")
    console = Console(client)
    console.sign_in(writer)
    page = console.get(section_url())
    stale_sha = re.search(r'name="if_match_sha256" value="([0-9a-f]+)"', text(page)).group(1)
    persona(client, "Written elsewhere meanwhile.")
    refused = console.post(f"/console/ns/{NS}/section", {
        "agent": AGENT, "label": "persona", "value": "My edit.", "if_match_sha256": stale_sha,
    })
    assert refused.status_code == 409
    body = text(refused)
    assert "changed since you opened it" in body
    assert re.search(r'id="current-text">Written elsewhere meanwhile\.<', body)
    assert ">My edit.</textarea>" in body
    got = ok(client, "memory.get", namespace=NS, agent=AGENT, key="persona")
    assert got["memory"]["value"] == "Written elsewhere meanwhile."
    # Saving again from the refused page sends the current hash, and wins.
    fresh = re.search(r'name="if_match_sha256" value="([0-9a-f]+)"', body).group(1)
    assert fresh == got["memory"]["content_sha256"]
    assert console.post(f"/console/ns/{NS}/section", {
        "agent": AGENT, "label": "persona", "value": "My edit.", "if_match_sha256": fresh,
    }).status_code == 302


def test_sections_are_created_and_deleted_and_a_duplicate_create_is_refused(client, writer):
    console = Console(client)
    console.sign_in(writer)
    console.get(f"/console/ns/{NS}")
    created = console.post(f"/console/ns/{NS}/sections",
                           {"agent": AGENT, "label": "tone", "value": "Warm."})
    assert created.status_code == 302
    page = text(console.get(f"/console/ns/{NS}"))
    assert "tone" in page and "Warm." in page
    again = console.post(f"/console/ns/{NS}/sections",
                         {"agent": AGENT, "label": "tone", "value": "Cold."})
    assert again.status_code == 422
    assert "already exists" in text(again)
    deleted = console.post(f"/console/ns/{NS}/section/delete",
                           {"agent": AGENT, "label": "tone", "user_id": "-", "session_id": "-"})
    assert deleted.status_code == 302
    got = ok(client, "memory.get", namespace=NS, agent=AGENT, key="tone")
    assert not got["found"] or got["memory"]["deleted"]


def test_a_viewer_sees_sections_but_an_edit_is_refused_in_words(client):
    persona(client, "Terse.")
    viewer = mint(client, namespace=NS, role="viewer")
    console = Console(client)
    console.sign_in(viewer)
    page = text(console.get(f"/console/ns/{NS}"))
    assert "Terse." in page and "New section" not in page
    edit_page = text(console.get(section_url()))
    assert "it can read this section but not change it" in edit_page
    refused = console.post(f"/console/ns/{NS}/section",
                           {"agent": AGENT, "label": "persona", "value": "Chatty."})
    assert refused.status_code == 403
    assert "profile.set needs the writer role; this token has viewer" in text(refused)
    got = ok(client, "memory.get", namespace=NS, agent=AGENT, key="persona")
    assert got["memory"]["value"] == "Terse."


def test_a_token_of_one_namespace_is_refused_another_namespace(client, writer):
    console = Console(client)
    console.sign_in(writer)
    page = console.get("/console/ns/elsewhere")
    assert "namespace &#39;elsewhere&#39; is outside this token&#39;s reach" in text(page)


def test_console_reads_stay_out_of_profile_activity(client, writer):
    ok(client, "profile.set", namespace=NS, agent=AGENT, user_id=USER, label="likes",
        value="Tea.")
    console = Console(client)
    console.sign_in(writer)
    assert console.get(f"/console/ns/{NS}/user?user_id={USER}").status_code == 200
    entries = ok(client, "profile.activity", namespace=NS, agent=AGENT, user_id=USER)["entries"]
    assert entries == []
    # A read by another client is recorded, and the console shows it.
    ok(client, "profile.render", namespace=NS, agent=AGENT, user_id=USER)
    page = text(console.get(f"/console/ns/{NS}/user?user_id={USER}"))
    entries = ok(client, "profile.activity", namespace=NS, agent=AGENT, user_id=USER)["entries"]
    assert [(e["agent"], e["client"]) for e in entries] == [(AGENT, "desktop-app")]
    assert "desktop-app" in page


def _agent_state(client, user_id: str = USER) -> None:
    for method, path, body in agent_state_calls(user_id):
        response = client.open(path, method=method, json=body, headers=bearer(ADMIN_TOKEN))
        assert response.status_code == 200, response.get_json()
        if method == "PUT":
            assert response.get_json()["stored"] is True


def test_the_working_memory_tab_shows_size_and_version_never_content(client):
    _agent_state(client)
    reader = mint(client, namespace=NS, role="viewer", scopes=["agent_state"])
    console = Console(client)
    console.sign_in(reader)
    page = text(console.get(f"/console/ns/{NS}/user?user_id={USER}"))
    listed = client.get(f"/v1/profiles/{USER}/agent-state?namespace={NS}",
                        headers=bearer(ADMIN_TOKEN)).get_json()
    assert listed["count"] == 1
    state = listed["states"][0]
    table = page.split('id="agent-states"', 1)[1].split("</table>", 1)[0]
    assert f"<td>{state['size_bytes']}</td><td>{state['version']}</td>" in table
    assert "shop_guide" in table
    assert SECRET_OFFER not in page and "offer" not in table


def test_a_token_without_the_agent_state_scope_is_told_so(client, writer):
    _agent_state(client)
    console = Console(client)
    console.sign_in(writer)
    page = text(console.get(f"/console/ns/{NS}/user?user_id={USER}"))
    assert "agent state needs a key with the agent_state scope" in page
    assert SECRET_OFFER not in page


def test_working_memory_blocks_are_shown_by_scope(client, writer):
    ok(client, "working_memory.set", namespace=NS, agent=AGENT, user_id=USER, run_id="run-7",
        block_key="state", content="cursor: ticket 4812")
    console = Console(client)
    console.sign_in(writer)
    none = text(console.get(f"/console/ns/{NS}/user?user_id={USER}&agent={AGENT}"))
    assert "No blocks in scope" in none
    page = text(console.get(f"/console/ns/{NS}/user?user_id={USER}&agent={AGENT}&run_id=run-7"))
    assert "cursor: ticket 4812" in page


def test_the_structured_profile_shows_status_and_why(client, writer):
    ok(client, "profile_schema.set", namespace=NS,
        json_schema={"type": "object", "properties": {
            "timezone": {"type": "string", "description": "IANA time zone"}}})
    ok(client, "memory.set", namespace=NS, agent=AGENT, user_id=USER, key="tz",
        value="Lives in Berlin", memory_type="semantic")
    console = Console(client)
    console.sign_in(writer)
    page = text(console.get(f"/console/ns/{NS}/user?user_id={USER}"))
    assert 'id="structured-status">pending<' in page
    # This install has no model: the worker will not build it, whatever its turn.
    assert "Not built: no model is configured (LOOM_LLM_BASE_URL and LOOM_LLM_MODEL)" in page
    assert "has not reached this user" not in page
    # A row a caller writes to the profile key reads as no profile, and the page says why.
    ok(client, "memory.set", namespace=NS, agent="-", user_id=USER, key="structured_profile",
        value={"timezone": "Europe/Berlin"}, memory_type="profile")
    page = text(console.get(f"/console/ns/{NS}/user?user_id={USER}"))
    assert "written by a caller" in page


def test_a_pending_profile_waits_on_the_worker_or_on_the_orgs_switch(app_factory):
    client = auth_app(app_factory, llm_base_url="http://127.0.0.1:9/v1",
                      llm_model="scripted").test_client()
    ok(client, "profile_schema.set", namespace=NS,
        json_schema={"type": "object", "properties": {
            "tz": {"type": "string", "description": "IANA time zone"}}})
    ok(client, "memory.set", namespace=NS, agent=AGENT, user_id=USER, key="tz",
        value="Lives in Berlin", memory_type="semantic")
    console = Console(client)
    console.sign_in(ADMIN_TOKEN)
    page = text(console.get(f"/console/ns/{NS}/user?user_id={USER}"))
    assert "Not built yet: the worker has not reached this user" in page
    ok(client, "org.set_model_calls", enabled=False)
    page = text(console.get(f"/console/ns/{NS}/user?user_id={USER}"))
    assert "Not built: model calls are switched off for the org" in page


def test_the_schema_editor_shows_a_validation_error_beside_the_field(client):
    console = Console(client)
    console.sign_in(ADMIN_TOKEN)
    console.get(f"/console/ns/{NS}")
    bad = console.post(f"/console/ns/{NS}/schema", {"json_schema": (
        '{"type": "object", "properties": {"age": {"type": "integer"}}}')})
    assert bad.status_code == 422
    body = text(bad)
    field = body.split('id="json-schema"', 1)[1].split("</div>", 1)[0]
    assert 'id="json-schema-error"' in field and "properties.age" in field
    not_json = console.post(f"/console/ns/{NS}/schema", {"json_schema": "{nope"})
    assert "This is not JSON" in text(not_json)
    good = console.post(f"/console/ns/{NS}/schema", {"json_schema": (
        '{"type": "object", "properties": {"age": {"type": "integer", '
        '"description": "Age in years"}}}')})
    assert good.status_code == 302
    assert ok(client, "profile_schema.get", namespace=NS)["json_schema"]["properties"]["age"]
    page = text(console.get(f"/console/ns/{NS}"))
    assert "Age in years" in page
    assert console.post(f"/console/ns/{NS}/schema/clear", {}).status_code == 302
    assert ok(client, "profile_schema.get", namespace=NS)["json_schema"] is None


def test_the_usage_ledger_is_for_admins(client, writer):
    console = Console(client)
    console.sign_in(ADMIN_TOKEN)
    page = text(console.get(f"/console/ns/{NS}"))
    assert "<dt>Model calls</dt><dd>0" in page
    console.sign_in(writer)
    page = text(console.get(f"/console/ns/{NS}"))
    assert "usage.get needs the admin role" in page


def test_erasure_needs_the_typed_user_id_and_answers_the_receipt(client):
    ok(client, "profile.set", namespace=NS, agent=AGENT, user_id=USER, label="likes",
        value="Tea.")
    console = Console(client)
    console.sign_in(ADMIN_TOKEN)
    console.get(f"/console/ns/{NS}/erase?user_id={USER}")
    wrong = console.post(f"/console/ns/{NS}/erase", {"user_id": USER, "confirm": "u-4"})
    assert wrong.status_code == 422 and "Nothing was erased" in text(wrong)
    assert ok(client, "memory.get", namespace=NS, agent=AGENT, user_id=USER,
               key="likes")["found"]
    erased = console.post(f"/console/ns/{NS}/erase", {"user_id": USER, "confirm": USER})
    assert erased.status_code == 302
    run_erasure_jobs(client.application.extensions["loom"])  # a worker runs the saga
    receipt = text(console.get(erased.headers["Location"]))
    assert 'id="erasure-status">done<' in receipt
    assert "Clean: nothing of the user was found" in receipt
    assert USER not in receipt
    assert not ok(client, "memory.get", namespace=NS, agent=AGENT, user_id=USER,
                   key="likes")["found"]


def test_a_writer_cannot_erase(client, writer):
    console = Console(client)
    console.sign_in(writer)
    console.get(f"/console/ns/{NS}/erase?user_id={USER}")
    refused = console.post(f"/console/ns/{NS}/erase", {"user_id": USER, "confirm": USER})
    assert refused.status_code == 403
    assert "user.erase needs the admin role" in text(refused)


def test_tokens_are_listed_minted_once_and_revoked(client):
    console = Console(client)
    console.sign_in(ADMIN_TOKEN)
    console.get("/console/tokens")
    minted = console.post("/console/tokens", {"role": "viewer", "namespace": NS,
                                              "label": "dashboard"})
    assert minted.status_code == 200
    secret = re.search(r'id="new-secret" readonly value="(loom_[^"]+)"', text(minted)).group(1)
    assert client.post("/v1/profile.render", json={"namespace": NS, "agent": AGENT},
                       headers=bearer(secret)).status_code == 200
    listing = text(console.get("/console/tokens"))
    assert "dashboard" in listing and secret not in listing
    token_id = ok(client, "token.list")["tokens"][0]["token_id"]
    assert console.post("/console/tokens/revoke", {"token_id": token_id}).status_code == 302
    assert client.post("/v1/profile.render", json={"namespace": NS, "agent": AGENT},
                       headers=bearer(secret)).status_code == 401
    refused = console.post("/console/tokens", {"role": "superuser"})
    assert refused.status_code == 422 and "role" in text(refused)


def test_a_revoked_token_signs_the_console_out(client):
    token = mint(client, namespace=NS, role="admin")
    console = Console(client)
    console.sign_in(token)
    assert console.get(f"/console/ns/{NS}").status_code == 200
    token_id = token.split("_")[1]
    ok(client, "token.revoke", token_id=token_id)
    response = console.get(f"/console/ns/{NS}")
    assert response.status_code == 302
    assert "no longer works" in text(console.get(response.headers["Location"]))


def test_with_auth_off_the_console_acts_in_the_install_org(app_factory):
    client = app_factory().test_client()
    console = Console(client)
    home = console.get("/console/")
    assert home.status_code == 200
    assert "the install's user in org <strong>default</strong>" in text(home)
    console.get(f"/console/ns/{NS}")
    created = console.post(f"/console/ns/{NS}/sections",
                           {"agent": AGENT, "label": "persona", "value": "Terse."})
    assert created.status_code == 302
    rendered = client.post("/v1/profile.render", json={"namespace": NS, "agent": AGENT})
    assert rendered.get_json()["rendered"] == '<profile label="persona">Terse.</profile>'


def test_pages_are_never_cached_or_framed_and_assets_are_local(client, writer):
    console = Console(client)
    console.sign_in(writer)
    response = console.get(f"/console/ns/{NS}")
    assert response.headers["Cache-Control"] == "no-store"
    assert response.headers["X-Frame-Options"] == "DENY"
    assert "default-src 'self'" in response.headers["Content-Security-Policy"]
    assets = re.findall(r'(?:href|src)="([^"#?]+\.(?:css|js))"', text(response))
    assert assets == ["/console/static/console.css"]
    assert client.get(assets[0]).status_code == 200
    missing = client.get("/console/no/such/page")
    assert missing.status_code == 404 and "no page at this address" in text(missing)


def test_the_receipt_page_reloads_while_the_erasure_runs_and_a_second_erase_follows_it(client):
    ok(client, "profile.set", namespace=NS, agent=AGENT, user_id=USER, label="likes",
        value="Tea.")
    console = Console(client)
    console.sign_in(ADMIN_TOKEN)
    console.get(f"/console/ns/{NS}/erase?user_id={USER}")
    erased = console.post(f"/console/ns/{NS}/erase", {"user_id": USER, "confirm": USER})
    assert erased.status_code == 302
    # The saga waits for a worker: the receipt page says running and reloads itself.
    running = client.get(erased.headers["Location"])
    assert 'id="erasure-status">running<' in text(running)
    assert running.headers.get("Refresh") == "1"
    status = ok(client, "erasure.status", namespace=NS, user_id=USER,
                 erasure_id=erased.headers["Location"].rsplit("/", 1)[1])
    assert status["steps_done"] == 0 and status["steps_total"] > 0
    step = status["current_step"] or "starting"
    assert f"step {step}, " in text(running)
    assert f'id="erasure-progress">0 of {status["steps_total"]} steps done<' in text(running)
    # A second erase from the console while it runs is sent to the same receipt.
    again = console.post(f"/console/ns/{NS}/erase", {"user_id": USER, "confirm": USER})
    assert again.status_code == 302 and again.headers["Location"] == erased.headers["Location"]
    run_erasure_jobs(client.application.extensions["loom"])
    done = client.get(erased.headers["Location"])
    assert 'id="erasure-status">done<' in text(done)
    total = status["steps_total"]
    assert f'id="steps-done">{total} of {total}<' in text(done)
    assert "Refresh" not in done.headers


def test_the_user_page_lists_working_memory_scopes_and_opens_one(client, writer):
    ok(client, "working_memory.set", namespace=NS, agent=AGENT, user_id=USER,
        session_id="s-9", block_key="state", content="step 3 done")
    console = Console(client)
    console.sign_in(writer)
    page = text(console.get(f"/console/ns/{NS}/user?user_id={USER}"))
    table = page.split('id="scopes"', 1)[1].split("</table>", 1)[0]
    assert f"<td>{AGENT}</td><td>s-9</td><td>-</td><td>1</td>" in table
    assert "step 3 done" not in page
    link = re.search(r'href="([^"]+)">Show<', table).group(1).replace("&amp;", "&")
    assert "step 3 done" in text(console.get(link))


def test_a_section_over_its_cap_is_refused_with_the_seed_error_and_kept_in_the_box(
        client, writer):
    ok(client, "profile.set", namespace=NS, agent=AGENT, label="short", value="ok",
        char_limit=10)
    console = Console(client)
    console.sign_in(writer)
    page = text(console.get(section_url(label="short")))
    sha = re.search(r'name="if_match_sha256" value="([0-9a-f]+)"', page).group(1)
    # The form keeps the section's cap: a profile.set without one would reset it to 8192.
    cap = re.search(r'name="char_limit" value="([0-9]+)"', page).group(1)
    assert cap == "10"
    refused = console.post(f"/console/ns/{NS}/section", {
        "agent": AGENT, "label": "short", "value": "far too long for ten", "if_match_sha256": sha,
        "char_limit": cap,
    })
    assert refused.status_code == 422
    body = text(refused)
    assert 'id="save-error">Not saved:' in body and ">far too long for ten</textarea>" in body
    assert ok(client, "memory.get", namespace=NS, agent=AGENT, key="short")["memory"][
        "value"] == "ok"


def test_schema_types_read_in_words_with_an_arrays_item_type():
    from app.console.display import schema_type

    assert schema_type({"type": "array", "items": {"type": "string"}}) == "array of string"
    assert schema_type({"type": "array", "items": {"type": "array", "items": {
        "enum": ["a", "b"]}}}) == "array of array of one of: a, b"
    assert schema_type({"type": ["string", "null"]}) == "string or null"
    assert schema_type({"type": "array"}) == "array of any value"
    assert schema_type({"anyOf": [{"type": "integer"}, {"type": "null"}]}) == "integer or null"


def test_the_namespace_page_shows_the_item_type_and_the_budget_chart(app_factory, clock):
    from app.store.budget import BudgetStore

    client = auth_app(app_factory, clock=clock).test_client()
    ok(client, "profile_schema.set", namespace=NS, json_schema={
        "type": "object", "properties": {"languages": {
            "type": "array", "items": {"type": "string"}, "description": "Spoken languages"}}})
    ok(client, "budget.set", namespace=NS, calls=10, tokens=1000)
    budgets = client.application.extensions["loom"].store(BudgetStore)
    for tokens in (100, 200, 300):
        budgets.settle(budgets.reserve("default", NS, tokens), tokens)
        clock.advance(60)
    console = Console(client)
    console.sign_in(ADMIN_TOKEN)
    page = text(console.get(f"/console/ns/{NS}"))
    assert "<td>array of string</td>" in page
    calls = page.split('id="chart-calls"', 1)[1].split("</figure>", 1)[0]
    assert "3 spent of a cap of 10" in calls
    assert calls.count('<rect class="slice"') == 24
    # The cap line of 10 calls sits at the plot's top; the total of 3 at 3/10 of its height.
    assert 'class="cap" x1="0" y1="8.0"' in calls
    assert calls.split('class="running" points="', 1)[1].split('"', 1)[0].endswith(",100.4")
    tokens = page.split('id="chart-tokens"', 1)[1].split("</figure>", 1)[0]
    assert "600 spent of a cap of 1000" in tokens


def test_a_block_shows_how_full_it_is(client, writer):
    ok(client, "working_memory.set", namespace=NS, agent=AGENT, user_id=USER,
        block_key="state", content="x" * 30, char_limit=40)
    console = Console(client)
    console.sign_in(writer)
    page = text(console.get(f"/console/ns/{NS}/user?user_id={USER}&agent={AGENT}"))
    meter = page.split('<meter class="fill" id="fill-state"', 1)[1].split("</meter>", 1)[0]
    assert 'max="40" value="30"' in meter and ">75.0%" in meter


def _console_keys(redis_client) -> dict[str, str]:
    """Every console session key and what it holds."""
    found = {}
    for key in redis_client.scan_iter(match="loom:console:*"):
        value = redis_client.get(key)
        found[key if isinstance(key, str) else key.decode()] = (
            value if isinstance(value, str) else value.decode())
    return found


@pytest.mark.parametrize("signed_in_with", ["minted", "admin"])
def test_a_console_session_keeps_nothing_in_redis_that_works_as_a_token(
        client, redis_client, signed_in_with):
    """Issue 39 point 4: after a sign-in, no console key holds the token, its secret part, or
    anything else that the API takes as a token (a copy of the data yields no sign-in)."""
    token = ADMIN_TOKEN if signed_in_with == "admin" else mint(client, namespace=NS,
                                                               role="admin")
    console = Console(client)
    assert console.sign_in(token).status_code == 302
    assert console.get(f"/console/ns/{NS}").status_code == 200
    held = _console_keys(redis_client)
    assert len(held) == 1  # the one session
    secret = token.rsplit("_", 1)[-1]
    for key, value in held.items():
        assert token not in key and token not in value
        assert secret not in key and secret not in value
        # Nothing the session holds (nor any string in it) signs anyone in.
        stored = json.loads(value)
        strings = [v for v in _strings(stored) if len(v) >= 8] + [key]
        assert strings
        for candidate in strings:
            response = client.post("/v1/memory.list", json={"namespace": NS, "agent": AGENT},
                                   headers=bearer(candidate))
            assert response.status_code == 401, candidate
    # And the session still works on the next page, resolved from what it keeps.
    assert console.get(f"/console/ns/{NS}").status_code == 200


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.items() for part in item for s in _strings(part)]
    if isinstance(value, list):
        return [s for part in value for s in _strings(part)]
    return []


def test_a_session_signed_in_with_the_admin_token_ends_when_that_token_changes(
        app_factory, redis_url):
    first = auth_app(app_factory).test_client()
    console = Console(first)
    assert console.sign_in(ADMIN_TOKEN).status_code == 302
    assert console.get(f"/console/ns/{NS}").status_code == 200
    # The same Redis, the admin token rotated: the session's keyed digest matches no token.
    rotated = app_factory(auth="on", admin_token="a-new-install-admin-token").test_client()
    cookie = first.get_cookie("loom_console", path="/console")
    assert cookie is not None
    rotated.set_cookie("loom_console", cookie.value, path="/console")
    response = rotated.get(f"/console/ns/{NS}")
    assert response.status_code == 302 and "sign-in" in response.headers["Location"]
