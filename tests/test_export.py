"""subject.export: the user's data package, its round trip, who may read it, and the CLI."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.auth_support import ADMIN_TOKEN, auth_app, bearer, mint
from tests.test_erasure import NS, OTHER, PLANTED, USER, World, make_world, plant

MARK = "MARK-EXPORTED"


@pytest.fixture
def world(redis_url, tmp_path, model):
    return make_world(redis_url, tmp_path, model)


def strings_in(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in strings_in(item)]
    if isinstance(value, list):
        return [s for item in value for s in strings_in(item)]
    return []


def by_key(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(row["key"], row["session_id"]): row for row in rows}


def test_the_package_holds_everything_written_and_nothing_else(world):
    plant(world, USER, MARK)
    plant(world, OTHER, "MARK-OTHER")
    package = world.post("subject.export", user_id=USER)

    assert package["format"] == "loom.subject_export.v1"
    assert (package["org"], package["namespace"], package["user_id"]) == ("default", NS, USER)
    expected = {k: v for k, v in PLANTED.items() if k not in ("jobs", "tokens")}
    assert package["counts"] == expected
    # Facts, with every version oldest first; the tombstone is there, deleted.
    facts = by_key(package["memory_rows"])
    assert set(facts) == {("name", "-"), ("tz", "-"), ("old", "-"), ("ticket", "s-1")}
    assert [v["value"] for v in facts[("name", "-")]["versions"]] == [
        f"{MARK} call me Sam", f"{MARK} call me Samuel"]
    assert facts[("name", "-")]["value"] == f"{MARK} call me Samuel"
    old = facts[("old", "-")]
    assert old["deleted"] is True and [v["value"] for v in old["versions"]] == [
        f"{MARK} an old fact", None]
    # Profile sections and the structured profile, with their versions.
    sections = by_key(package["profile_sections"])
    assert sections[("notes", "-")]["value"] == f"{MARK} note one\n{MARK} note two"
    assert len(sections[("notes", "-")]["versions"]) == 2
    assert sections[("persona", "-")]["value"] == f"{MARK} persona text"
    structured = package["structured_profile"]
    assert structured["value"]["preferred_name"] == f"{MARK}-Sam"
    assert structured["provenance"] == "derived" and len(structured["versions"]) == 1
    # Working memory by scope.
    scopes = {(s["agent"], s["session_id"], s["run_id"]): s["blocks"]
              for s in package["working_memory"]}
    assert {k: [(b["block_key"], b["content"]) for b in v] for k, v in scopes.items()} == {
        ("chat", "-", "-"): [("plan", f"{MARK} plan"), ("scratch", f"{MARK} scratch")],
        ("chat", "s-1", "r-1"): [("state", f"{MARK} run state")],
    }
    # Agent states by declared field.
    states = {s["agent"]: s for s in package["agent_states"]}
    assert states["loyalty"]["scope_kind"] == "subject"
    assert states["loyalty"]["fields"]["tier"]["value"] == f"{MARK} gold"
    assert states["loyalty"]["fields"]["tier"]["declared"] is True
    assert states["shop_guide"]["fields"]["offer"] == {
        **states["shop_guide"]["fields"]["offer"], "value": f"{MARK} offer", "type": "string",
        "pii": False}
    assert sorted(r["client"] for r in package["profile_reads"]) == ["app-a", "app-b"]
    # Round trip: one JSON document holding every text written about the user, and nothing
    # of anybody else's.
    text = json.dumps(package, ensure_ascii=False)
    assert json.loads(text) == package
    written = [f"{MARK} call me Sam", f"{MARK} call me Samuel", f"{MARK} lives in Berlin",
               f"{MARK} an old fact", f"{MARK} ticket 981", f"{MARK} persona text",
               f"{MARK} note one", f"{MARK} note two", f"{MARK}-Sam", f"{MARK} scratch",
               f"{MARK} plan", f"{MARK} run state", f"{MARK} gold", f"{MARK} offer"]
    found = " ".join(strings_in(package))
    assert all(piece in found for piece in written)
    assert "MARK-OTHER" not in text and OTHER not in text


def test_an_erased_user_exports_empty(world):
    plant(world, USER, MARK)
    world.erase()
    package = world.post("subject.export", user_id=USER)
    assert set(package["counts"].values()) == {0}
    assert package["structured_profile"] is None and MARK not in json.dumps(package)


def test_user_id_is_required(world):
    status, out = world.call("subject.export")
    assert status == 422 and out["error"]["code"] == "IDENTITY_INCOMPLETE"


def test_an_admin_or_a_token_pinned_to_the_user_reads_the_package(app_factory):
    app = auth_app(app_factory)
    client = app.test_client()
    admin = bearer(ADMIN_TOKEN)
    for user in (USER, OTHER):
        response = client.post("/v1/memory.set", headers=admin, json={
            "namespace": NS, "agent": "chat", "user_id": user, "key": "k",
            "value": f"{MARK} of {user}"})
        assert response.status_code == 200

    def export(token: str, **body: Any) -> tuple[int, dict[str, Any]]:
        response = client.post("/v1/subject.export", headers=bearer(token),
                               json={"namespace": NS, **body})
        return response.status_code, response.get_json()

    pinned = mint(client, org="default", namespace=NS, role="viewer", read_user_id=USER)
    status, out = export(pinned)  # the user comes from the token
    assert status == 200 and out["user_id"] == USER
    assert [row["value"] for row in out["memory_rows"]] == [f"{MARK} of {USER}"]
    status, out = export(pinned, user_id=USER)
    assert status == 200
    status, out = export(pinned, user_id=OTHER)
    assert status == 403 and f"{MARK} of {OTHER}" not in json.dumps(out)
    viewer = mint(client, org="default", namespace=NS, role="viewer")
    writer = mint(client, org="default", namespace=NS, role="writer")
    for token in (viewer, writer):
        status, out = export(token, user_id=USER)
        assert status == 403 and out["error"]["code"] == "AUTH_INSUFFICIENT"
    session_bound = mint(client, org="default", namespace=NS, role="viewer",
                         read_user_id=USER, session_id="s-1")
    status, out = export(session_bound)
    assert status == 403 and out["error"]["code"] == "AUTH_INSUFFICIENT"
    namespace_admin = mint(client, org="default", namespace=NS, role="admin")
    status, out = export(namespace_admin, user_id=OTHER)
    assert status == 200 and out["memory_rows"][0]["value"] == f"{MARK} of {OTHER}"
    elsewhere = mint(client, org="default", namespace="elsewhere", role="admin")
    status, _ = export(elsewhere, user_id=USER)
    assert status == 403


def test_the_export_command_writes_the_package_and_shows_progress(world, tmp_path):
    plant(world, USER, MARK)
    out = tmp_path / "package.json"
    result = world.app.test_cli_runner().invoke(
        args=["loom", "export", USER, "--namespace", NS, "--out", str(out)])
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    direct = world.post("subject.export", user_id=USER)
    direct.pop("ignored_args")
    assert {**written, "exported_at": ""} == {**direct, "exported_at": ""}
    for step in ("memory", "working_memory", "agent_state"):
        assert step in result.stderr
    assert MARK not in result.stdout  # the package went to the file, not the terminal


def test_the_export_command_prints_to_stdout_without_out(world):
    world.fact("k", f"{MARK} fact", USER)
    result = world.app.test_cli_runner().invoke(args=["loom", "export", USER,
                                                      "--namespace", NS])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["memory_rows"][0]["value"] == f"{MARK} fact"


def test_world_helpers_are_shared(world: World):
    assert world.post("subject.export", user_id=USER)["counts"]["memory_rows"] == 0
