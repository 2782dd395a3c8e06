"""The console in a real browser: headless Chromium (the OS package) driven by Playwright,
against gunicorn serving the app with auth on.

Each page is saved as a screenshot under the test's temporary folder, at 1280x800 and at a
phone's width, and checked to be a rendered page of that width (not an error or blank image).
"""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import redis
import requests

from tests.console_support import AGENT, NS, SECRET_OFFER, agent_state_calls
from tests.support import processes
from tests.support.api import op_helpers
from tests.support.live_server import LiveServer

pytestmark = pytest.mark.slow

ADMIN = "install-admin-token-for-browser-tests"
CHROMIUM = os.environ.get("LOOM_CHROMIUM", "/usr/bin/chromium")
LAUNCH_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}

sync_api = pytest.importorskip("playwright.sync_api")


def _chromium_or_skip() -> str:
    found = shutil.which(CHROMIUM) or (CHROMIUM if os.path.exists(CHROMIUM) else None)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs the chromium package")
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    return found


@pytest.fixture(scope="module")
def server(redis_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    flush = redis.Redis.from_url(redis_server_url)
    flush.flushdb()
    env = {
        "REDIS_URL": redis_server_url,
        "LOOM_SECRET_KEY": "browser-test-secret",
        "LOOM_DATA_DIR": str(tmp_path_factory.mktemp("data")),
        "LOOM_AUTH": "on",
        "LOOM_ADMIN_TOKEN": ADMIN,
    }
    # A worker beside the web process: an erasure runs as a background job, and its receipt
    # page reloads until the worker has finished it.
    worker = processes.start("jobs.worker", processes.loom_env(**env),
                             tmp_path_factory.mktemp("worker") / "worker.log")
    try:
        with LiveServer(env) as live:
            yield live
    finally:
        processes.stop(worker)
        flush.flushdb()
        flush.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = _chromium_or_skip()
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=LAUNCH_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport=DESKTOP)
    opened = context.new_page()
    opened.set_default_timeout(15_000)
    try:
        yield opened
    finally:
        context.close()


def console_client(token: str | None) -> dict[str, str]:
    """A desktop client's headers, signed in as ``token`` (the admin's unless given)."""
    return {"Authorization": f"Bearer {token or ADMIN}", "X-Loom-Client": "desktop-app"}


_, ok = op_helpers(headers_for=console_client)


def send(server: Any, method: str, path: str, **body: Any) -> dict[str, Any]:
    """A route that is not ``/v1/<op>`` (agent state's REST paths), asserted to answer 200."""
    response = requests.request(method, server.url + path, json=body, timeout=10,
                                headers=console_client(None))
    assert response.status_code == 200, response.text
    return response.json()


def mint(server: Any, **claims: Any) -> str:
    return ok(server, "token.create", **claims)["token"]


