"""Writing or checking the files Loom generates from its own code.

Each generator (``python -m app.docs_reference``: the site's reference and benchmarks pages
and the typed ``Settings`` fields; ``python -m app.sdk_manifest``: the SDK's manifest and
typed answers) renders every file it owns in memory and hands them here: written when behind,
or with ``--check`` only compared, each file behind named and the exit status 1. CI runs
both with ``--check``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path


def behind(files: Mapping[Path, str]) -> list[Path]:
    """The files whose text on disk is not the freshly generated one."""
    return [path for path, fresh in files.items()
            if not path.exists() or path.read_text() != fresh]


def sync(files: Mapping[Path, str], argv: list[str], command: str) -> int:
    """Write each file that is behind; with ``--check`` in ``argv``, name them and answer 1."""
    stale = behind(files)
    if "--check" in argv:
        for path in stale:
            print(f"{path.name} is behind the code: run {command}", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(files[path])
    return 0
