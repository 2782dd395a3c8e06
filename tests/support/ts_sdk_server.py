"""Live Loom servers for the TypeScript SDK's tests: ``python -m tests.support.ts_sdk_server``.

Starts the embedded server (Valkey) on a free port and gunicorn as the Procfile runs it
(``LiveServer``) on free ports: ``open`` with auth off, and ``guarded`` with auth on, the
install admin token below and a per-token request budget, each on its own database. It prints
one JSON line naming them, then reads commands on stdin, answering each with one line:

- ``store stop`` / ``store start``: stop or start the embedded server (Loom answers 503
  STORE_UNAVAILABLE meanwhile);

and stops everything when stdin closes. Every answer is checked against the OpenAPI document
(``LOOM_VALIDATE_ANSWERS``); a mismatch makes the exit status 1.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from app.local import RedisServerProcess
from tests.support.live_server import LiveServer

ADMIN_TOKEN = "ts-sdk-install-admin-token"
SECRET = "ts-sdk-test-secret-key"
# Small enough for a test to spend it, large enough for the rest of a run's admin calls.
# A day-long window: the budget test never straddles a window's end (a minute's would, at
# random, and then no call of it is refused).
RATE_LIMIT = "60/day"


def main(argv: list[str]) -> int:
    names = argv[0].split(",") if argv else ["open", "guarded"]
    root = Path(tempfile.mkdtemp(prefix="loom-ts-sdk-"))
    store = RedisServerProcess(root / "redis", appendonly=False).start()
    servers: dict[str, LiveServer] = {}
    failed = 0
    try:
        for db, name in enumerate(names):
            env = {
                "REDIS_URL": f"redis://127.0.0.1:{store.port}/{db}",
                "LOOM_SECRET_KEY": SECRET,
                "LOOM_DATA_DIR": str(root / name),
                "LOOM_VALIDATE_ANSWERS": "true",
            }
            if name == "guarded":
                env.update(LOOM_AUTH="on", LOOM_ADMIN_TOKEN=ADMIN_TOKEN, LOOM_RATE_LIMIT=RATE_LIMIT)
            servers[name] = LiveServer(env, workers=1).start()
        print(json.dumps({**{name: server.url for name, server in servers.items()},
                          "admin_token": ADMIN_TOKEN, "rate_limit": RATE_LIMIT}), flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "store stop":
                store.stop()
            elif command == "store start":
                store.start()
            else:
                print(f"unknown command {command!r}", flush=True)
                continue
            print("ok", flush=True)
    finally:
        for server in servers.values():
            try:
                server.stop()
            except AssertionError as mismatch:  # answers that broke the OpenAPI document
                print(f"answer contract violation: {mismatch}", file=sys.stderr, flush=True)
                failed = 1
        store.stop()
    return failed


if __name__ == "__main__":
    os.environ.setdefault("LOOM_VALIDATE_ANSWERS", "true")
    sys.exit(main(sys.argv[1:]))
