"""The README tells the truth: its tables match the code, CI runs its test command."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from app import readme, settings

ROOT = Path(__file__).resolve().parents[1]


def test_readme_tables_match_settings_and_registry():
    text = readme.README.read_text()
    assert readme.render(text) == text, "run `python -m app.readme` to refresh the README tables"


def test_the_typed_settings_fields_match_the_settings_table():
    source = readme.SETTINGS_SOURCE.read_text()
    assert settings.with_generated_fields(source) == source, (
        "run `python -m app.readme` to regenerate the Settings fields"
    )
    assert [field.name for field in dataclasses.fields(settings.Settings)] == [
        setting.attr for setting in settings.SETTINGS
    ]


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
    assert "gunicorn wsgi:app" in web and "--config gunicorn.conf.py" in web


def test_gunicorn_conf_takes_its_worker_settings_from_the_environment(monkeypatch, tmp_path):
    import runpy

    # The config sets this when unset; given here, the test leaves the environment as it was.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setenv("WEB_CONCURRENCY", "3")
    monkeypatch.setenv("LOOM_WEB_WORKER_CLASS", "gthread")
    monkeypatch.setenv("LOOM_WEB_THREADS", "12")
    monkeypatch.setenv("LOOM_WEB_TIMEOUT_SECONDS", "45")
    config = runpy.run_path(str(ROOT / "gunicorn.conf.py"))
    assert (config["workers"], config["worker_class"], config["threads"], config["timeout"]) == (
        3, "gthread", 12, 45)
    monkeypatch.delenv("LOOM_WEB_WORKER_CLASS")
    assert runpy.run_path(str(ROOT / "gunicorn.conf.py"))["worker_class"] == "gevent"
