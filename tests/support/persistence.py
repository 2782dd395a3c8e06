"""The servers the suite starts itself, and their append-only files in either layout.

The suite's own servers run the embedded binary unless ``LOOM_TEST_REDIS_SERVER`` names
another redis-server (CI's second pass names the machine's Redis 7), so the tests that read
persistence files see every layout a deploy may meet: Redis 7 and Valkey keep a folder
``appendonlydir/`` with a manifest and base and incremental files; Redis 6 and older keep one
``appendonly.aof``.
"""

from __future__ import annotations

import os
from pathlib import Path

from app.local import RedisServerProcess


def own_server(data_dir: Path, **options: object) -> RedisServerProcess:
    """A not yet started server of the binary this run tests (see the module docstring)."""
    binary = os.environ.get("LOOM_TEST_REDIS_SERVER") or None
    return RedisServerProcess(data_dir, binary=binary, **options)  # type: ignore[arg-type]


def append_only_files(data_dir: Path) -> list[Path]:
    """Every append-only file under the server's folder, whichever layout it wrote."""
    folder = data_dir / "appendonlydir"
    files = sorted(path for path in folder.glob("*.aof*") if path.is_file())
    single = data_dir / "appendonly.aof"
    if single.is_file():
        files.append(single)
    return files


def append_only_bytes(data_dir: Path) -> bytes:
    """What the append-only files hold, concatenated (manifests left out)."""
    return b"".join(
        path.read_bytes() for path in append_only_files(data_dir)
        if not path.name.endswith(".manifest")
    )
