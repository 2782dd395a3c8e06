"""docs/architecture.md names only files and folders that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_path_the_architecture_page_names_exists():
    text = (ROOT / "docs" / "architecture.md").read_text()
    paths = {name.rstrip("/") for name in re.findall(r"`([\w./-]+(?:\.py|\.md|/))`", text)}
    # A store named in the list is a module or, once split by concept, a package.
    paths |= {f"app/store/{name}.py" for name in re.findall(
        r"`(\w+)`", text.split("Each store owns one kind of data:")[1].split(".")[0])}
    assert len(paths) > 20
    missing = sorted(path for path in paths if not (ROOT / path).exists()
                     and not (path.endswith(".py") and (ROOT / path[:-3]).is_dir()))
    assert missing == []
