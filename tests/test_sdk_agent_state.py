"""The SDK's agent state (seed 002, "Reading") against the real app and real Redis.

Most tests mount ``tests.support.wsgi_adapter.FlaskAdapter`` on the Agent's
``requests.Session``. Loom out of reach is a base URL on a port nobody listens on (a real
refused connection): "starting" the server mounts the adapter on that URL, "stopping" it
unmounts it. One test stops and restarts a real gunicorn (``LiveServer``) around a queued
write, one runs the seed's example on the ``live_server`` fixture. Read-your-writes is checked
with an adapter whose reads answer a frozen, older state, as a replica behind would.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from requests.adapters import BaseAdapter

from app.local import free_port
from loom import Agent, errors
from loom.agent_state import AgentState, AgentStateWritten
from tests.conftest import TEST_SECRET
from tests.support.live_server import LiveServer
from tests.support.wsgi_adapter import FlaskAdapter

BASE = "http://loom.test"
NS = "shop"
AGENT = "shop_guide"


def agent_type(name: str, scope: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": name,
        "ownership": "agent",
        "fields": fields or {
            "step": {"type": "enum", "values": ["sizes", "offer", "checkout"]},
            "offer": {"type": "string"},
            "note": {"type": "string"},
            "count": {"type": "integer"},
            **{f"f{i}": {"type": "integer"} for i in range(8)},
        },
        "agent_state": {"scope": scope, "max_bytes": 1024, "write": "both"},
    }


TYPES = [
    agent_type("shop_guide_state", "conversation"),
    agent_type("task_bot_state", "task"),
    agent_type("order_bot_state", "object"),
    agent_type("care_bot_state", "subject"),
]


def enable(bot: Agent) -> None:
    bot.client.features.set({"features": {"agent_state": True}})
    bot.client.object_types.set({"types": TYPES})


def refusing_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def make(base: str = BASE, adapter: BaseAdapter | None = None, **options: Any) -> Agent:
    bot = Agent(**{"org": "acme", "namespace": NS, "agent": AGENT, "base_url": base,
                   "timeout": 2, **options})
    if adapter is not None:
        bot.transport.session.mount(base, adapter)
    return bot


def unmount(bot: Agent, base: str) -> None:
    del bot.transport.session.adapters[base]


@pytest.fixture
def adapter(app) -> FlaskAdapter:
    return FlaskAdapter(app)


@pytest.fixture
def bot(adapter: FlaskAdapter) -> Iterator[Agent]:
    with make(adapter=adapter) as agent:
        enable(agent)
        yield agent


def sent_bodies(adapter: FlaskAdapter) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (request.method or "", (request.url or "").split("/", 3)[3],
         json.loads(request.body) if request.body else {})
        for request, _ in adapter.sent
    ]


# --- the seed's example ------------------------------------------------------------------------


def test_the_seed_example_through_the_sdk(bot: Agent):
    conversation = bot.conversation("c-1")
    state = conversation.agent_state.get()
    assert (state.body, state.version, state.updated_at) == ({}, 0, None)
    written = conversation.agent_state.put({"step": "sizes", "offer": "familia-plus"})
    assert written == AgentStateWritten(stored=True, version=1, reason=None)
    state = conversation.agent_state.get()
    assert state.body == {"step": "sizes", "offer": "familia-plus"} and state.version == 1
    assert state.updated_at.endswith("Z")
    written = conversation.agent_state.put({"step": "checkout"}, mode="cas",
                                           if_version=state.version)
    assert (written.stored, written.version) == (True, 2)
    conversation.agent_state.put({"note": "n"})
    conversation.agent_state.put({"note": {"$delete": True}})
    assert conversation.agent_state.get().body == {"step": "checkout"}
    refused = conversation.agent_state.put({"colour": "blue"})
    assert (refused.stored, refused.reason) == (False, "not_declared_field")
    assert conversation.agent_state.put({"note": "x" * 2000}).reason == "over_cap"
    # Another conversation of the same agent is another state.
    assert bot.conversation("c-2").agent_state.get().version == 0


def test_a_cas_at_a_stale_version_answers_conflict_with_the_held_version(bot: Agent):
    state = bot.conversation("c-1").agent_state
    assert state.put({"step": "sizes"}, mode="cas", if_version=0).stored
    again = state.put({"step": "offer"}, mode="cas", if_version=0)
    assert again == AgentStateWritten(stored=False, version=1, reason="conflict")
    assert state.conflicts == [] and bot.agent_state.conflicts == []
    assert state.get().body == {"step": "sizes"}


def test_bad_input_raises_as_any_other_call(bot: Agent):
    with pytest.raises(errors.ValidationError) as caught:
        bot.conversation("c-1").agent_state.put({"step": "sizes"}, mode="cas")
    assert "if_version" in caught.value.details["fields"]
    with pytest.raises(ValueError):
        bot.conversation("c-1").agent_state.put({"step": "sizes"}, mode="replace")
    with pytest.raises(ValueError):
        bot.conversation("")


def test_every_scope_kind_travels_in_the_body(adapter: FlaskAdapter, bot: Agent):
    task_bot = make(adapter=adapter, agent="task_bot")
    order_bot = make(adapter=adapter, agent="order_bot")
    care_bot = make(adapter=adapter, agent="care_bot")
    assert task_bot.task("t-9").agent_state.put({"count": 1}).stored
    assert order_bot.object("order", "o-1").agent_state.put({"count": 2}).stored
    assert care_bot.subject("Ana@Example.com").agent_state.put({"count": 3}).stored
    bot.conversation("+34 600 111 222").agent_state.get()
    sent = sent_bodies(adapter)[-4:]
    assert [(method, path) for method, path, _ in sent] == [
        ("PUT", "v1/agent-state"), ("PUT", "v1/agent-state"), ("PUT", "v1/agent-state"),
        ("POST", "v1/agent-state/read"),
    ]
    scopes = [body["scope"] for _, _, body in sent if "scope" in body]
    assert {"kind": "task", "id": "t-9"} in scopes
    assert {"kind": "object", "id": "order:o-1"} in scopes
    assert {"kind": "subject", "id": "Ana@Example.com"} in scopes
    assert {"kind": "conversation", "id": "+34 600 111 222"} in scopes
    put_bodies = [body for method, _, body in sent if method == "PUT"]
    assert all(body["mode"] == "merge_by_key" and "if_version" not in body
               for body in put_bodies)
    assert all(body["agent"] in ("task_bot", "order_bot", "care_bot") for body in put_bodies)
    # The server canonicalises the subject: another spelling of the handle meets the state.
    assert care_bot.subject("ana@example.com").agent_state.get().body == {"count": 3}
    assert order_bot.object("order", "o-1").agent_state.get().version == 1
    # The scope id stays out of reprs (a conversation id can be a phone number).
    assert "600" not in repr(bot.conversation("+34 600 111 222"))


def test_parallel_merges_through_one_agent_lose_no_field(bot: Agent):
    state = bot.conversation("c-1").agent_state

    def work(i: int) -> AgentStateWritten:
        return state.put({f"f{i}": i})

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(work, range(8)))
    assert sorted(result.version for result in results) == list(range(1, 9))
    assert state.get().body == {f"f{i}": i for i in range(8)}


# --- read your writes --------------------------------------------------------------------------


class Behind(BaseAdapter):
    """Writes go to the app; while ``frozen`` is set, reads answer that older read instead."""

    def __init__(self, inner: FlaskAdapter) -> None:
        super().__init__()
        self.inner = inner
        self.frozen: requests.Response | None = None

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        is_read = (request.url or "").endswith("/v1/agent-state/read")
        if is_read and self.frozen is not None:
            return self.frozen
        return self.inner.send(request, **kwargs)

    def freeze(self, bot: Agent, scope: dict[str, str]) -> None:
        """Answer every later read with the state as it is now."""
        self.frozen = self.inner.send(bot.transport.session.prepare_request(requests.Request(
            "POST", BASE + "/v1/agent-state/read",
            json={**bot.identity, "scope": scope}, headers=bot.transport.headers())))

    def close(self) -> None:
        pass


def test_a_read_older_than_the_sdks_write_serves_the_sdks_own(adapter: FlaskAdapter):
    behind = Behind(adapter)
    bot = make(adapter=behind)
    enable(bot)
    state = bot.conversation("c-1").agent_state
    state.put({"step": "sizes"})
    assert state.get().version == 1  # the SDK now knows the body at version 1
    behind.freeze(bot, {"kind": "conversation", "id": "c-1"})
    assert state.put({"offer": "familia-plus"}).version == 2
    served = state.get()
    assert (served.body, served.version) == ({"step": "sizes", "offer": "familia-plus"}, 2)
    assert not served.stale
    # Another SDK (no writes of its own) is served what Loom answers.
    fresh = make(adapter=behind)
    assert fresh.conversation("c-1").agent_state.get().version == 1
    # A cas body is known whole.
    assert state.put({"step": "checkout"}, mode="cas", if_version=2).version == 3
    assert state.get() == AgentState({"step": "checkout"}, 3, state.get().updated_at)
    # When Loom catches up (or another writer moves on), the newer answer wins.
    behind.frozen = None
    other = make(adapter=adapter)
    other.conversation("c-1").agent_state.put({"count": 7})
    assert state.get().body == {"step": "checkout", "count": 7}
    assert state.get().version == 4


def test_a_merge_over_a_state_the_sdk_never_held_is_served_stale_not_invented(
    adapter: FlaskAdapter,
):
    behind = Behind(adapter)
    first = make(adapter=adapter)
    enable(first)
    first.conversation("c-1").agent_state.put({"step": "sizes"})
    bot = make(adapter=behind)
    behind.freeze(bot, {"kind": "conversation", "id": "c-1"})
    assert bot.conversation("c-1").agent_state.put({"offer": "x"}).version == 2
    served = bot.conversation("c-1").agent_state.get()
    assert (served.body, served.version, served.stale) == ({"step": "sizes"}, 1, True)


# --- Loom out of reach -------------------------------------------------------------------------


@pytest.fixture
def offline(app) -> Iterator[tuple[Agent, str, FlaskAdapter]]:
    """An Agent whose base URL refuses connections until the adapter is mounted on it."""
    base = refusing_url()
    adapter = FlaskAdapter(app)
    with make(base, adapter) as bot:
        enable(bot)
        yield bot, base, adapter


def test_a_write_out_of_reach_is_kept_and_sent_again_with_its_if_version(offline):
    bot, base, adapter = offline
    state = bot.conversation("c-1").agent_state
    assert state.put({"step": "sizes"}).version == 1
    unmount(bot, base)  # Loom stops

    queued = state.put({"offer": "familia-plus"}, mode="merge_by_key", if_version=1)
    assert queued == AgentStateWritten(stored=False, version=1, reason="pending", pending=True)
    merge = state.put({"note": "n"})
    assert merge.pending and len(state.pending) == 2 and bot.flush() == 2
    # Read while out of reach: the last known state with the queued writes over it.
    view = state.get()
    assert view == AgentState({"step": "sizes", "offer": "familia-plus", "note": "n"}, 1,
                              view.updated_at, offline=True, pending=2)

    bot.transport.session.mount(base, adapter)  # Loom is back
    before = len(adapter.sent)
    assert state.get() == AgentState({"step": "sizes", "offer": "familia-plus", "note": "n"},
                                     3, state.get().updated_at)
    replayed = [body for method, _, body in sent_bodies(adapter)[before:] if method == "PUT"]
    assert replayed[0]["if_version"] == 1 and replayed[0]["body"] == {"offer": "familia-plus"}
    # A merge_by_key queued without if_version is sent again without one.
    assert "if_version" not in replayed[1] and replayed[1]["body"] == {"note": "n"}
    assert state.pending == [] and bot.agent_state.conflicts == []


def test_a_replayed_cas_that_conflicts_lands_in_conflicts(offline):
    bot, base, adapter = offline
    state = bot.conversation("c-1").agent_state
    read = state.get()
    unmount(bot, base)
    queued = state.put({"step": "checkout"}, mode="cas", if_version=read.version)
    assert queued.pending
    # Meanwhile another writer moves the version.
    other = make(adapter=adapter)
    assert other.conversation("c-1").agent_state.put({"step": "offer"}).version == 1

    bot.transport.session.mount(base, adapter)
    after = state.put({"note": "later"})  # the next call sends the queue first
    assert after.stored and after.version == 2
    (conflict,) = state.conflicts
    assert conflict is bot.agent_state.conflicts[0]
    assert (conflict.mode, conflict.body, conflict.if_version) == ("cas", {"step": "checkout"}, 0)
    assert conflict.scope == {"kind": "conversation", "id": "c-1"}
    assert isinstance(conflict.error, errors.AgentStateConflict)
    assert conflict.error.status == 412 and conflict.error.details["version"] == 1
    # Never merged in silence: the other writer's state stands, plus the later write.
    assert state.get().body == {"step": "offer", "note": "later"}
    assert bot.conversation("c-2").agent_state.conflicts == []


def test_the_queue_keeps_its_order_across_scopes_and_reports_refusals(offline):
    bot, base, adapter = offline
    unmount(bot, base)
    one, two = bot.conversation("c-1").agent_state, bot.conversation("c-2").agent_state
    one.put({"count": 1})
    two.put({"colour": "blue"})  # not declared: refused when it reaches Loom
    one.put({"count": 2})
    assert [w.scope["id"] for w in bot.agent_state.pending] == ["c-1", "c-2", "c-1"]
    assert len(one.pending) == 2 and len(two.pending) == 1
    bot.transport.session.mount(base, adapter)
    assert two.flush() == 0
    assert one.get().body == {"count": 2} and one.get().version == 2
    (refused,) = two.rejected
    assert (refused.reason, refused.error, refused.body) == (
        "not_declared_field", None, {"colour": "blue"})
    assert one.rejected == [] and bot.agent_state.conflicts == []


def test_a_timeout_also_keeps_the_write(app):
    class Silent(BaseAdapter):
        def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
            raise requests.ReadTimeout("no answer")

        def close(self) -> None:
            pass

    bot = make(adapter=FlaskAdapter(app))
    enable(bot)
    bot.transport.session.mount(BASE, Silent())
    assert bot.conversation("c-1").agent_state.put({"count": 1}).pending
    bot.transport.session.mount(BASE, FlaskAdapter(app))
    assert bot.flush() == 0
    assert bot.conversation("c-1").agent_state.get().body == {"count": 1}


@pytest.mark.slow
def test_the_seed_example_against_gunicorn(live_server):
    with make(live_server.url) as bot:
        enable(bot)
        conversation = bot.conversation("c-1")
        state = conversation.agent_state.get()
        assert (state.body, state.version) == ({}, 0)
        assert conversation.agent_state.put({"step": "sizes", "offer": "familia-plus"}).stored
        written = conversation.agent_state.put({"step": "checkout"}, mode="cas",
                                               if_version=state.version)
        assert (written.stored, written.reason) == (False, "conflict")
        written = conversation.agent_state.put({"step": "checkout"}, mode="cas", if_version=1)
        assert (written.stored, written.version) == (True, 2)
        assert conversation.agent_state.get().body == {"step": "checkout"}


@pytest.mark.slow
def test_gunicorn_stopped_and_started_again(redis_url: str, tmp_path: Path):
    env = {"REDIS_URL": redis_url, "LOOM_SECRET_KEY": TEST_SECRET, "LOOM_DATA_DIR": str(tmp_path)}
    server = LiveServer(env).start()
    try:
        bot = make(server.url)
        enable(bot)
        state = bot.conversation("c-1").agent_state
        assert state.put({"step": "sizes"}).version == 1
        read = state.get()
        server.stop()

        cas = state.put({"step": "checkout"}, mode="cas", if_version=read.version)
        merge = state.put({"note": "kept"})
        assert cas.pending and merge.pending
        assert state.get().offline

        server.start()  # the same port
        other = make(server.url)
        assert other.conversation("c-1").agent_state.put({"step": "offer"}).version == 2
        assert bot.flush() == 0
        (conflict,) = state.conflicts
        assert conflict.if_version == 1 and conflict.error.details["version"] == 2
        final = state.get()
        assert (final.body, final.version) == ({"step": "offer", "note": "kept"}, 3)
    finally:
        server.stop()


# --- replay ------------------------------------------------------------------------------------


class Refuse(BaseAdapter):
    """Fails the test on any request: a replay makes no HTTP call for agent state."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[requests.PreparedRequest] = []

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        self.sent.append(request)
        raise requests.ConnectionError("a replay sent a request")

    def close(self) -> None:
        pass


