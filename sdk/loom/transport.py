"""The two runners of the SDK: ``Transport`` (sync, ``requests``) and ``AsyncTransport`` (httpx).

They are the only code written twice. Everything they share is here once: the URL and
headers of a call (``Request``), reading an answer into a dict or a ``LoomError``
(``read_answer``), the retry decision (``loom.retry``), and driving a program
(``loom.calls``). Each owns its HTTP client (a ``requests.Session`` or an
``httpx.AsyncClient``), gives every call a timeout, wraps every failure in a ``LoomError``
and records whether a failed request may have reached the server. Every call that writes
carries one ``Idempotency-Key`` for all its tries, so the server applies it once however often
it is sent: that is what lets a write be retried after a reset or a 503.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import requests
import urllib3.exceptions

from loom._version import __version__
from loom.calls import Async, Call, Program, Sync, run_async, run_sync
from loom.errors import (
    Answer,
    LoomAPIError,
    LoomConnectionError,
    LoomError,
    LoomTimeout,
    LoomTransportError,
    error_from_answer,
)
from loom.retry import KEYED, NO_RETRY, Retry

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT = 10.0
IDEMPOTENCY_HEADER = "Idempotency-Key"
CLIENT_NAME = f"loom-python/{__version__}"
# Flask's <converter:name> and OpenAPI's {name} path parameters.
PATH_PARAMETER = re.compile(r"<(?:[a-z_]+:)?(?P<angle>\w+)>|\{(?P<brace>\w+)\}")


def default_base_url() -> str:
    return os.environ.get("LOOM_API_URL") or DEFAULT_BASE_URL


def default_api_key() -> str | None:
    return os.environ.get("LOOM_API_KEY") or None


def idempotency_key(call: Call[Any]) -> str | None:
    """A fresh key for a call that writes, kept by all its tries; a read needs none."""
    return None if call.kind == "read" else uuid.uuid4().hex


def retry_kind(call: Call[Any], key: str | None) -> str:
    """What the retry policy treats the call as: a keyed write is safe to send again."""
    return KEYED if key is not None else call.kind


def retry_policy(retry: Retry | bool | None) -> Retry:
    """``Retry`` as given; ``True``/``None`` the default policy; ``False`` no retries."""
    if retry is None or retry is True:
        return Retry()
    if retry is False:
        return NO_RETRY
    return retry


@dataclass(frozen=True)
class Request:
    """One HTTP request of an op call, before any HTTP library sees it."""

    method: str
    url: str
    json: dict[str, Any] | None
    params: dict[str, Any] | None
    headers: dict[str, str]


class Settings:
    """What both transports are configured with: server, key, timeout, client name, retry,
    and the clock a call's retries are bounded by (``clock``, seconds; ``time.monotonic``)."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        client_name: str = CLIENT_NAME,
        retry: Retry | bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if timeout is None or timeout <= 0:
            raise ValueError("timeout must be a positive number of seconds")
        self.base_url = (base_url or default_base_url()).rstrip("/")
        self.api_key = api_key if api_key is not None else default_api_key()
        self.timeout = float(timeout)
        self.client_name = client_name
        self.retry = retry_policy(retry)
        self.clock = clock

    def headers(self, authorization: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json", "X-Loom-Client": self.client_name}
        if authorization:
            headers["Authorization"] = authorization
        elif self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def request(self, call: Call[Any], authorization: str | None = None,
                key: str | None = None) -> Request:
        """``call.path`` when the op declares one (``{name}`` parts are filled from the body
        and leave it), else ``/v1/<op>``. A GET sends the body as the query; a write carries
        its ``Idempotency-Key``."""
        payload = dict(call.body)
        headers = self.headers(authorization)
        if key is not None:
            headers[IDEMPOTENCY_HEADER] = key
        url = self.base_url + (_fill_path(call.path, payload) if call.path else f"/v1/{call.op}")
        method = call.http_method.upper()
        return Request(
            method=method, url=url,
            json=None if method == "GET" else payload,
            params=payload if method == "GET" else None,
            headers=headers,
        )

    def timeout_of(self, call: Call[Any]) -> float:
        return call.timeout if call.timeout is not None else self.timeout


def read_answer(status: int, data: Any, response: Answer) -> dict[str, Any]:
    """The answer dict of a 2xx, or the matching ``LoomAPIError`` for anything else."""
    if 200 <= status < 300:
        if not isinstance(data, dict):
            raise LoomAPIError(
                "the server's answer is not a JSON object",
                status=status, code="INVALID_ANSWER", response=response,
            )
        return data
    error = data.get("error") if isinstance(data, dict) else None
    raise error_from_answer(status, error if isinstance(error, dict) else None, response)


def _fill_path(template: str, payload: dict[str, Any]) -> str:
    """A REST path with its parameters (``<profile_id>`` or ``{profile_id}``) taken out of
    ``payload``: ``/v1/profiles/<profile_id>/agent-state`` -> ``/v1/profiles/u-42/...``."""

    def fill(match: re.Match[str]) -> str:
        name = match.group("angle") or match.group("brace") or ""
        if name not in payload:
            raise ValueError(f"{template} needs {name!r} in the body")
        return quote(str(payload.pop(name)), safe="")

    return PATH_PARAMETER.sub(fill, template)


def _never_connected(error: requests.ConnectionError) -> bool:
    """Whether ``requests`` failed before the connection was open (nothing was sent)."""
    if isinstance(error, requests.ConnectTimeout):
        return True
    reason: Any = error.args[0] if error.args else None
    reason = getattr(reason, "reason", reason)  # urllib3's MaxRetryError wraps the cause
    return isinstance(reason, urllib3.exceptions.NewConnectionError)


class Transport(Settings):
    """The sync runner, on one ``requests.Session`` (``session``; mount adapters on it).
    ``sleep`` waits between tries (``time.sleep``; a test passes one that only records)."""

    def __init__(self, *args: Any, sleep: Callable[[float], None] = time.sleep,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sleep = sleep
        self.session = requests.Session()
        self._lock = threading.RLock()

    mode: type[Sync] = Sync

    def close(self) -> None:
        self.session.close()

    def run(self, program: Program[Any], *, exclusive: bool = False) -> Any:
        """Run ``program`` to its end, answering its value."""
        if not exclusive:
            return run_sync(program, self.send)
        with self._lock:
            return run_sync(program, self.send)

    def send(self, call: Call[Any], *, authorization: str | None = None) -> dict[str, Any]:
        """One op call with its retries (``loom.retry``)."""
        started, attempt = self.clock(), 1
        key = idempotency_key(call)
        while True:
            try:
                return self._send_once(call, authorization, key)
            except LoomError as error:
                wait = self.retry.wait_before_retry(
                    retry_kind(call, key), error, attempt, self.clock() - started)
                if wait is None:
                    raise
            self.sleep(wait)
            attempt += 1

    def _send_once(self, call: Call[Any], authorization: str | None,
                   key: str | None = None) -> dict[str, Any]:
        request = self.request(call, authorization, key)
        op = call.op
        try:
            response = self.session.request(
                request.method, request.url, json=request.json, params=request.params,
                headers=request.headers, timeout=self.timeout_of(call), allow_redirects=False,
            )
        # ConnectTimeout is both a Timeout and a ConnectionError: it is a timeout first.
        except requests.Timeout as exc:
            raise LoomTimeout(
                f"{op}: no answer from {self.base_url} in time ({exc})",
                may_have_reached_server=not isinstance(exc, requests.ConnectTimeout),
            ) from exc
        except requests.ConnectionError as exc:
            raise LoomConnectionError(
                f"{op}: cannot reach {self.base_url} ({exc})",
                may_have_reached_server=not _never_connected(exc),
            ) from exc
        except requests.RequestException as exc:
            raise LoomTransportError(f"{op}: request failed ({exc})") from exc
        try:
            data = response.json()
        except ValueError:
            data = None
        return read_answer(response.status_code, data, response)


class AsyncTransport(Settings):
    """The async runner, on one ``httpx.AsyncClient`` (``client``), opened on first use.
    ``sleep`` waits between tries (``asyncio.sleep``)."""

    mode: type[Async] = Async

    def __init__(self, *args: Any,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sleep = sleep
        self.client = httpx.AsyncClient(follow_redirects=False)
        self._lock: asyncio.Lock | None = None

    async def aclose(self) -> None:
        await self.client.aclose()

    async def run(self, program: Program[Any], *, exclusive: bool = False) -> Any:
        """Run ``program`` to its end, answering its value."""
        if not exclusive:
            return await run_async(program, self.send)
        if self._lock is None:
            self._lock = asyncio.Lock()  # made here so that it belongs to the running loop
        async with self._lock:
            return await run_async(program, self.send)

    async def send(
        self, call: Call[Any], *, authorization: str | None = None
    ) -> dict[str, Any]:
        """One op call with its retries (``loom.retry``)."""
        started, attempt = self.clock(), 1
        key = idempotency_key(call)
        while True:
            try:
                return await self._send_once(call, authorization, key)
            except LoomError as error:
                wait = self.retry.wait_before_retry(
                    retry_kind(call, key), error, attempt, self.clock() - started)
                if wait is None:
                    raise
            await self.sleep(wait)
            attempt += 1

    async def _send_once(self, call: Call[Any], authorization: str | None,
                         key: str | None = None) -> dict[str, Any]:
        request = self.request(call, authorization, key)
        op = call.op
        try:
            response = await self.client.request(
                request.method, request.url, json=request.json, params=request.params,
                headers=request.headers, timeout=self.timeout_of(call),
            )
        except httpx.TimeoutException as exc:
            raise LoomTimeout(
                f"{op}: no answer from {self.base_url} in time ({exc!r})",
                may_have_reached_server=not isinstance(exc, httpx.ConnectTimeout),
            ) from exc
        except httpx.TransportError as exc:
            raise LoomConnectionError(
                f"{op}: cannot reach {self.base_url} ({exc!r})",
                may_have_reached_server=not isinstance(exc, httpx.ConnectError),
            ) from exc
        except httpx.HTTPError as exc:
            raise LoomTransportError(f"{op}: request failed ({exc!r})") from exc
        try:
            data = response.json()
        except ValueError:
            data = None
        return read_answer(response.status_code, data, response)
