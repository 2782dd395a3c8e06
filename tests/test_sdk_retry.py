"""Retries, both forms, against real sockets: a server that rate-limits on an injected clock,
and a proxy that resets or closes connections or answers 503 (``tests.support.faulty_proxy``).

Reads and idempotent ops are sent again after a reset, a 503 or a 429 (waiting Retry-After);
a write carries one Idempotency-Key for all its tries, so it is sent again too and applied
once. Every Agent here waits on ``tests.support.stepped_time``: a wait is recorded and moves an
injected clock instead of passing, and the rate-limited server runs on that same clock, so the
tests assert the waits asked for and the tries made, never how fast a loaded machine runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any
from urllib.parse import urlparse, urlunparse

import pytest
import redis
from werkzeug.serving import make_server

from app.clock import FrozenClock
from app.local import free_port
from app.store.lua import keyed_source
from loom import Agent, AsyncAgent, Retry, errors
from loom.errors import LoomConnectionError, RateLimited, ServerError
from loom.retry import KEYED, retriable
from tests.conftest import ON_CLUSTER, TEST_SECRET, make_app
from tests.support.faulty_proxy import (
    CLOSE_AFTER,
    CLOSE_BEFORE,
    RESET_AFTER,
    RESET_BEFORE,
    UNAVAILABLE,
    FaultyProxy,
)
from tests.support.holding_proxy import HoldingProxy
from tests.support.live_server import LiveServer
from tests.support.processes import wait_for
from tests.support.stepped_time import SteppedTime

WHO = {"org": "default", "namespace": "support", "agent": "triage-bot"}
FORMS = ("sync", "async")


class RecordedRetry(Retry):
    """A ``Retry`` that notes each wait it chose (so a test sees Retry-After was honoured)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        object.__setattr__(self, "waits", [])

    def wait_before_retry(self, kind: str, error: errors.LoomError, attempt: int,
                          elapsed: float) -> float | None:
        wait = super().wait_before_retry(kind, error, attempt, elapsed)
        self.waits.append((kind, error.code, wait))  # type: ignore[attr-defined]
        return wait


def act(form: str, action: Callable[[Any], Any], *, stepped: SteppedTime | None = None,
        **options: Any) -> Any:
    """Run ``action(bot)`` with a sync ``Agent`` or, awaiting it, an ``AsyncAgent``, its
    retries waiting on ``stepped`` (a fresh ``SteppedTime`` when not given)."""
    options = {**WHO, "timeout": 5, **options}
    stepped = stepped if stepped is not None else SteppedTime()
    if form == "sync":
        with Agent(**options) as bot:
            return action(stepped.install(bot))

    async def scenario() -> Any:
        async with AsyncAgent(**options) as bot:
            pending = action(stepped.install(bot))
            assert inspect.isawaitable(pending)
            return await pending

    return asyncio.run(scenario())


# --- the policy itself ------------------------------------------------------------------------


def test_what_is_safe_to_send_again():
    reset = LoomConnectionError("reset", may_have_reached_server=True)
    refused = LoomConnectionError("refused", may_have_reached_server=False)
    limited = RateLimited("slow down", status=429, code="RATE_LIMITED")
    unavailable = ServerError("down", status=503, code="REDIS_UNAVAILABLE")
    broken = ServerError("bug", status=500, code="INTERNAL_ERROR")
    for kind in ("read", "idempotent"):
        assert all(retriable(kind, error) for error in (reset, refused, limited, unavailable))
        assert not retriable(kind, broken)
    assert retriable("write", refused)
    assert not any(retriable("write", error) for error in (reset, limited, unavailable, broken))
    # A write sent with an Idempotency-Key is applied once however often it is sent.
    running = errors.IdempotencyInProgress("running", status=409, code="IDEMPOTENCY_IN_PROGRESS")
    unknown = errors.IdempotencyOutcomeUnknown(
        "unknown", status=409, code="IDEMPOTENCY_OUTCOME_UNKNOWN")
    assert all(retriable(KEYED, error) for error in (reset, refused, limited, unavailable,
                                                      running))
    assert not any(retriable(KEYED, error) for error in (broken, unknown))
    assert not retriable("write", running)