def sign_in(page: Any, server: Any, token: str) -> None:
    page.goto(server.url + "/console/")
    assert "/console/sign-in" in page.url
    page.get_by_label("Loom token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(server.url + "/console/")


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", header[16:24])


def shoot(page: Any, folder: Path, name: str) -> None:
    """A full-page screenshot at desktop and phone width, each checked for its size, and the
    phone layout checked to need no sideways scrolling."""
    for label, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
        page.set_viewport_size(viewport)
        path = folder / f"{name}-{label}.png"
        page.screenshot(path=str(path), full_page=True)
        width, height = png_size(path)
        assert width == viewport["width"] and height >= viewport["height"], (name, label)
        assert path.stat().st_size > 8_000, f"{path.name} looks blank"
        overflow = page.evaluate(
            "document.scrollingElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"{name} scrolls sideways at {label} width by {overflow}px"
    page.set_viewport_size(DESKTOP)


def test_a_writer_edits_the_persona_and_profile_render_serves_it(page, server, tmp_path):
    ok(server, "profile.set", namespace=NS, agent=AGENT, label="persona", value="Terse.")
    writer = mint(server, namespace=NS, role="writer", label="browser writer")
    page.goto(server.url + "/console/")
    shoot(page, tmp_path, "sign-in")
    # The sign-in form is reachable from the keyboard alone.
    for _ in range(10):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.id") == "token":
            break
    assert page.evaluate("document.activeElement.id") == "token"
    page.keyboard.type(writer)
    page.keyboard.press("Enter")
    page.wait_for_url(server.url + "/console/")
    shoot(page, tmp_path, "home")
    # The token reaches one namespace, so home links to it.
    page.get_by_role("link", name=NS, exact=True).click()
    page.wait_for_url(f"{server.url}/console/ns/{NS}")
    shoot(page, tmp_path, "namespace")
    page.get_by_role("link", name="Edit persona").click()
    shoot(page, tmp_path, "section")
    page.get_by_label("Text").fill("Terse. Cite ticket ids.")
    page.get_by_role("button", name="Save section").click()
    page.wait_for_url(f"{server.url}/console/ns/{NS}?saved=persona")
    assert page.get_by_role("status").inner_text() == "Saved section persona."
    shoot(page, tmp_path, "namespace-saved")
    rendered = ok(server, "profile.render", namespace=NS, agent="any-client")["rendered"]
    assert rendered == '<profile label="persona">Terse. Cite ticket ids.</profile>'


def edit_links_inside_their_boxes(page: Any) -> None:
    """Each section's Edit link lies inside its table cell and inside the page, so a tap
    reaches it without scrolling a box sideways."""
    for link in page.locator("#sections table a").all():
        box = link.bounding_box()
        cell = link.locator("xpath=ancestor::td[1]").bounding_box()
        assert box is not None and cell is not None
        assert cell["x"] - 0.5 <= box["x"] and box["x"] + box["width"] <= cell["x"] + cell[
            "width"] + 0.5, (box, cell)
        assert box["x"] + box["width"] <= page.viewport_size["width"], box


def test_the_namespace_page_at_both_widths(page, server, tmp_path):
    ok(server, "profile.set", namespace=NS, agent=AGENT, label="escalation",
         value="Escalate refunds over 200 EUR to a human, always, with the ticket id.")
    ok(server, "profile_schema.set", namespace=NS, json_schema={
        "type": "object", "properties": {"languages": {
            "type": "array", "items": {"type": "string"}, "description": "Spoken languages"}}})
    ok(server, "budget.set", namespace=NS, calls=40, tokens=20000)
    sign_in(page, server, ADMIN)
    page.goto(f"{server.url}/console/ns/{NS}")
    row = page.locator("#schema tbody tr", has_text="languages")
    assert row.locator("td").first.inner_text() == "array of string"
    chart = page.locator("#chart-calls")
    assert "of a cap of 40" in chart.locator("figcaption").inner_text()
    assert chart.locator("rect.slice").count() == 24
    assert chart.locator("line.cap").count() == 1
    for viewport in (DESKTOP, PHONE):
        page.set_viewport_size(viewport)
        edit_links_inside_their_boxes(page)
        svg = chart.locator("svg").bounding_box()
        assert svg is not None and svg["x"] + svg["width"] <= viewport["width"]
    shoot(page, tmp_path, "namespace-budget")


def test_an_edit_from_a_stale_page_shows_the_conflict_and_the_current_text(
        page, server, tmp_path):
    ok(server, "profile.set", namespace=NS, agent=AGENT, label="tone", value="Warm.")
    sign_in(page, server, mint(server, namespace=NS, role="writer"))
    page.goto(f"{server.url}/console/ns/{NS}/section?agent={AGENT}&label=tone")
    ok(server, "profile.set", namespace=NS, agent=AGENT, label="tone", value="Formal.")
    page.get_by_label("Text").fill("Cheerful.")
    page.get_by_role("button", name="Save section").click()
    assert "changed since you opened it" in page.locator("#save-error").inner_text()
    assert page.locator("#current-text").inner_text() == "Formal."
    assert page.get_by_label("Text").input_value() == "Cheerful."
    shoot(page, tmp_path, "section-conflict")
    got = ok(server, "memory.get", namespace=NS, agent=AGENT, key="tone")
    assert got["memory"]["value"] == "Formal."


def test_a_viewer_is_refused_an_edit(page, server, tmp_path):
    ok(server, "profile.set", namespace=NS, agent=AGENT, label="motto", value="Be brief.")
    sign_in(page, server, mint(server, namespace=NS, role="viewer"))
    page.goto(f"{server.url}/console/ns/{NS}/section?agent={AGENT}&label=motto")
    page.get_by_label("Text").fill("Be long.")
    page.get_by_role("button", name="Save section").click()
    assert "needs the writer role" in page.locator("#save-error").inner_text()
    shoot(page, tmp_path, "viewer-refused")
    got = ok(server, "memory.get", namespace=NS, agent=AGENT, key="motto")
    assert got["memory"]["value"] == "Be brief."


def test_a_form_posted_without_its_csrf_token_is_refused(page, server, tmp_path):
    ok(server, "profile.set", namespace=NS, agent=AGENT, label="greeting", value="Hello.")
    sign_in(page, server, mint(server, namespace=NS, role="writer"))
    page.goto(f"{server.url}/console/ns/{NS}/section?agent={AGENT}&label=greeting")
    page.get_by_label("Text").fill("Howdy.")
    page.evaluate("document.querySelectorAll('input[name=csrf_token]')"
                  ".forEach((field) => field.remove())")
    page.get_by_role("button", name="Save section").click()
    assert "without its security token (CSRF)" in page.get_by_role("alert").inner_text()
    shoot(page, tmp_path, "csrf-refused")
    got = ok(server, "memory.get", namespace=NS, agent=AGENT, key="greeting")
    assert got["memory"]["value"] == "Hello."


def test_the_user_page_shows_agent_state_metadata_not_content_and_reads_stay_private(
        page, server, tmp_path):
    user_id = "u-states"
    ok(server, "profile.set", namespace=NS, agent=AGENT, user_id=user_id, label="likes",
         value="Green tea.")
    ok(server, "working_memory.set", namespace=NS, agent=AGENT, user_id=user_id,
         block_key="state", content="cursor: ticket 4812")
    for method, path, body in agent_state_calls(user_id):
        send(server, method, path, **body)
    reader = mint(server, namespace=NS, role="viewer", scopes=["agent_state"])
    sign_in(page, server, reader)
    page.goto(f"{server.url}/console/ns/{NS}/user?user_id={user_id}")
    states = send(server, "GET",
                  f"/v1/profiles/{user_id}/agent-state?namespace={NS}")["states"]
    row = page.locator("#agent-states tbody tr").first.locator("td")
    assert row.nth(3).inner_text() == str(states[0]["size_bytes"])
    assert row.nth(4).inner_text() == str(states[0]["version"])
    assert SECRET_OFFER not in page.content()
    page.locator("#scope-agent").fill(AGENT)
    page.get_by_role("button", name="Show blocks").click()
    assert "cursor: ticket 4812" in page.locator("#blocks").inner_text()
    meter = page.locator("#fill-state")
    assert meter.get_attribute("value") == str(len("cursor: ticket 4812"))
    assert meter.get_attribute("max") == "4096"
    for viewport in (DESKTOP, PHONE):
        page.set_viewport_size(viewport)
        box = meter.bounding_box()
        assert box is not None and box["width"] > 100 and box["height"] > 5
        assert box["x"] + box["width"] <= viewport["width"]
    page.set_viewport_size(DESKTOP)
    shoot(page, tmp_path, "user")
    # Two console page loads read the profile; none of them is in profile.activity.
    activity = ok(server, "profile.activity", namespace=NS, agent=AGENT, user_id=user_id)
    assert activity["entries"] == []
    ok(server, "profile.render", namespace=NS, agent=AGENT, user_id=user_id)
    activity = ok(server, "profile.activity", namespace=NS, agent=AGENT, user_id=user_id)
    assert [entry["client"] for entry in activity["entries"]] == ["desktop-app"]


def test_an_admin_erases_a_user_and_sees_the_receipt(page, server, tmp_path):
    user_id = "u-erased"
    ok(server, "profile.set", namespace=NS, agent=AGENT, user_id=user_id, label="likes",
         value="Coffee.")
    ok(server, "memory.set", namespace=NS, agent=AGENT, user_id=user_id, key="city",
         value="Lives in Lyon", memory_type="semantic")
    sign_in(page, server, ADMIN)
    page.goto(f"{server.url}/console/ns/{NS}/user?user_id={user_id}")
    page.get_by_role("link", name="Erase this user…").click()
    shoot(page, tmp_path, "erase")
    page.get_by_label("Type the user id").fill(user_id)
    page.get_by_role("button", name="Erase this user").click()
    page.wait_for_url("**/erasures/**")
    # The page says the erasure is running, and reloads until the worker is done with it.
    page.locator("#erasure-status", has_text="done").wait_for(timeout=60_000)
    assert "Clean: nothing of the user was found" in page.locator("#census").inner_text()
    counts = page.locator("#counts").inner_text()
    assert "memory_rows" in counts
    assert user_id not in page.content()
    shoot(page, tmp_path, "erasure-receipt")
    got = ok(server, "memory.get", namespace=NS, agent=AGENT, user_id=user_id, key="city")
    assert not got["found"]


def test_an_admin_mints_and_revokes_a_token(page, server, tmp_path):
    sign_in(page, server, ADMIN)
    page.get_by_role("link", name="Tokens").click()
    page.get_by_label("Label (what it is for)").fill("support dashboard")
    page.get_by_label("Role").select_option("viewer")
    page.get_by_label("Namespace (empty").fill(NS)
    page.get_by_role("button", name="Mint token").click()
    secret = page.locator("#new-secret").input_value()
    assert secret.startswith("loom_")
    shoot(page, tmp_path, "tokens")
    ok(server, "profile.render", secret, namespace=NS, agent=AGENT)
    page.goto(server.url + "/console/tokens")
    assert secret not in page.content()
    token_id = secret.split("_")[1]
    page.get_by_role("button", name=f"Revoke {token_id}").click()
    assert page.locator("#token-table").get_by_text("revoked").count() >= 1
    refused = requests.post(server.url + "/v1/profile.render", timeout=10,
                            json={"namespace": NS, "agent": AGENT},
                            headers={"Authorization": f"Bearer {secret}"})
    assert refused.status_code == 401
    page.get_by_role("button", name="Sign out").click()
    page.goto(server.url + "/console/tokens")
    assert "/console/sign-in" in page.url


def test_unknown_user_is_a_page_with_an_error_in_words(page, server, tmp_path):
    sign_in(page, server, mint(server, namespace=NS, role="writer"))
    page.goto(f"{server.url}/console/ns/elsewhere")
    assert "outside this token's reach" in page.get_by_role("alert").first.inner_text()
    shoot(page, tmp_path, "refused")


# --- stored text that would be markup ------------------------------------------------------------

HOSTILE_NS = "stored-scripts"
HOSTILE_USER = "u-stored-scripts"
# Each would run script, leave its element or add a link if a page wrote it as markup.
HOSTILE = (
    '<script>alert("stored-1")</script>',
    'javascript:alert("stored-2")',
    '" autofocus onfocus="alert(\'stored-3\')" x="',
    '</textarea><script>alert("stored-4")</script>',
    "<img src=x onerror=alert('stored-5')>",
)
HOSTILE_AGENT = '<script>alert("agent")</script>" onmouseover="alert(\'agent\')'
HOSTILE_CLIENT = '<img src=x onerror=alert("client")>'


def _console_url(server: Any, path: str, **query: str) -> str:
    return f"{server.url}/console/ns/{HOSTILE_NS}{path}" + ("?" + urlencode(query) if query
                                                           else "")


def _plant_hostile_text(server: Any) -> dict[str, Any]:
    """Sections (namespace-level and the user's), a fact, a block, a token label and an
    activity entry, each holding the hostile strings; the names the pages will be opened by."""
    labels = [f"label {n} {text}" for n, text in enumerate(HOSTILE)]
    values = [f"text {n} {text} end" for n, text in enumerate(HOSTILE)]
    for user_id in ("-", HOSTILE_USER):
        for label, value in zip(labels, values, strict=True):
            ok(server, "profile.set", namespace=HOSTILE_NS, agent=HOSTILE_AGENT,
               user_id=user_id, label=label, value=value)
    for n, text in enumerate(HOSTILE):
        ok(server, "memory.set", namespace=HOSTILE_NS, agent=HOSTILE_AGENT,
           user_id=HOSTILE_USER, key=f"fact {n} {text}", value=f"fact {text}")
    block_key = f"block {HOSTILE[0]}"
    block_text = "\n".join(HOSTILE)
    ok(server, "working_memory.set", namespace=HOSTILE_NS, agent=HOSTILE_AGENT,
       user_id=HOSTILE_USER, block_key=block_key, content=block_text)
    token_label = " ".join(HOSTILE)[:200]
    mint(server, namespace=HOSTILE_NS, role="viewer", label=token_label)
    # A read by a client whose name is markup: the user page's activity table shows it.
    response = requests.post(server.url + "/v1/profile.render", timeout=10, json={
        "namespace": HOSTILE_NS, "agent": HOSTILE_AGENT, "user_id": HOSTILE_USER},
        headers={"Authorization": f"Bearer {ADMIN}", "X-Loom-Client": HOSTILE_CLIENT})
    assert response.status_code == 200, response.text
    return {"labels": labels, "values": values, "block_key": block_key,
            "block_text": block_text, "token_label": token_label}


def _no_markup_from_the_store(page: Any, where: str) -> None:
    """Nothing on the page came from stored text as markup: no inline script element, no
    event-handler attribute, no javascript: link."""
    found = page.evaluate("""() => ({
        inline_scripts: document.querySelectorAll('script:not([src])').length,
        handlers: [...document.querySelectorAll('*')].filter(
            (e) => [...e.attributes].some((a) => a.name.startsWith('on'))).length,
        script_links: [...document.querySelectorAll('a[href]')].filter(
            (a) => a.getAttribute('href').trim().toLowerCase().startsWith('javascript:')).length,
        images: document.querySelectorAll('img').length,
    })""")
    assert found == {"inline_scripts": 0, "handlers": 0, "script_links": 0, "images": 0}, (
        where, found)


def test_stored_markup_is_shown_as_text_and_runs_nothing(browser, server, tmp_path):
    planted = _plant_hostile_text(server)
    # The console's Content-Security-Policy would stop an inline script by itself; bypassed
    # here, so a page that wrote stored text as markup would run it and the listener hear it.
    context = browser.new_context(viewport=DESKTOP, bypass_csp=True)
    page = context.new_page()
    page.set_default_timeout(15_000)
    dialogs: list[str] = []

    def heard(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", heard)
    try:
        sign_in(page, server, ADMIN)
        page.evaluate("() => alert('probe')")  # the listener hears a dialog that does open
        assert dialogs == ["probe"]
        dialogs.clear()
        opened: list[str] = []

        def visit(url: str, name: str) -> None:
            page.goto(url)
            page.wait_for_load_state("load")
            page.mouse.move(5, 5)
            page.mouse.move(400, 300)  # over the tables: an injected onmouseover would fire
            _no_markup_from_the_store(page, name)
            assert dialogs == [], (name, dialogs)
            opened.append(name)

        visit(server.url + "/console/", "home")
        visit(_console_url(server, ""), "namespace")
        sections = page.locator("#sections")
        assert f"Agent {HOSTILE_AGENT}" in sections.inner_text()
        for label, value in zip(planted["labels"], planted["values"], strict=True):
            row = sections.locator("tr", has=page.locator("th", has_text=label))
            assert row.locator("th").inner_text() == label
            assert row.locator("pre").inner_text() == value
        shoot(page, tmp_path, "stored-markup-namespace")

        for user_id in ("-", HOSTILE_USER):
            for label, value in zip(planted["labels"], planted["values"], strict=True):
                visit(_console_url(server, "/section", agent=HOSTILE_AGENT, label=label,
                                   user_id=user_id, session_id="-"), f"section {label}")
                assert page.locator("h1 code").inner_text() == label
                assert page.get_by_label("Text").input_value() == value
                form = page.locator("form", has=page.get_by_label("Text"))
                assert form.locator("input[name=label]").input_value() == label
                assert form.locator("input[name=agent]").input_value() == HOSTILE_AGENT
                meta = page.locator("dl.meta")
                assert HOSTILE_AGENT in meta.inner_text()
        shoot(page, tmp_path, "stored-markup-section")

        visit(_console_url(server, "/user", user_id=HOSTILE_USER, agent=HOSTILE_AGENT),
              "user")
        user_sections = page.locator("#sections")
        for label, value in zip(planted["labels"], planted["values"], strict=True):
            row = user_sections.locator("tr", has=page.locator("th", has_text=label))
            assert row.locator("pre").inner_text() == value
        block = page.locator("article.block")
        assert block.locator("h3").inner_text() == planted["block_key"]
        assert block.locator("pre").inner_text() == planted["block_text"]
        assert page.locator("#scope-agent").input_value() == HOSTILE_AGENT
        assert page.locator("#scopes td").first.inner_text() == HOSTILE_AGENT
        activity = page.locator("#activity-table tbody tr").first.locator("td")
        assert activity.nth(0).inner_text() == HOSTILE_AGENT
        assert activity.nth(1).inner_text() == HOSTILE_CLIENT
        assert page.locator("#known-agents option").first.get_attribute(
            "value") == HOSTILE_AGENT
        shoot(page, tmp_path, "stored-markup-user")

        visit(_console_url(server, "/erase", user_id=HOSTILE_USER), "erase")
        visit(server.url + "/console/tokens", "tokens")
        assert page.locator("#token-table td", has_text="stored-1").first.inner_text() == (
            planted["token_label"])
        assert len(opened) == 3 + 2 * len(HOSTILE) + 2
    finally:
        context.close()
