"""A ``requests`` transport adapter that hands each request to a Flask app in-process.

Mounted on an SDK's ``requests.Session``, it runs the real app (routing, auth, schemas,
stores, the real Redis) without a socket, so SDK tests are fast and still end to end. It
records the keyword arguments ``requests`` passed (``timeout`` among them) per request.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import BaseAdapter
from requests.structures import CaseInsensitiveDict


class FlaskAdapter(BaseAdapter):
    def __init__(self, app: Any) -> None:
        super().__init__()
        self.client = app.test_client()
        self.sent: list[tuple[requests.PreparedRequest, dict[str, Any]]] = []

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        self.sent.append((request, kwargs))
        parts = urlsplit(request.url or "")
        body = request.body.encode() if isinstance(request.body, str) else request.body
        answer = self.client.open(
            parts.path,
            method=request.method or "GET",
            query_string=parts.query,
            data=body or b"",
            headers=dict(request.headers),
        )
        response = requests.Response()
        response.status_code = answer.status_code
        response.headers = CaseInsensitiveDict(answer.headers)
        response._content = answer.get_data()
        response.url = request.url or ""
        response.request = request
        response.reason = answer.status.split(" ", 1)[1] if " " in answer.status else ""
        response.encoding = "utf-8"
        return response

    def close(self) -> None:
        pass
