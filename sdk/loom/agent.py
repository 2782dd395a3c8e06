"""``Agent``: one identity (org, namespace, agent) talking to one Loom server, sync or async.

::

    async with Agent(org="acme", namespace="support", agent="triage-bot") as bot:
        await bot.working_memory.set("cursor: ticket 4812", block_key="state", run_id="run-7")

    with Agent(org="acme", namespace="support", agent="triage-bot") as bot:
        bot.working_memory.set("cursor: ticket 4812", block_key="state", run_id="run-7")

``with Agent(...)`` (or a bare ``Agent(...)``) is the sync face, on one ``requests.Session``;
``async with Agent(...)`` gives an ``AsyncAgent``, the async face, on one
``httpx.AsyncClient``, with the same settings and the same agent-state record. Both faces are
``BaseAgent``: every plane and method is defined once (``loom.calls``), and only the transport
differs. ``AsyncAgent(...)`` can also be made directly.

Every call has a timeout: ``timeout`` here (seconds) is the default, and each method takes its
own ``timeout=``. ``retry`` is the retry policy (``loom.retry.Retry``; ``False`` for none).
"""

from __future__ import annotations

from typing import Any

from loom.agent_state import AgentStateKeeper, KeptState, Scope
from loom.answers import OpsClient
from loom.calls import Async, Face, M, Program, Runner, Sync, runs_locked
from loom.planes import KeywordPlane, Profile, WorkingMemory
from loom.retry import Retry
from loom.transport import CLIENT_NAME, DEFAULT_TIMEOUT, AsyncTransport, Transport


class BaseAgent(Face[M]):
    """What both faces have (see ``Agent`` for the arguments).

    - ``bot.working_memory``: set / append / replace / delete / get / render
    - ``bot.profile``: set / append / replace / render / activity / structured / get / list /
      delete
    - ``bot.memory.<op>(**fields)`` and ``bot.context.<op>(**fields)``, e.g.
      ``bot.context.pack(query=...)``
    - ``bot.client.<plane>.<op>({...})``: every op, from the generated manifest
    - ``bot.conversation(id)``, ``bot.task(id)``, ``bot.object(type, id)``,
      ``bot.subject(handle)``: agent-state scopes, each with ``.agent_state.get()`` /
      ``.put(body, mode=..., if_version=...)``; ``bot.agent_state`` keeps what the SDK wrote
      and read, the writes queued while Loom is out of reach and their ``conflicts``
      (``loom.agent_state``). ``replay=True`` keeps agent state in the SDK, with no HTTP.
    """

    _runner: Runner[M]

    def __init__(
        self, runner: Runner[M], identity: dict[str, str], *, replay: bool,
        kept: KeptState | None = None,
    ) -> None:
        self._runner = runner
        self.identity = identity
        self.client: OpsClient[M] = OpsClient(runner, identity)
        self.working_memory: WorkingMemory[M] = WorkingMemory(runner, identity)
        self.profile: Profile[M] = Profile(runner, identity)
        self.memory: KeywordPlane[M] = KeywordPlane(self.client.memory)
        self.context: KeywordPlane[M] = KeywordPlane(self.client.context)
        self.agent_state: AgentStateKeeper[M] = AgentStateKeeper(
            runner, identity, replay=replay, kept=kept)

    def conversation(self, conversation_id: str) -> Scope[M]:
        return Scope(self.agent_state, "conversation", conversation_id)

    def task(self, task_id: str) -> Scope[M]:
        return Scope(self.agent_state, "task", task_id)

    def object(self, object_type: str, object_id: str) -> Scope[M]:
        """An object's scope; its id travels as ``"<type>:<id>"``."""
        return Scope(self.agent_state, "object", f"{object_type}:{object_id}")

    def subject(self, handle: str) -> Scope[M]:
        """A customer's scope, by one of their handles (email, phone, customer id)."""
        return Scope(self.agent_state, "subject", handle)

    @runs_locked
    def flush(self, *, timeout: float | None = None) -> Program[int]:
        """Send agent-state writes queued while Loom was out of reach; answers how many wait."""
        return (yield from self.agent_state.flush_program(timeout))

    def _describe(self, base_url: str) -> str:
        who = "/".join(self.identity.get(k, "?") for k in ("org", "namespace", "agent"))
        return f"<loom {type(self).__name__} {who} at {base_url}>"


def _identity(org: str | None, namespace: str | None, agent: str | None) -> dict[str, str]:
    return {
        name: value
        for name, value in (("org", org), ("namespace", namespace), ("agent", agent))
        if value is not None
    }


class Agent(BaseAgent[Sync]):
    """The SDK's entry point; this object is the sync face.

    ``org``, ``namespace`` and ``agent`` are sent with every call, under the body: a call that
    names one of them wins. Left out, a token that fixes them fills them in. ``base_url``
    defaults to ``LOOM_API_URL`` (else ``http://127.0.0.1:8000``), ``api_key`` to
    ``LOOM_API_KEY`` (sent as ``Authorization: Bearer``). ``async with Agent(...) as bot``
    gives the async face (``AsyncAgent``) with the same settings.
    """

    def __init__(
        self,
        *,
        org: str | None = None,
        namespace: str | None = None,
        agent: str | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        client_name: str = CLIENT_NAME,
        retry: Retry | bool | None = None,
        replay: bool = False,
    ) -> None:
        self._options: dict[str, Any] = {
            "org": org, "namespace": namespace, "agent": agent, "api_key": api_key,
            "base_url": base_url, "timeout": timeout, "client_name": client_name,
            "retry": retry, "replay": replay,
        }
        self.transport = Transport(
            base_url, api_key, timeout=timeout, client_name=client_name, retry=retry)
        self._async: AsyncAgent | None = None
        super().__init__(self.transport, _identity(org, namespace, agent), replay=replay)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> AsyncAgent:
        options = dict(self._options)
        self._async = AsyncAgent(**options, kept=self.agent_state.kept)
        return self._async

    async def __aexit__(self, *exc: object) -> None:
        if self._async is not None:
            await self._async.aclose()
            self._async = None
        self.close()

    def __repr__(self) -> str:
        return self._describe(self.transport.base_url)


class AsyncAgent(BaseAgent[Async]):
    """The async face: every method answers an awaitable. Same arguments as ``Agent``;
    use it as ``async with`` (or ``await bot.aclose()``)."""

    def __init__(
        self,
        *,
        org: str | None = None,
        namespace: str | None = None,
        agent: str | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        client_name: str = CLIENT_NAME,
        retry: Retry | bool | None = None,
        replay: bool = False,
        kept: KeptState | None = None,
    ) -> None:
        self.transport = AsyncTransport(
            base_url, api_key, timeout=timeout, client_name=client_name, retry=retry)
        super().__init__(
            self.transport, _identity(org, namespace, agent), replay=replay, kept=kept)

    async def aclose(self) -> None:
        await self.transport.aclose()

    async def __aenter__(self) -> AsyncAgent:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return self._describe(self.transport.base_url)
