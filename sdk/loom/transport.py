"""One HTTP connection to a Loom server: the ``requests.Session``, headers, timeouts, errors.

Everything the SDK and the MCP server send goes through ``Transport.call``. It owns the only
``requests`` calls in the package, so the timeout rule (every call has one) and the error
wrapping (every failure is a ``loom.errors.LoomError``) hold in one place.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import requests

from loom._version import __version__
from loom.errors import (
    LoomAPIError,
    LoomConnectionError,
    LoomTimeout,
    LoomTransportError,
    error_from_answer,
)

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT = 10.0
CLIENT_NAME = f"loom-python/{__version__}"
# Flask's <converter:name> and OpenAPI's {name} path parameters.
PATH_PARAMETER = re.compile(r"<(?:[a-z_]+:)?(?P<angle>\w+)>|\{(?P<brace>\w+)\}")


def default_base_url() -> str:
    return os.environ.get("LOOM_API_URL") or DEFAULT_BASE_URL


def default_api_key() -> str | None:
    return os.environ.get("LOOM_API_KEY") or None


class Transport:
    """Sends op calls to ``base_url`` and turns answers into dicts or ``LoomError``s.

    ``timeout`` (seconds) applies to connecting and to each wait for answer bytes, as
    ``requests`` measures it; a call may pass its own.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        client_name: str = CLIENT_NAME,
    ) -> None:
        if timeout is None or timeout <= 0:
            raise ValueError("timeout must be a positive number of seconds")
        self.base_url = (base_url or default_base_url()).rstrip("/")
        self.api_key = api_key if api_key is not None else default_api_key()
        self.timeout = float(timeout)
        self.client_name = client_name
        self.session = requests.Session()

    def close(self) -> None:
        self.session.close()

    def headers(self, authorization: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json", "X-Loom-Client": self.client_name}
        if authorization:
            headers["Authorization"] = authorization
        elif self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def call(
        self,
        op: str,
        body: Mapping[str, Any],
        *,
        http_method: str = "POST",
        path: str | None = None,
        timeout: float | None = None,
        authorization: str | None = None,
    ) -> dict[str, Any]:
        """Call one op and return its answer.

        ``path`` is the op's REST path when it declares one (``{name}`` parts are filled from
        ``body`` and leave it); otherwise ``/v1/<op>``. A GET sends the body as the query.
        ``authorization`` replaces the ``Authorization`` header built from ``api_key``.
        """
        payload = dict(body)
        url = self.base_url + (_fill_path(path, payload) if path else f"/v1/{op}")
        method = http_method.upper()
        try:
            response = self.session.request(
                method,
                url,
                json=None if method == "GET" else payload,
                params=payload if method == "GET" else None,
                headers=self.headers(authorization),
                timeout=timeout if timeout is not None else self.timeout,
                allow_redirects=False,
            )
        # ConnectTimeout is both a Timeout and a ConnectionError: it is a timeout first.
        except requests.Timeout as exc:
            raise LoomTimeout(f"{op}: no answer from {self.base_url} in time ({exc})") from exc
        except requests.ConnectionError as exc:
            raise LoomConnectionError(f"{op}: cannot reach {self.base_url} ({exc})") from exc
        except requests.RequestException as exc:
            raise LoomTransportError(f"{op}: request failed ({exc})") from exc
        return read_answer(response)


def read_answer(response: requests.Response) -> dict[str, Any]:
    """The answer dict of a 2xx, or the matching ``LoomAPIError`` for anything else."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if 200 <= response.status_code < 300:
        if not isinstance(data, dict):
            raise LoomAPIError(
                "the server's answer is not a JSON object",
                status=response.status_code,
                code="INVALID_ANSWER",
                response=response,
            )
        return data
    error = data.get("error") if isinstance(data, dict) else None
    raise error_from_answer(
        response.status_code, error if isinstance(error, dict) else None, response
    )


def _fill_path(template: str, payload: dict[str, Any]) -> str:
    """A REST path with its parameters (``<profile_id>`` or ``{profile_id}``) taken out of
    ``payload``: ``/v1/profiles/<profile_id>/agent-state`` -> ``/v1/profiles/u-42/...``."""

    def fill(match: re.Match[str]) -> str:
        name = match.group("angle") or match.group("brace")
        if name not in payload:
            raise ValueError(f"{template} needs {name!r} in the body")
        return quote(str(payload.pop(name)), safe="")

    return PATH_PARAMETER.sub(fill, template)