def test_a_keyed_write_is_sent_again_until_answered_within_the_total():
    policy = Retry(attempts=3, backoff=0.1, max_wait=2.0, total=5.0)
    running = errors.IdempotencyInProgress("running", status=409, code="IDEMPOTENCY_IN_PROGRESS",
                                           details={"retry_after": 1})
    reset = LoomConnectionError("reset", may_have_reached_server=True)
    # Past ``attempts``: only an answer says whether it applied, so it keeps asking.
    assert policy.wait_before_retry(KEYED, running, 7, 0.0) == 1.0
    assert policy.wait_before_retry(KEYED, reset, 7, 0.0) is not None
    assert policy.wait_before_retry(KEYED, running, 7, 4.5) is None  # but not past the total
    assert policy.wait_before_retry("read", reset, 3, 0.0) is None  # others stop at attempts
    assert Retry(attempts=1).wait_before_retry(KEYED, running, 1, 0.0) is None  # retries off


def test_the_policy_is_bounded_and_honours_retry_after():
    policy = Retry(attempts=3, backoff=0.1, max_wait=2.0, total=5.0)
    limited = RateLimited("slow", status=429, details={"retry_after": 1})
    assert policy.wait_before_retry("read", limited, 1, 0.0) == 1.0
    assert policy.wait_before_retry("read", limited, 3, 0.0) is None  # out of attempts
    assert policy.wait_before_retry("read", limited, 1, 4.5) is None  # past the total
    too_long = RateLimited("slow", status=429, details={"retry_after": 30})
    assert policy.wait_before_retry("read", too_long, 1, 0.0) is None  # more than max_wait
    reset = LoomConnectionError("reset")
    assert 0.05 <= policy.wait_before_retry("read", reset, 1, 0.0) <= 0.1
    assert 0.1 <= policy.wait_before_retry("read", reset, 2, 0.0) <= 0.2
    with pytest.raises(ValueError):
        Retry(attempts=0)


# --- real sockets -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api(redis_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {"REDIS_URL": redis_server_url, "LOOM_SECRET_KEY": TEST_SECRET,
           "LOOM_DATA_DIR": str(tmp_path_factory.mktemp("api"))}
    with LiveServer(env) as server:
        yield server


