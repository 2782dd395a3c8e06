"""The one way a test calls an op: ``call`` answers the status and the JSON body, ``ok`` asserts
a 200 and answers the body.

A test module binds the pair to the identity its calls send once, and calls them with the
Flask test client (the ``client`` fixture) or a live server (anything with a base ``url``, over
real HTTP)::

    call, ok = op_helpers({"namespace": "support", "agent": "triage-bot"})
    status, out = call(client, "working_memory.get", block_key="b1")
    out = ok(client, "memory.set", {"Authorization": "Bearer ..."}, key="k", value="v")

The identity goes under every body (a field the body names wins); ``prefix`` is put before each
op's name (``op_helpers(NS, prefix="memory.")`` calls ``"set"`` as ``memory.set``);
``headers_for``, when given, turns the third argument (a token, say) into the request's headers.
tests/test_shared_helpers.py fails when a test module writes its own ``call`` or ``ok`` again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import requests


class Call(Protocol):
    def __call__(self, client: Any, op: str, headers: Any = None,
                 **body: Any) -> tuple[int, Any]: ...


class Ok(Protocol):
    def __call__(self, client: Any, op: str, headers: Any = None, **body: Any) -> Any: ...


def op_helpers(identity: Mapping[str, Any] | None = None, *, prefix: str = "",
               headers_for: Callable[[Any], Mapping[str, str]] | None = None,
               ) -> tuple[Call, Ok]:
    """``call`` and ``ok`` for a module's tests (see the module)."""
    sent_identity = dict(identity or {})

    def call(client: Any, op: str, headers: Any = None, **body: Any) -> tuple[int, Any]:
        sent_headers = dict(headers_for(headers) if headers_for is not None else headers or {})
        path = f"/v1/{prefix}{op}"
        json_body = {**sent_identity, **body}
        base_url = getattr(client, "url", None)
        if isinstance(base_url, str):
            response = requests.post(base_url + path, json=json_body, headers=sent_headers,
                                     timeout=10)
            return response.status_code, response.json()
        answer = client.post(path, json=json_body, headers=sent_headers)
        return answer.status_code, answer.get_json()

    def ok(client: Any, op: str, headers: Any = None, **body: Any) -> Any:
        status, out = call(client, op, headers, **body)
        assert status == 200, out
        return out

    return call, ok
