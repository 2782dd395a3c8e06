"""The deploy guide (docs/guides/deploy-heroku.md) says how the web process is configured,
and why."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _deploy_section() -> str:
    return (ROOT / "docs" / "guides" / "deploy-heroku.md").read_text()


def test_every_web_setting_gunicorn_reads_is_explained_under_deploy():
    conf = (ROOT / "gunicorn.conf.py").read_text()
    names = re.findall(r'_web_setting\("([A-Z_]+)"\)', conf)
    assert {"WEB_CONCURRENCY", "LOOM_WEB_WORKER_CLASS"} <= set(names)
    section = _deploy_section()
    missing = [name for name in names if f"`{name}`" not in section]
    assert missing == [], missing


def test_deploy_says_why_the_workers_are_gevent():
    section = _deploy_section()
    assert "gunicorn.conf.py" in section and "gevent" in section
    # the reason, and the measurement behind it
    assert "recv()" in section and "bench/slow_clients.py" in section
    assert "tests/test_slow_clients.py" in section
