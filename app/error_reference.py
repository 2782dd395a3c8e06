"""The error catalogue for people: one markdown table of every code Loom answers with.

``markdown_table()`` renders ``app.error_catalogue.CATALOGUE`` (code, status, meaning, detail
fields with their types, what a caller should do); ``python -m app.error_reference --markdown``
prints it, for a generated reference page to include (``--json``: the same as data). It lives
apart from the catalogue so that running it does not re-import a module the ``app`` package
has already loaded.
"""

from __future__ import annotations

import json
import sys

from app.error_catalogue import CATALOGUE, REMEDY_TEXT, as_json


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table() -> str:
    """The catalogue as one markdown table: code, status, meaning, details, what to do."""
    rows = ["| Code | Status | Meaning | Details | What to do |", "|---|---|---|---|---|"]
    for entry in sorted(CATALOGUE, key=lambda item: (item.status, item.code)):
        details = "<br>".join(f"`{detail.name}` ({detail.type}): {detail.meaning}"
                              for detail in entry.details) or "none"
        todo = f"`{entry.remedy.value}`: {entry.advice or REMEDY_TEXT[entry.remedy]}"
        rows.append(f"| `{entry.code}` | {entry.status} | {_cell(entry.meaning)} "
                    f"| {_cell(details)} | {_cell(todo)} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """``python -m app.error_reference --markdown`` prints the table; ``--json`` the
    catalogue as the OpenAPI document's ``x-error-catalogue`` carries it."""
    argv = sys.argv[1:] if argv is None else argv
    if "--json" in argv:
        print(json.dumps(as_json(), indent=2))
        return 0
    if "--markdown" not in argv:
        print("usage: python -m app.error_reference --markdown | --json", file=sys.stderr)
        return 2
    print(markdown_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
