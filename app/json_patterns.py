"""Python's string tests as JSON Schema patterns, for the documents' published schemas.

A validator that trims with ``str.strip()`` or tests ``str.strip()`` for emptiness uses
Python's whitespace, which is not ECMA-262's ``\\s`` (Python counts U+001C to U+001F, ECMA
counts U+FEFF). ``PY_SPACE`` is Python's set spelled out as a character class both dialects
read alike, so a pattern states exactly what the validator does.
"""

from __future__ import annotations

import sys


def _space_class() -> str:
    points = [c for c in range(sys.maxunicode + 1) if chr(c).isspace()]
    ranges: list[tuple[int, int]] = []
    for point in points:
        if ranges and ranges[-1][1] == point - 1:
            ranges[-1] = (ranges[-1][0], point)
        else:
            ranges.append((point, point))

    def escaped(point: int) -> str:
        return f"\\x{point:02x}" if point < 0x100 else f"\\u{point:04x}"

    return "".join(escaped(a) if a == b else f"{escaped(a)}-{escaped(b)}" for a, b in ranges)


# The inside of a character class: every character ``str.isspace()`` holds for.
PY_SPACE = _space_class()
# A string with a character ``str.strip()`` keeps (not empty once trimmed).
NOT_BLANK_PATTERN = f"[^{PY_SPACE}]"
