"""A TCP relay on loopback in front of a Redis server that holds the command carrying a marker.

Armed with a marker (the SHA1 of a script, say), the relay looks at what each client connection
sends; on a connection whose bytes carry the marker it either never forwards that command
(``hold="request"``: the server never runs it) or forwards it and never relays the reply
(``hold="reply"``: the server ran it, the client hears nothing until ``release``). Everything
else passes, so the process behind it runs as usual until it sends that command, then waits on
it as it would on a server that stalled mid-write. ``held`` counts the connections held.
"""

from __future__ import annotations

import socket
import threading
from typing import Literal

Hold = Literal["request", "reply"]


class HoldingProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._marker: bytes | None = None
        self._hold: Hold = "reply"
        self._held = 0
        self._stopped = False
        self._sockets: list[socket.socket] = []
        # Per held connection in reply mode: the client and the replies kept from it.
        self._kept: list[tuple[socket.socket, bytearray, threading.Event]] = []

    @property
    def held(self) -> int:
        with self._lock:
            return self._held

    def arm(self, marker: bytes, hold: Hold) -> None:
        with self._lock:
            self._marker, self._hold, self._held = marker, hold, 0

    def disarm(self) -> None:
        with self._lock:
            self._marker = None

    def release(self) -> None:
        """Disarm, and relay every reply held so far; held connections pass from now on."""
        with self._lock:
            self._marker = None
            kept, self._kept = self._kept, []
        for client, replies, held in kept:
            with self._lock:
                held.clear()
                pending = bytes(replies)
                replies.clear()
            try:
                client.sendall(pending)
            except OSError:
                pass

    def start(self) -> HoldingProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopped = True
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            with self._lock:
                self._sockets += [client, upstream]
            held = threading.Event()
            replies = bytearray()
            threading.Thread(target=self._requests,
                             args=(client, upstream, held, replies), daemon=True).start()
            threading.Thread(target=self._replies,
                             args=(upstream, client, held, replies), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket,
                  held: threading.Event, replies: bytearray) -> None:
        tail = b""  # the end of the last chunk: a marker may arrive split across two
        try:
            while chunk := client.recv(65536):
                if held.is_set():
                    continue  # a held connection's client waits; nothing more goes through
                seen, tail = tail + chunk, chunk[-64:]
                with self._lock:
                    hit = self._marker is not None and self._marker in seen
                    hold = self._hold
                    if hit:
                        self._held += 1
                        held.set()
                        if hold == "reply":
                            self._kept.append((client, replies, held))
                if hit and hold == "request":
                    continue
                upstream.sendall(chunk)
        except OSError:
            pass
        finally:
            _close(client, upstream)

    def _replies(self, upstream: socket.socket, client: socket.socket,
                 held: threading.Event, replies: bytearray) -> None:
        try:
            while chunk := upstream.recv(65536):
                with self._lock:
                    if held.is_set():
                        replies.extend(chunk)
                        continue
                client.sendall(chunk)
        except OSError:
            pass
        finally:
            _close(client, upstream)


def _close(*sockets: socket.socket) -> None:
    for sock in sockets:
        try:
            sock.close()
        except OSError:
            pass
