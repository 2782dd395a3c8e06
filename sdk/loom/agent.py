"""``Agent``: one identity (org, namespace, agent) talking to one Loom server.

An ``Agent`` owns one ``requests.Session`` (through ``loom.transport.Transport``); use it as a
context manager, or call ``close()``. Every call has a timeout: ``timeout`` here (seconds) is
the default, and each method takes its own ``timeout=``.
"""

from __future__ import annotations

from typing import Any

from loom.agent_state import AgentStateKeeper, Scope
from loom.client import OpsClient
from loom.planes import KeywordPlane, Profile, WorkingMemory
from loom.transport import CLIENT_NAME, DEFAULT_TIMEOUT, Transport


class Agent:
    """The SDK's entry point.

    ``org``, ``namespace`` and ``agent`` are sent with every call, under the body: a call that
    names one of them wins. Left out, a token that fixes them fills them in. ``base_url``
    defaults to ``LOOM_API_URL`` (else ``http://127.0.0.1:8000``), ``api_key`` to
    ``LOOM_API_KEY`` (sent as ``Authorization: Bearer``).

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
        replay: bool = False,
    ) -> None:
        self.identity: dict[str, str] = {
            name: value
            for name, value in (("org", org), ("namespace", namespace), ("agent", agent))
            if value is not None
        }
        self.transport = Transport(base_url, api_key, timeout=timeout, client_name=client_name)
        self.client = OpsClient(self.transport, self.identity)
        self.working_memory = WorkingMemory(self.client)
        self.profile = Profile(self.client)
        self.memory = KeywordPlane(self.client, "memory")
        self.context = KeywordPlane(self.client, "context")
        self.agent_state = AgentStateKeeper(self.client, self.identity, replay=replay)

    def conversation(self, conversation_id: str) -> Scope:
        return Scope(self.agent_state, "conversation", conversation_id)

    def task(self, task_id: str) -> Scope:
        return Scope(self.agent_state, "task", task_id)

    def object(self, object_type: str, object_id: str) -> Scope:
        """An object's scope; its id travels as ``"<type>:<id>"``."""
        return Scope(self.agent_state, "object", f"{object_type}:{object_id}")

    def subject(self, handle: str) -> Scope:
        """A customer's scope, by one of their handles (email, phone, customer id)."""
        return Scope(self.agent_state, "subject", handle)

    def flush(self, *, timeout: float | None = None) -> int:
        """Send agent-state writes queued while Loom was out of reach; answers how many wait."""
        return self.agent_state.flush(timeout=timeout)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        who = "/".join(self.identity.get(k, "?") for k in ("org", "namespace", "agent"))
        return f"<loom Agent {who} at {self.transport.base_url}>"
