"""50 clients that send their headers slowly never stop others being answered.

Real gunicorn with the Procfile's configuration (``gunicorn.conf.py``, its defaults), real
slow sockets on loopback, and a well-behaved client probing meanwhile on new connections. How
fast the probes are answered is a speed target, measured by ``bench/slow_clients.py``; here
the probes' timeout only stops a hung test (a worker held by a slow client never answers).
"""

from __future__ import annotations

import socket
import threading

import pytest
import requests

pytestmark = [pytest.mark.real, pytest.mark.slow]

SLOW_CLIENTS = 50
PROBES = 20
BLOCK = {"namespace": "n", "agent": "a", "run_id": "r", "block_key": "state"}


def _slow_client(port: int, stop: threading.Event, opened: threading.Semaphore) -> None:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        sock.sendall(b"POST /v1/working_memory.get HTTP/1.1\r\nHost: x\r\n")
        opened.release()  # connected and mid-headers, holding its connection from now on
        n = 0
        while not stop.wait(1.0):
            sock.sendall(f"X-Slow-{n}: 1\r\n".encode())
            n += 1
    except OSError:
        pass
    finally:
        sock.close()


def test_fifty_slow_header_clients_never_stop_others_being_answered(live_server):
    url = live_server.url
    assert requests.post(url + "/v1/working_memory.set", json={**BLOCK, "content": "ok"},
                         timeout=5).status_code == 200
    stop = threading.Event()
    opened = threading.Semaphore(0)
    threads = [threading.Thread(target=_slow_client, args=(live_server.port, stop, opened),
                                daemon=True) for _ in range(SLOW_CLIENTS)]
    try:
        for thread in threads:
            thread.start()
        for _ in threads:
            assert opened.acquire(timeout=60)  # a hang guard: each slow client is mid-headers
        for _ in range(PROBES):
            response = requests.post(url + "/v1/working_memory.get", json=BLOCK, timeout=30,
                                     headers={"Connection": "close"})
            assert response.status_code == 200
            assert response.json()["content"] == "ok"
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=5)
