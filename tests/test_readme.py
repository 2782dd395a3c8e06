"""The README tells the truth: its tables match the code, CI runs its test command."""

from __future__ import annotations

import re
from pathlib import Path

from app import readme

ROOT = Path(__file__).resolve().parents[1]


def test_readme_tables_match_settings_and_registry():
    text = readme.README.read_text()
    assert readme.render(text) == text, "run `python -m app.readme` to refresh the README tables"


def test_ci_runs_exactly_the_readme_test_command():
    text = readme.README.read_text()
    section = text.split("## Test it", 1)[1]
    command = re.search(r"```sh\n(.+?)\n```", section, flags=re.DOTALL).group(1).strip()
    ci = (ROOT / ".ci" / "run").read_text()
    assert command in ci.splitlines()


def test_procfile_has_the_three_processes():
    lines = (ROOT / "Procfile").read_text().splitlines()
    names = [line.split(":", 1)[0] for line in lines if line.strip()]
    assert {"web", "worker", "scheduler"} <= set(names)
    web = next(line for line in lines if line.startswith("web:"))
    assert "gunicorn wsgi:app" in web and "sync" in web
