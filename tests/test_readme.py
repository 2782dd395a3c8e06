"""The README tells the truth: it stays short, its calls answer, CI runs its commands."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from pathlib import Path

from app import docs_reference, settings

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _sh_block(heading: str) -> str:
    """The first ```sh block under the README's ``heading``."""
    section = README.read_text().split(heading, 1)[1]
    return re.search(r"```sh\n(.+?)\n```", section, flags=re.DOTALL).group(1).strip()


def test_the_readme_is_read_before_a_first_call_not_instead_of_the_site():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, "the README is at most 300 lines: move the rest to docs/"
    # Every generated table lives on the site now, none in the README.
    assert "<!--" not in README.read_text()


def test_the_typed_settings_fields_match_the_settings_table():
    source = docs_reference.SETTINGS_SOURCE.read_text()
    assert settings.with_generated_fields(source) == source, (
        "run `python -m app.docs_reference` to regenerate the Settings fields"
    )
    assert [field.name for field in dataclasses.fields(settings.Settings)] == [
        setting.attr for setting in settings.SETTINGS
    ]


def test_ci_runs_exactly_the_readme_test_command():
    command = _sh_block("## Test it")
    ci = (ROOT / ".ci" / "run").read_text()
    assert command in ci.splitlines()


def test_ci_builds_the_site_as_the_readme_says():
    """The README's two steps (install the docs extra, a strict build) are CI's."""
    install, build = (step.strip() for step in _sh_block("## Documentation").split("&&"))
    ci = (ROOT / ".ci" / "run").read_text()
    assert install in ci and build in ci
    assert install.endswith("-e '.[docs]'") and build.endswith("mkdocs build --strict")


def _curl_calls(text: str) -> list[tuple[str, dict]]:
    """Every ``curl`` call of the README's sh blocks: its op path and its JSON body."""
    calls = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL):
        for command in re.split(r"\n(?=curl )", block.replace("\\\n", " ")):
            if not command.startswith("curl "):
                continue
            words = shlex.split(command)
            url = next(word for word in words if word.startswith("localhost:8000/"))
            calls.append((url.removeprefix("localhost:8000"),
                          json.loads(words[words.index("-d") + 1])))
    return calls


def test_every_curl_call_of_the_readme_answers_as_the_readme_says(client):
    calls = _curl_calls(README.read_text())
    assert [path for path, _ in calls] == [
        "/v1/working_memory.set", "/v1/working_memory.render", "/v1/memory.set",
        "/v1/memory.search"]
    answers = {}
    for path, body in calls:
        answer = client.post(path, json=body)
        assert answer.status_code == 200, (path, answer.get_json())
        answers[path] = answer.get_json()
    assert "cursor: ticket 4812" in answers["/v1/working_memory.render"]["rendered"]
    assert [hit["key"] for hit in answers["/v1/memory.search"]["hits"]] == ["invoice_currency"]


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
