"""Keeps what is generated from ``SETTINGS`` and the registry equal to them.

``python -m app.readme`` rewrites the README's settings and ops tables between their markers
and the typed fields of ``app.settings.Settings`` (``--check`` only compares); a test and CI
fail when either is behind, so neither can drift from the code.
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

from app import settings as settings_module
from app.generated import sync
from app.ops import load_ops
from app.settings import SETTINGS

README = Path(__file__).resolve().parents[1] / "README.md"
SETTINGS_SOURCE = Path(settings_module.__file__)


def settings_table() -> str:
    rows = ["| Setting | Default | What it does |", "|---|---|---|"]
    for setting in SETTINGS:
        default = f"`{setting.default}`" if setting.default else "(empty)"
        rows.append(f"| `{setting.name}` | {default} | {setting.doc} |")
    return "\n".join(rows)


def ops_table() -> str:
    rows = ["| Op | HTTP | Role | Kind | MCP `all` | Does |", "|---|---|---|---|---|---|"]
    for declared in load_ops():
        if not declared.mcp:
            listed = "never"
        else:
            listed = "yes" if declared.listed else "no"
        rows.append(
            f"| `{declared.name}` | `{declared.http_method} {declared.http_path}` "
            f"| {declared.role} | {declared.kind} | {listed} | {declared.summary} |"
        )
    return "\n".join(rows)


TABLES = {"settings": settings_table, "ops": ops_table}


def _between_markers(table: str, match: re.Match[str]) -> str:
    return match.group(1) + table + match.group(2)


def render(text: str) -> str:
    for name, build in TABLES.items():
        pattern = re.compile(
            rf"(<!-- {name}:start -->\n).*?(\n<!-- {name}:end -->)", flags=re.DOTALL
        )
        text, count = pattern.subn(functools.partial(_between_markers, build()), text)
        if count != 1:
            raise ValueError(f"README needs one <!-- {name}:start/end --> pair")
    return text


def generated_files() -> dict[Path, str]:
    """Each generated file with its fresh text."""
    return {
        README: render(README.read_text()),
        SETTINGS_SOURCE: settings_module.with_generated_fields(SETTINGS_SOURCE.read_text()),
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m app.readme`` rewrites the files; ``--check`` only compares."""
    argv = sys.argv[1:] if argv is None else argv
    return sync(generated_files(), argv, "python -m app.readme")


if __name__ == "__main__":
    sys.exit(main())