class LimitedServer:
    """The app with a 2-requests-a-second budget on a ``FrozenClock``, on a real socket."""

    def __init__(self, redis_url: str, data_dir: Any) -> None:
        self.clock = FrozenClock()
        self.app = make_app(redis_url, data_dir, rate_limit=(2, 1), clock=self.clock)
        self.server = make_server("127.0.0.1", 0, self.app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def block(self, block_key: str) -> str:
        self.clock.advance(1)  # a fresh window, so the read itself is within the budget
        answer = self.app.test_client().post("/v1/working_memory.get", json={
            **WHO, "block_key": block_key, "run_id": "r"}).get_json()
        return str(answer.get("content", ""))


@pytest.fixture
def limited_api(redis_url: str, tmp_path: Any) -> Iterator[LimitedServer]:
    limited = LimitedServer(redis_url, tmp_path)
    limited.thread.start()
    try:
        yield limited
    finally:
        limited.server.shutdown()
        limited.thread.join(timeout=5)


@pytest.fixture
def proxy(api: LiveServer, redis_url: str) -> Iterator[FaultyProxy]:
    with FaultyProxy(api.port) as running:
        yield running


def block(api: LiveServer) -> str:
    with Agent(**WHO, base_url=api.url) as bot:
        return str(bot.working_memory.get("state", run_id="r").get("content", ""))


@pytest.mark.slow
@pytest.mark.parametrize("form", FORMS)
def test_a_read_survives_a_reset_and_a_503(form: str, proxy: FaultyProxy, api: LiveServer):
    act("sync", lambda bot: bot.working_memory.set("kept", block_key="state", run_id="r"),
        base_url=api.url)
    proxy.faults.extend([RESET_BEFORE, UNAVAILABLE, RESET_AFTER])
    policy = RecordedRetry(attempts=4, backoff=0.2)
    stepped = SteppedTime()
    answer = act(form, lambda bot: bot.working_memory.get("state", run_id="r"),
                 base_url=proxy.url, retry=policy, stepped=stepped)
    assert answer["content"] == "kept"
    assert proxy.seen["/v1/working_memory.get"] == 4
    assert [code for _, code, _ in policy.waits] == [
        "CONNECTION_ERROR", "SERVICE_UNAVAILABLE", "CONNECTION_ERROR"]
    assert stepped.slept == [wait for _, _, wait in policy.waits]  # type: ignore[attr-defined]
    # The 503's Retry-After: 0, not the backoff; the backoffs double, with jitter.
    first, asked, third = stepped.slept
    assert 0.1 <= first <= 0.2 and asked == 0.0 and 0.4 <= third <= 0.8


@pytest.mark.slow
@pytest.mark.parametrize("form", FORMS)
def test_an_idempotent_write_is_sent_again_after_a_reset(form: str, proxy: FaultyProxy,
                                                         api: LiveServer):
    proxy.faults.append(RESET_AFTER)  # the first set reached Loom; its answer was lost
    stepped = SteppedTime()
    answer = act(form, lambda bot: bot.working_memory.set("v1", block_key="state", run_id="r"),
                 base_url=proxy.url, retry=Retry(backoff=0.05), stepped=stepped)
    assert answer["block_key"] == "state"
    assert proxy.seen["/v1/working_memory.set"] == 2
    assert len(stepped.slept) == 1  # one wait, between the two tries
    assert block(api) == "v1"


@pytest.mark.slow
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("fault", [RESET_AFTER, RESET_BEFORE, CLOSE_AFTER, CLOSE_BEFORE,
                                   UNAVAILABLE])
def test_a_write_is_sent_again_with_its_key_and_applied_once(
    form: str, fault: str, proxy: FaultyProxy, api: LiveServer,
):
    """Reached Loom or not, answered or not: the append's second try carries the first try's
    key, so Loom applies it exactly once (a lost answer is answered again, not re-applied)."""
    act("sync", lambda bot: bot.working_memory.set("a", block_key="state", run_id="r"),
        base_url=api.url)
    proxy.faults.append(fault)
    answer = act(form, lambda bot: bot.working_memory.append("b", block_key="state", run_id="r"),
                 base_url=proxy.url, retry=Retry(attempts=5, backoff=0.05))
    assert answer["block_key"] == "state"
    assert proxy.seen["/v1/working_memory.append"] == 2
    first, second = proxy.idempotency_keys
    assert first is not None and first == second
    assert block(api) == "a\nb"
    act(form, lambda bot: bot.working_memory.append("c", block_key="state", run_id="r"),
        base_url=proxy.url)
    assert proxy.idempotency_keys[2] not in (None, first)  # a new call, a new key
    assert block(api) == "a\nb\nc"


@pytest.mark.slow
def test_a_read_carries_no_key(proxy: FaultyProxy):
    act("sync", lambda bot: bot.working_memory.get("state", run_id="r"), base_url=proxy.url)
    assert proxy.idempotency_keys == [None]


@pytest.mark.slow
@pytest.mark.parametrize("form", FORMS)
def test_a_write_whose_connection_never_opened_is_sent_again(form: str, api: LiveServer,
                                                             redis_url: str):
    port = free_port()  # nothing listens there until the second wait: the first tries are refused
    opened: list[FaultyProxy] = []

    with ExitStack() as stack:
        def open_at_second_wait(waits: int) -> None:
            if waits == 2:
                opened.append(stack.enter_context(FaultyProxy(api.port, port=port)))

        act("sync", lambda bot: bot.working_memory.set("a", block_key="state", run_id="r"),
            base_url=api.url)
        policy = RecordedRetry(attempts=5)
        answer = act(form,
                     lambda bot: bot.working_memory.append("b", block_key="state", run_id="r"),
                     base_url=f"http://127.0.0.1:{port}", retry=policy,
                     stepped=SteppedTime(on_sleep=open_at_second_wait))
    assert answer["block_key"] == "state"
    assert [(kind, code) for kind, code, _ in policy.waits] == [  # type: ignore[attr-defined]
        (KEYED, "CONNECTION_ERROR")] * 2
    assert opened[0].seen["/v1/working_memory.append"] == 1  # the third try, the first to land
    assert block(api) == "a\nb"


@pytest.mark.slow
@pytest.mark.parametrize("form", FORMS)
def test_a_rate_limited_read_waits_as_retry_after_asks(form: str, limited_api: LimitedServer):
    policy = RecordedRetry(attempts=3)
    stepped = SteppedTime(limited_api.clock)  # each wait moves the server's rate window on

    def reads(bot: Any) -> Any:
        if isinstance(bot, AsyncAgent):
            async def five() -> list[Any]:
                return [await bot.working_memory.get("state", run_id="r") for _ in range(5)]
            return five()
        return [bot.working_memory.get("state", run_id="r") for _ in range(5)]

    answers = act(form, reads, base_url=limited_api.url, retry=policy, stepped=stepped)
    assert [answer["found"] for answer in answers] == [False] * 5
    # Two a second: the third and the fifth read each wait out the rest of their window.
    assert policy.waits == [("read", "RATE_LIMITED", 1.0)] * 2  # type: ignore[attr-defined]
    assert stepped.slept == [1.0, 1.0]


@pytest.mark.slow
@pytest.mark.parametrize("form", FORMS)
def test_retries_switched_off_raise_and_keyed_writes_wait_out_a_rate_limit(
    form: str, limited_api: LimitedServer,
):
    def burst(op: str, text: str) -> Callable[[Any], Any]:
        def run(bot: Any) -> Any:
            method = getattr(bot.working_memory, op)
            if isinstance(bot, AsyncAgent):
                async def many() -> None:
                    for _ in range(4):
                        await method(text, block_key="b", run_id="r")
                return many()
            for _ in range(4):
                method(text, block_key="b", run_id="r")
            return None
        return run

    stepped = SteppedTime(limited_api.clock)
    with pytest.raises(RateLimited) as off:
        act(form, burst("set", "x"), base_url=limited_api.url, retry=False, stepped=stepped)
    assert off.value.retry_after == 1 and stepped.slept == []
    assert limited_api.block("b") == "x"  # two sets went through, the third was refused
    limited_api.clock.advance(1)
    policy = RecordedRetry(attempts=5)
    act(form, burst("append", "y"), base_url=limited_api.url, retry=policy, stepped=stepped)
    # Each append is sent again after its 429 with the same key: all four land, each once.
    assert limited_api.block("b") == "x\ny\ny\ny\ny"
    assert {kind for kind, _, _ in policy.waits} == {KEYED}  # type: ignore[attr-defined]
    assert [code for _, code, _ in policy.waits] == ["RATE_LIMITED"]  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.parametrize("form", FORMS)
def test_a_keyed_write_waits_out_its_running_first_try_past_the_attempts(
    form: str, redis_url: str, tmp_path: Any,
):
    """The first try's append is held on its way to the store (the worker still runs it,
    renewing its lease), so the client's first try times out and every retry is answered 409
    IDEMPOTENCY_IN_PROGRESS, more times than ``attempts``; once the worker's store call times
    out (the write never ran, the key is let go), the next retry runs it, applied once. (A
    held reply would not do: the append keeps its answer in its own step, so a retry after it
    ran gets that answer at once.)"""
    if ON_CLUSTER:
        pytest.skip("one server behind the relay")
    upstream = urlparse(redis_url)
    relay = HoldingProxy(upstream.port or 6379).start()
    app = make_app(urlunparse(upstream._replace(netloc=f"127.0.0.1:{relay.port}")), tmp_path,
                   redis_socket_timeout_seconds=3)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    data = redis.Redis.from_url(redis_url, decode_responses=True)

    def let_the_first_try_end(waits: int) -> None:
        if waits == 5:
            relay.disarm()
            # The held call times out in the worker, which lets the key go: nothing ran.
            wait_for(lambda: not any(data.hget(key, "state") == "running"
                                     for key in data.scan_iter("loom:idem:*")), 10,
                     "the first try to let its key go")

    try:
        act("sync", lambda bot: bot.working_memory.set("a", block_key="state", run_id="r"),
            base_url=url)
        relay.arm(hashlib.sha1(keyed_source("working_memory_append", "working_memory").encode())
                  .hexdigest().encode(),
                  "request")
        policy = RecordedRetry(attempts=3, backoff=0.05)
        answer = act(form, lambda bot: bot.working_memory.append("b", block_key="state",
                                                                  run_id="r"),
                     base_url=url, timeout=1, retry=policy,
                     stepped=SteppedTime(on_sleep=let_the_first_try_end))
        codes = [code for _, code, _ in policy.waits]  # type: ignore[attr-defined]
        assert codes[0] == "TIMEOUT"
        assert codes[1:] == ["IDEMPOTENCY_IN_PROGRESS"] * (len(codes) - 1)
        assert len(codes) >= 5 > policy.attempts
        assert all(wait == 1.0 for _, _, wait in policy.waits[1:])  # type: ignore[attr-defined]
        assert answer["block_key"] == "state"
        content = app.test_client().post("/v1/working_memory.get", json={
            **WHO, "block_key": "state", "run_id": "r"}).get_json()["content"]
        assert content == "a\nb"
    finally:
        server.shutdown()
        relay.stop()


def test_a_keyed_write_that_never_connected_stops_at_attempts():
    """Past ``attempts`` a keyed write is sent again only while its outcome may be settling
    on the server; a connection that never opened applied nothing and holds no key."""
    policy = Retry(attempts=3)
    refused = LoomConnectionError("refused", may_have_reached_server=False)
    reset = LoomConnectionError("reset", may_have_reached_server=True)
    assert policy.wait_before_retry(KEYED, refused, 2, 0.1) is not None
    assert policy.wait_before_retry(KEYED, refused, 3, 0.1) is None
    assert policy.wait_before_retry(KEYED, reset, 3, 0.1) is not None
    assert policy.wait_before_retry(KEYED, reset, 9, 0.1) is not None

