"""What Loom's two OpenAI-compatible clients share: the chat client (app/model/chat.py) and
the embeddings client (app/model/embeddings.py) both POST JSON to ``{base_url}/<path>`` with an
optional bearer key, over a ``requests`` session they own unless one is lent to them, and read
the server's answers with the same two small readers."""

from __future__ import annotations

from typing import Any, Self

import requests


class OpenAICompatibleClient:
    """The HTTP half of an OpenAI-compatible client: where it posts, with which key and
    timeout, and the session it closes (only one it opened itself)."""

    def __init__(self, base_url: str, path: str, api_key: str | None, model: str,
                 timeout_seconds: float, session: requests.Session | None) -> None:
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/{path}"
        self.model = model
        self.timeout_seconds = timeout_seconds
        self._api_key = api_key or ""
        self._owns_session = session is None
        self._session = session if session is not None else requests.Session()

    def close(self) -> None:
        if self._owns_session:
            self._session.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers


def snippet(text: str, limit: int = 200) -> str:
    """A server's answer text on one line, cut for an error message."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def int_or_none(value: Any) -> int | None:
    """A token count from an answer's ``usage``: an int, never a bool, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None