def test_a_replay_keeps_agent_state_in_the_sdk_without_http():
    base = refusing_url()
    spy = Refuse()
    with make(base, spy, replay=True) as bot:
        state = bot.conversation("c-1").agent_state
        assert state.get() == AgentState({}, 0, None)
        assert state.put({"step": "sizes", "offer": "x"}) == AgentStateWritten(True, 1, None)
        assert state.put({"offer": {"$delete": True}}).version == 2
        assert state.put({"step": "checkout"}, mode="cas", if_version=2).version == 3
        stale = state.put({"step": "sizes"}, mode="cas", if_version=1)
        assert stale == AgentStateWritten(False, 3, "conflict")
        with pytest.raises(ValueError):
            state.put({"step": "sizes"}, mode="cas")
        got = state.get()
        assert (got.body, got.version, got.offline) == ({"step": "checkout"}, 3, False)
        assert bot.task("t-1").agent_state.get().version == 0  # every scope starts empty
        assert bot.flush() == 0 and state.pending == [] and state.conflicts == []
    assert spy.sent == []
    # A replay starts empty whatever an earlier run wrote.
    with make(base, spy, replay=True) as again:
        assert again.conversation("c-1").agent_state.get().version == 0
    assert spy.sent == []


def test_outside_a_replay_the_same_refusing_url_queues(offline):
    bot, base, _ = offline
    unmount(bot, base)
    with pytest.raises(errors.LoomConnectionError):
        bot.working_memory.get("state")  # other planes still raise
    assert bot.conversation("c-1").agent_state.put({"count": 1}).pending


def test_parallel_writers_while_out_of_reach_all_land(offline):
    bot, base, adapter = offline
    unmount(bot, base)
    lock = threading.Lock()
    done: list[AgentStateWritten] = []

    def work(i: int) -> None:
        written = bot.conversation("c-1").agent_state.put({f"f{i}": i})
        with lock:
            done.append(written)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(work, range(8)))
    assert all(w.pending for w in done) and len(bot.agent_state.pending) == 8
    bot.transport.session.mount(base, adapter)
    assert bot.flush() == 0
    got = bot.conversation("c-1").agent_state.get()
    assert got.body == {f"f{i}": i for i in range(8)} and got.version == 8
