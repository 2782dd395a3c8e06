"""The async SDK against a real gunicorn with auth on: the seed's examples as written, every
plane awaitable, agent state's read-your-writes, offline queue and conflicts, and the types.

The seed's examples (``tests.support.seed_examples``) run unchanged; the server address and
the tokens reach them through ``LOOM_API_URL``, ``LOOM_API_KEY`` and ``LOOM_ADMIN_TOKEN``.
"""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from loom import Agent, AsyncAgent, errors
from loom.agent_state import AgentStateWritten
from tests.conftest import TEST_SECRET
from tests.support import seed_examples
from tests.support.faulty_proxy import PASS, RESET_BEFORE, FaultyProxy
from tests.support.live_server import LiveServer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
# The seeds sit in shared/ beside the checkout (or beside the folder of worktrees).
SEED = next(
    (folder / "shared" / "seeds" / "000_e6cffbede4b0273a.txt"
     for folder in (ROOT.parent, ROOT.parent.parent)
     if (folder / "shared" / "seeds" / "000_e6cffbede4b0273a.txt").exists()),
    ROOT.parent / "shared" / "seeds" / "000_e6cffbede4b0273a.txt",
)
ADMIN = "install-admin-token-for-sdk-tests"
SHOP = {"org": "acme", "namespace": "shop", "agent": "shop_guide"}
STATE_TYPE = {
    "type": "shop_guide_state",
    "ownership": "agent",
    "fields": {"step": {"type": "enum", "values": ["sizes", "offer", "checkout"]},
               "offer": {"type": "string"}, "note": {"type": "string"}},
    "agent_state": {"scope": "conversation", "max_bytes": 1024, "write": "both"},
}


@pytest.fixture(scope="module")
def api(redis_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {"REDIS_URL": redis_server_url, "LOOM_SECRET_KEY": TEST_SECRET,
           "LOOM_DATA_DIR": str(tmp_path_factory.mktemp("api")),
           "LOOM_AUTH": "on", "LOOM_ADMIN_TOKEN": ADMIN}
    with LiveServer(env) as server:
        yield server


def mint(api: LiveServer, **claims: Any) -> str:
    answer = requests.post(api.url + "/v1/token.create", json=claims, timeout=10,
                           headers={"Authorization": f"Bearer {ADMIN}"})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["token"])


