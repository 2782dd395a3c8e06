"""What no log line of any process may hold: a raw profile id in the agent-state path (any
spelling), a Loom token, a console address naming a user or session, a Basic user name.

The in-process check (``tests/conftest.py``) and the gunicorn check (``LiveServer.stop``)
both read every line through ``leaks``, so a line any process of the suite writes is checked.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

# The agent-state path with anything but the keyed "h:" form, in any spelling the router takes.
_RAW_PROFILE_PATH = re.compile(r"/+v1/+profiles/+(?!h:)[^\s\"']+?/+agent-state", re.IGNORECASE)
# A Loom token's shape (loom_<id>_<secret>), and a Bearer or Basic credential written out.
_TOKEN = re.compile(r"loom_[0-9a-f]{16}_[A-Za-z0-9_-]{8,}|Bearer\s+[A-Za-z0-9._~+/=-]{8,}|"
                    r"Basic\s+[A-Za-z0-9+/=]{8,}")
# A console address carrying a user or session id in its query.
# (``r:<hash>``, a reference the console's session maps back, and ``-``, nobody, are not ids.)
_CONSOLE_ID = re.compile(r"/console/[^\s\"']*[?&](user_id|session_id)=(?!r:)(?!-(?:[&\s\"']|$))"
                         r"[^&\s\"']", re.IGNORECASE)


def _decoded(text: str) -> str:
    for _ in range(4):
        decoded = unquote(text)
        if decoded == text:
            break
        text = decoded
    return text


def leaks(line: str) -> list[str]:
    """The kinds of leak ``line`` holds (empty when it holds none)."""
    decoded = _decoded(line)
    found = []
    if _RAW_PROFILE_PATH.search(decoded):
        found.append("raw profile id")
    if _TOKEN.search(line):
        found.append("token")
    if _CONSOLE_ID.search(decoded):
        found.append("console id")
    return found


def leaking_lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [f"{kinds}: {line}" for line in path.read_text(errors="replace").splitlines()
            if (kinds := leaks(line))]
