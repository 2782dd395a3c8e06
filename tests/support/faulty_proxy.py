"""A TCP proxy on loopback that fails the HTTP requests it is told to, with real sockets.

Each accepted connection carries one request: the proxy forwards it with ``Connection: close``
so that the upstream (a keep-alive gevent worker) ends the answer by closing. The proxy takes
the next fault from ``faults`` (``PASS`` when empty, or ``default`` when set) and:

- ``PASS``: forwards the request and relays the answer;
- ``RESET_BEFORE``: reads the request and resets the connection (RST) without forwarding it;
- ``RESET_AFTER``: forwards the request, reads the server's whole answer, then resets the
  client's connection instead of relaying it: the request *did* reach the server;
- ``CLOSE_BEFORE`` / ``CLOSE_AFTER``: as the resets, but the connection ends with a plain
  close (FIN) and no answer, which is what a client meets when it reuses a kept-alive
  connection just as the server closes it;
- ``UNAVAILABLE``: answers 503 with ``Retry-After: 0`` itself, as a proxy in front of a
  restarting server does.

``seen`` counts requests per path, so a test can tell how often a call was sent, and
``idempotency_keys`` lists each request's ``Idempotency-Key`` header (None without one).
"""

from __future__ import annotations

import socket
import struct
import threading
from collections import Counter, deque

PASS, RESET_BEFORE, RESET_AFTER, UNAVAILABLE = "pass", "reset_before", "reset_after", "503"
CLOSE_BEFORE, CLOSE_AFTER = "close_before", "close_after"
_UNAVAILABLE_BODY = b'{"error": {"code": "SERVICE_UNAVAILABLE", "message": "restarting"}}'
UNAVAILABLE_ANSWER = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 0\r\nConnection: close\r\n"
    + f"Content-Length: {len(_UNAVAILABLE_BODY)}\r\n\r\n".encode() + _UNAVAILABLE_BODY
)


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def _header(request: bytes, name: bytes) -> str | None:
    head = request.partition(b"\r\n\r\n")[0]
    for line in head.split(b"\r\n")[1:]:
        field, _, value = line.partition(b":")
        if field.strip().lower() == name:
            return value.strip().decode("latin-1")
    return None


def _closing(request: bytes) -> bytes:
    """The request with ``Connection: close``, so the upstream closes after its answer."""
    head, _, body = request.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n")
             if line.partition(b":")[0].strip().lower() != b"connection"]
    return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body


def _reset(conn: socket.socket) -> None:
    # SO_LINGER on with a zero timeout: close() sends RST instead of FIN.
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


class FaultyProxy:
    def __init__(self, upstream_port: int, *, port: int = 0) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.faults: deque[str] = deque()
        self.default = PASS
        self.seen: Counter[str] = Counter()
        self.idempotency_keys: list[str | None] = []
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port = self._listener.getsockname()[1]
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FaultyProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping = True
        self._listener.close()
        self._thread.join(timeout=5)

    def _serve(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stopping:
            try:
                conn, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            request = _read_request(conn)
            if not request:
                return
            path = request.split(b" ", 2)[1].decode().split("?", 1)[0]
            self.seen[path] += 1
            self.idempotency_keys.append(_header(request, b"idempotency-key"))
            fault = self.faults.popleft() if self.faults else self.default
            if fault == RESET_BEFORE:
                _reset(conn)
                return
            if fault == CLOSE_BEFORE:
                return  # the with block closes it: a FIN, no answer
            if fault == UNAVAILABLE:
                conn.sendall(UNAVAILABLE_ANSWER)
                return
            with socket.create_connection(self.upstream, timeout=10) as upstream:
                upstream.sendall(_closing(request))
                answer = b""
                while chunk := upstream.recv(65536):
                    answer += chunk
            if fault == RESET_AFTER:
                _reset(conn)
                return
            if fault == CLOSE_AFTER:
                return
            conn.sendall(answer)