@pytest.fixture
def seed_env(api: LiveServer, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> LiveServer:
    """What a user's environment holds: the server, a writer token, the admin token."""
    monkeypatch.setenv("LOOM_API_URL", api.url)
    monkeypatch.setenv("LOOM_API_KEY", mint(api, org="acme", namespace="support", role="writer"))
    monkeypatch.setenv("LOOM_ADMIN_TOKEN", ADMIN)
    return api


# --- the seed's examples ------------------------------------------------------------------------


def test_the_examples_are_the_seeds_own_lines():
    if not SEED.exists():
        pytest.skip("the seeds are not beside this checkout")
    seed_lines = [line.strip() for line in SEED.read_text().splitlines()]
    for name, example in seed_examples.ASYNC.items():
        lines = [line.strip() for line in example.splitlines() if line.strip()]
        starts = [i for i, line in enumerate(seed_lines) if line == lines[0]]
        assert any(seed_lines[i:i + len(lines)] == lines for i in starts), name


def test_the_seeds_async_examples_run_as_written(seed_env: LiveServer,
                                                 capsys: pytest.CaptureFixture[str]):
    done = seed_examples.run_all(seed_examples.ASYNC)
    printed = capsys.readouterr().out
    assert printed.startswith('<working-memory block="state">cursor: ticket 4812\n')
    assert "step 3 done</working-memory>" in printed
    assert '<profile label="persona">Terse. Cite ticket ids.' in done["system"]
    assert 'user_id="u-42">Prefers EUR invoices.' in done["system"]
    assert done["out"]["status"] == "ready"
    assert set(done["out"]["profile"]) == {"preferred_name", "timezone", "languages"}
    assert isinstance(done["bot"], AsyncAgent) and isinstance(done["admin"], AsyncAgent)


def test_their_sync_forms_run_beside_them(seed_env: LiveServer,
                                          capsys: pytest.CaptureFixture[str]):
    done = seed_examples.run_all(seed_examples.SYNC)
    assert "step 3 done</working-memory>" in capsys.readouterr().out
    assert '<profile label="persona">' in done["system"]
    assert done["out"]["status"] == "ready"
    assert isinstance(done["bot"], Agent)


def test_the_seed_examples_need_their_tokens(seed_env: LiveServer,
                                             monkeypatch: pytest.MonkeyPatch):
    """The admin example really runs as admin: a writer's token is refused there."""
    monkeypatch.setenv("LOOM_ADMIN_TOKEN", mint(seed_env, org="acme", namespace="support",
                                                role="writer"))
    with pytest.raises(errors.AuthInsufficient):
        seed_examples.run(seed_examples.ASYNC["structured_profiles"], {"Agent": Agent})


# --- every plane, awaitable ------------------------------------------------------------------


def test_every_method_of_the_async_face_is_awaitable(seed_env: LiveServer):
    async def scenario() -> dict[str, Any]:
        async with Agent(org="acme", namespace="support", agent="triage-bot") as bot:
            calls = {
                "set": bot.working_memory.set("a", block_key="k", run_id="r"),
                "append": bot.working_memory.append("b", block_key="k", run_id="r"),
                "replace": bot.working_memory.replace("b", "c", block_key="k", run_id="r"),
                "get": bot.working_memory.get("k", run_id="r"),
                "profile.set": bot.profile.set("persona", "Brief."),
                "profile.get": bot.profile.get("persona"),
                "profile.list": bot.profile.list(),
                "memory.list": bot.memory.list(memory_type="profile"),
                "context.pack": bot.context.pack(query="tickets"),
                "client": bot.client.working_memory.render({"run_id": "r"}),
                "call": bot.client.call("working_memory.get", {"block_key": "k",
                                                               "run_id": "r"}),
                "delete": bot.working_memory.delete("k", run_id="r"),
            }
            assert all(inspect.isawaitable(pending) for pending in calls.values())
            answers = {}
            for name, pending in calls.items():  # in order: each awaited in turn
                answers[name] = await pending
            return answers

    answers = asyncio.run(scenario())
    assert answers["get"]["content"] == "a\nc"
    assert answers["get"]["found"] is True and answers["delete"]["deleted"] is True
    assert "Brief." in str(answers["profile.get"])
    assert answers["client"]["block_count"] == 1
    assert answers["call"]["content"] == "a\nc"


def test_async_errors_are_the_same_classes(seed_env: LiveServer):
    async def scenario() -> None:
        async with Agent(org="acme", namespace="support", agent="triage-bot") as bot:
            await bot.working_memory.set("short", block_key="state", run_id="run-7")
            with pytest.raises(errors.WorkingMemoryLimitExceeded) as over:
                await bot.working_memory.set("x" * 5000, block_key="state", run_id="run-7")
            assert over.value.char_limit is not None and over.value.value_length == 5000
            with pytest.raises(errors.SubstringNotFound):
                await bot.working_memory.replace("nowhere", "y", block_key="state",
                                                 run_id="run-7")
            with pytest.raises(AttributeError):
                bot.working_memory_typo  # noqa: B018

    asyncio.run(scenario())


# --- agent state in the async form ------------------------------------------------------------


@pytest.fixture
def shop(api: LiveServer, redis_url: str) -> LiveServer:
    with Agent(**SHOP, base_url=api.url, api_key=ADMIN) as admin:
        admin.client.features.set({"features": {"agent_state": True}})
        admin.client.object_types.set({"types": [STATE_TYPE]})
    return api


def test_async_agent_state_reads_its_writes_and_shares_the_record(shop: LiveServer):
    agent = Agent(**SHOP, base_url=shop.url, api_key=ADMIN)
    with agent:
        assert agent.conversation("c-1").agent_state.put({"step": "sizes"}).version == 1

    async def scenario() -> None:
        async with agent as bot:
            conversation = bot.conversation("c-1")
            state = await conversation.agent_state.get()
            assert (state.body, state.version) == ({"step": "sizes"}, 1)
            written = await conversation.agent_state.put({"step": "offer"}, mode="cas",
                                                         if_version=1)
            assert written == AgentStateWritten(True, 2, None)
            stale = await conversation.agent_state.put({"step": "checkout"}, mode="cas",
                                                       if_version=1)
            assert (stale.stored, stale.reason, stale.version) == (False, "conflict", 2)
            assert (await conversation.agent_state.get()).version == 2

    asyncio.run(scenario())
    # The async face wrote into the Agent's own record.
    assert agent.agent_state.known({"kind": "conversation", "id": "c-1"}).version == 2


def test_async_offline_writes_are_resent_with_their_if_version_and_conflicts_reported(
    shop: LiveServer,
):
    with FaultyProxy(shop.port) as proxy:
        async def scenario() -> None:
            async with AsyncAgent(**SHOP, base_url=proxy.url, api_key=ADMIN, timeout=5) as bot:
                one, two = bot.conversation("c-1"), bot.conversation("c-2")
                assert (await one.agent_state.put({"step": "sizes"})).version == 1
                assert (await two.agent_state.put({"step": "sizes"})).version == 1
                proxy.default = RESET_BEFORE  # Loom goes out of reach
                queued = await one.agent_state.put({"step": "offer"}, mode="cas",
                                                   if_version=1)
                assert (queued.stored, queued.reason, queued.pending) == (
                    False, "pending", True)
                racing = await two.agent_state.put({"step": "offer"}, mode="cas",
                                                   if_version=1)
                assert racing.pending
                offline = await one.agent_state.get()
                assert offline.offline and offline.body == {"step": "offer"}
                # Meanwhile another writer moves c-2 on, straight at Loom.
                with Agent(**SHOP, base_url=shop.url, api_key=ADMIN) as other:
                    other.conversation("c-2").agent_state.put({"note": "moved"})
                proxy.default = PASS  # Loom is back
                sent_before = proxy.seen["/v1/agent-state"]
                assert await bot.flush() == 0
                assert proxy.seen["/v1/agent-state"] == sent_before + 2
                assert (await one.agent_state.get()).body == {"step": "offer"}
                conflicts = two.agent_state.conflicts
                assert [failure.if_version for failure in conflicts] == [1]
                assert conflicts[0].error.details.get("version") == 2
                assert (await two.agent_state.get()).body == {"step": "sizes", "note": "moved"}

        asyncio.run(scenario())


# --- the types --------------------------------------------------------------------------------


def test_mypy_strict_passes_on_the_sdk_and_types_both_forms():
    """``mypy --strict`` on the SDK, and on a file that asserts each form's answer types."""
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "sdk/loom", "tests/typing/sdk_forms.py"],
        cwd=ROOT, capture_output=True, text=True,
        env={"MYPYPATH": str(ROOT / "sdk"), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    wrong = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "tests/typing/sdk_forms_wrong.py"],
        cwd=ROOT, capture_output=True, text=True,
        env={"MYPYPATH": str(ROOT / "sdk"), "PATH": "/usr/bin:/bin"},
    )
    # Forgetting an await, or awaiting a sync answer, is a type error.
    assert wrong.returncode == 1, wrong.stdout
    assert wrong.stdout.count("error:") == 2, wrong.stdout
