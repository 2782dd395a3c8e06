"""A scripted OpenAI-compatible model server on loopback, for tests of Loom's model calls.

Loom's tests drive the real HTTP path (``requests`` over a socket) instead of patching the
client, so this module owns a small ``/v1/chat/completions`` server that answers from a script:

    with ScriptedModelServer() as srv:
        srv.script({"preferred_name": "Sam"})              # content as a JSON object
        srv.script("not json", finish_reason="length")     # raw content text
        srv.script(status=500, body={"error": {"message": "boom"}})
        srv.script({"a": 1}, refuse_response_format=True)  # 400 while json_schema is asked
        srv.script({"a": 1}, gate=threading.Event())       # no answer until the gate is set
        provider = OpenAICompatibleProvider(srv.base_url, "key", "m", 5)
        ...
        srv.requests[0].body["max_tokens"]

When the script is empty, ``default`` answers: a value (dict or str content), a ``ScriptedAnswer``
or a callable taking the request's JSON body and returning either. Every request is recorded.

``POST /v1/embeddings`` answers deterministic vectors, so tests can reason about similarity:
each text is a hashed bag of its lowercase words (one signed bucket a word, L2-normalised), so
texts sharing words are close and texts sharing none are near orthogonal. ``synonyms`` maps a
word onto another's bucket, so "car" and "automobile" can mean the same to the vector leg while
the lexical leg sees two words::

    srv = ScriptedModelServer(synonyms={"automobile": "car"})
    srv.script_embedding(status=500)                       # the next embeddings call fails
    srv.embedding_requests[0].body["input"]                # the texts of the first call
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_CONTENT: dict[str, Any] = {}

# Length of the scripted embeddings when a request names no ``dimensions``.
DEFAULT_EMBEDDING_DIMENSIONS = 256
_WORD_RE = re.compile(r"[a-z0-9]+")


def hashed_embedding(
    text: str, dimensions: int = DEFAULT_EMBEDDING_DIMENSIONS,
    synonyms: dict[str, str] | None = None,
) -> list[float]:
    """The scripted server's vector for ``text``: a signed hashed bag of words, unit length
    (all zeros but the first component for a text without words, so cosine stays defined)."""
    vector = [0.0] * dimensions
    for word in _WORD_RE.findall(text.lower()):
        word = (synonyms or {}).get(word, word)
        digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
        bucket = int.from_bytes(digest[:4], "big") % dimensions
        vector[bucket] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector))
    if norm == 0:
        vector[0] = 1.0
        return vector
    return [x / norm for x in vector]


@dataclass
class ScriptedAnswer:
    """One answer. ``body`` (with any ``status``) replaces the chat completion verbatim."""

    content: Any = None
    finish_reason: str = "stop"
    status: int = 200
    body: Any = None
    delay: float = 0.0
    # The response_format types ("json_schema", "json_object") this answer refuses with a 400;
    # a refused request leaves the answer queued for the next request.
    refuse: frozenset[str] = frozenset()
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    # Held until set: the answer waits for the test (a write made while a call is in flight).
    gate: threading.Event | None = None


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes = field(repr=False, default=b"")

    @property
    def response_format_type(self) -> str | None:
        """``json_schema``, ``json_object`` or None (prompt-only)."""
        if isinstance(self.body, dict) and isinstance(self.body.get("response_format"), dict):
            return self.body["response_format"].get("type")
        return None


DefaultAnswer = ScriptedAnswer | dict[str, Any] | str | Callable[[Any], Any] | None


def _refusal_set(refuse: bool | str | Iterable[str]) -> frozenset[str]:
    if refuse is True:
        return frozenset({"json_schema"})
    if not refuse:
        return frozenset()
    if isinstance(refuse, str):
        return frozenset({refuse})
    return frozenset(refuse)


class ScriptedModelServer:
    """An OpenAI-compatible server on 127.0.0.1, a free port, in a background thread."""

    def __init__(
        self,
        default: DefaultAnswer = None,
        *,
        refuse_response_formats: Iterable[str] = (),
        model: str = "scripted-model",
        synonyms: dict[str, str] | None = None,
    ) -> None:
        self.default: DefaultAnswer = default
        # Words the embeddings treat as another word (``{"automobile": "car"}``).
        self.synonyms: dict[str, str] = dict(synonyms or {})
        self._embedding_queue: deque[ScriptedAnswer] = deque()
        # Server-wide refusals (a server that never takes json_schema, say), on top of any
        # one answer's own.
        self.refuse_response_formats = frozenset(refuse_response_formats)
        self.model = model
        self._queue: deque[ScriptedAnswer] = deque()
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._counter = 0

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> ScriptedModelServer:
        owner = self

        class Handler(_Handler):
            server_owner = owner

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True  # a delayed answer must not hold up close()
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()  # wakes answers sleeping on a delay
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> ScriptedModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the scripted model server is not running")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- scripting ----------------------------------------------------------------------------

    def script(
        self,
        content: Any = None,
        *,
        finish_reason: str = "stop",
        status: int = 200,
        body: Any = None,
        delay: float = 0.0,
        refuse_response_format: bool | str | Iterable[str] = False,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        gate: threading.Event | None = None,
    ) -> ScriptedAnswer:
        """Queue one answer; ``refuse_response_format=True`` refuses json_schema requests.
        With ``gate`` the answer waits until the test sets it: a gate never set is a server
        that never answers (until it closes), whatever the client's timeout and the load."""
        answer = ScriptedAnswer(
            content=content,
            finish_reason=finish_reason,
            status=status,
            body=body,
            delay=delay,
            refuse=_refusal_set(refuse_response_format),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            gate=gate,
        )
        with self._lock:
            self._queue.append(answer)
        return answer

    def script_embedding(
        self, *, status: int = 200, body: Any = None, delay: float = 0.0,
        gate: threading.Event | None = None,
    ) -> ScriptedAnswer:
        """Queue one answer for the next ``/embeddings`` call: an HTTP status (with a body, or
        an OpenAI-shaped error), or a verbatim ``body`` (a malformed answer); with ``gate``,
        the hashed vectors once the test sets it. Unscripted calls get the hashed vectors."""
        answer = ScriptedAnswer(status=status, body=body, delay=delay, gate=gate)
        with self._lock:
            self._embedding_queue.append(answer)
        return answer

    def pending(self) -> int:
        """Answers still queued."""
        with self._lock:
            return len(self._queue)

    @property
    def requests(self) -> list[RecordedRequest]:
        """A copy of every request received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def completion_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    @property
    def embedding_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.rstrip("/").endswith("/embeddings")]

    def embedded_texts(self) -> list[str]:
        """Every text sent to ``/embeddings`` so far, in the order received."""
        texts: list[str] = []
        for request in self.embedding_requests:
            value = request.body.get("input") if isinstance(request.body, dict) else None
            texts.extend([value] if isinstance(value, str) else list(value or []))
        return texts

    # -- answering (called from handler threads) ----------------------------------------------

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _next_answer(self, body: Any) -> tuple[ScriptedAnswer, bool]:
        """The answer for this request and whether it is a refusal of its response_format."""
        fmt = None
        if isinstance(body, dict) and isinstance(body.get("response_format"), dict):
            fmt = body["response_format"].get("type")
        with self._lock:
            head = self._queue[0] if self._queue else None
            refused = fmt is not None and (
                fmt in self.refuse_response_formats or (head is not None and fmt in head.refuse)
            )
            if refused:
                # The queued answer waits for the request that asks in a way it accepts.
                return _refusal(fmt), True
            if head is not None:
                self._queue.popleft()
                return head, False
        return self._default_answer(body), False

    def _default_answer(self, body: Any) -> ScriptedAnswer:
        value = self.default
        if callable(value) and not isinstance(value, ScriptedAnswer):
            value = value(body)
        if isinstance(value, ScriptedAnswer):
            return value
        return ScriptedAnswer(content=DEFAULT_CONTENT if value is None else value)

    def _next_embedding_answer(self) -> ScriptedAnswer | None:
        with self._lock:
            return self._embedding_queue.popleft() if self._embedding_queue else None

    def _embeddings_body(self, request_body: dict[str, Any]) -> tuple[int, Any]:
        texts = request_body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            return 400, {"error": {"message": "input must be a string or a list of strings",
                                   "param": "input"}}
        dimensions = request_body.get("dimensions", DEFAULT_EMBEDDING_DIMENSIONS)
        if not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1:
            return 400, {"error": {"message": "dimensions must be a positive integer",
                                   "param": "dimensions"}}
        data = [
            {"object": "embedding", "index": index,
             "embedding": hashed_embedding(text, dimensions, self.synonyms)}
            for index, text in enumerate(texts)
        ]
        # Tokens as one a word (at least one a text), so a test can predict the ledger.
        tokens = sum(max(1, len(_WORD_RE.findall(text.lower()))) for text in texts)
        return 200, {
            "object": "list",
            "data": data,
            "model": request_body.get("model", self.model),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    def _completion_body(self, request_body: Any, answer: ScriptedAnswer) -> dict[str, Any]:
        content = answer.content
        text = content if isinstance(content, str) else json.dumps(content)
        messages = request_body.get("messages", []) if isinstance(request_body, dict) else []
        prompt_chars = sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, dict))
        # Roughly four characters a token, like the usual tokenizers on English text.
        prompt_tokens = answer.prompt_tokens
        if prompt_tokens is None:
            prompt_tokens = max(1, math.ceil(prompt_chars / 4))
        completion_tokens = answer.completion_tokens
        if completion_tokens is None:
            completion_tokens = max(1, math.ceil(len(text) / 4))
        with self._lock:
            self._counter += 1
            number = self._counter
        return {
            "id": f"chatcmpl-scripted-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request_body.get("model", self.model)
            if isinstance(request_body, dict)
            else self.model,
            # The message's role is left out: Loom reads only the content.
            "choices": [
                {"index": 0, "message": {"content": text}, "finish_reason": answer.finish_reason}
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }


def _refusal(fmt: str) -> ScriptedAnswer:
    # Shaped like OpenAI's and vLLM's answer to an unsupported parameter.
    return ScriptedAnswer(
        status=400,
        body={
            "error": {
                "message": f"response_format type '{fmt}' is not supported by this model",
                "type": "invalid_request_error",
                "param": "response_format",
                "code": None,
            }
        },
    )


class _Handler(BaseHTTPRequestHandler):
    server_owner: ScriptedModelServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean

    def _read_body(self) -> tuple[bytes, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return raw, json.loads(raw) if raw else None
        except ValueError:
            return raw, None

    def _send(self, status: int, body: Any) -> None:
        if isinstance(body, bytes):
            payload, content_type = body, "application/octet-stream"
        elif isinstance(body, str):
            payload, content_type = body.encode("utf-8"), "text/plain; charset=utf-8"
        else:
            payload, content_type = json.dumps(body).encode("utf-8"), "application/json"
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test); nothing to tell it

    def do_GET(self) -> None:
        owner = self.server_owner
        owner._record(RecordedRequest("GET", self.path, dict(self.headers.items()), None))
        if self.path.rstrip("/").endswith("/models"):
            self._send(200, {"object": "list", "data": [{"id": owner.model, "object": "model"}]})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def _held(self, answer: ScriptedAnswer) -> bool:
        """Wait out ``answer``'s delay and gate; False when the server closed meanwhile."""
        closing = self.server_owner._closing
        if answer.delay > 0 and closing.wait(answer.delay):
            return False
        if answer.gate is not None:
            while not answer.gate.wait(0.05):
                if closing.is_set():
                    return False
        return True

    def _answer_embeddings(self, body: Any) -> None:
        owner = self.server_owner
        if not isinstance(body, dict):
            self._send(400, {"error": {"message": "the body must be a JSON object"}})
            return
        scripted = owner._next_embedding_answer()
        if scripted is not None:
            if not self._held(scripted):
                return
            if scripted.body is not None:
                self._send(scripted.status, scripted.body)
                return
            if scripted.status != 200:
                self._send(scripted.status,
                           {"error": {"message": f"scripted HTTP {scripted.status}"}})
                return
        self._send(*owner._embeddings_body(body))

    def do_POST(self) -> None:
        owner = self.server_owner
        raw, body = self._read_body()
        owner._record(RecordedRequest("POST", self.path, dict(self.headers.items()), body, raw))
        if self.path.rstrip("/").endswith("/embeddings"):
            self._answer_embeddings(body)
            return
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        if not isinstance(body, dict):
            self._send(400, {"error": {"message": "the body must be a JSON object"}})
            return
        answer, _refused = owner._next_answer(body)
        if not self._held(answer):
            return  # the server is closing; drop the answer
        if answer.body is not None:
            self._send(answer.status, answer.body)
        elif answer.status != 200:
            self._send(answer.status, {"error": {"message": f"scripted HTTP {answer.status}"}})
        else:
            self._send(200, owner._completion_body(body, answer))
