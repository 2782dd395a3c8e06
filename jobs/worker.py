"""``python -m jobs.worker``: an RQ worker on Loom's queues (scale by running more of them)."""

from __future__ import annotations

import sys

from rq import Worker

from app.settings import load_settings
from jobs.queues import ALL_QUEUES, queue, queue_connection


def main(argv: list[str] | None = None) -> int:
    args = list(argv or [])
    burst = "--burst" in args
    names = [name for name in args if not name.startswith("--")] or list(ALL_QUEUES)
    settings = load_settings()
    connection = queue_connection(settings)
    worker = Worker([queue(name, connection) for name in names], connection=connection)
    worker.work(burst=burst, with_scheduler=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
