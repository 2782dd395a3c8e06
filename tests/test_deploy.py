"""A Heroku-style deploy: what the Python buildpack reads, and every Procfile line started
from a fresh environment installed from ``requirements.txt``, as the platform would."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx2
import pytest
import redis
import requests
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from rq import Worker
from rq_scheduler import Scheduler

from app.local import free_port
from jobs.scheduler import JOB_ID_PREFIX

ROOT = Path(__file__).resolve().parents[1]
PROCFILE = dict(
    line.split(": ", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line.strip()
)
ADMIN_TOKEN = "deploy-admin-token-0123456789abcdef"
SECRET_KEY = "deploy-secret-key-0123456789abcdef"


# The one-off step a platform runs before each release serves; every other line is a process.
RELEASE = "release"
PROCESSES = {name: line for name, line in PROCFILE.items() if name != RELEASE}


def test_app_json_declares_every_process_the_redis_add_on_and_the_protected_settings():
    manifest = json.loads((ROOT / "app.json").read_text())
    # Only processes a platform can reach or that reach the store: MCP is the web's /mcp.
    assert set(manifest["formation"]) == set(PROCESSES) == {"web", "worker", "scheduler"}
    assert PROCFILE[RELEASE] == "python -m app.release"
    # honcho gives the first line PORT itself: the web must be it.
    assert next(iter(PROCFILE)) == "web"
    assert all(entry["quantity"] >= 1 for entry in manifest["formation"].values())
    assert any(addon["plan"].startswith("heroku-redis") for addon in manifest["addons"])
    env = manifest["env"]
    assert env["LOOM_AUTH"]["value"] == "on"
    assert env["LOOM_SECRET_KEY"]["generator"] == "secret"
    assert env["LOOM_ADMIN_TOKEN"]["generator"] == "secret"
    assert (ROOT / ".python-version").read_text().strip() == "3.11"
    requirements = (ROOT / "requirements.txt").read_text().split()
    assert "." in requirements  # the project itself, with the bounds pyproject.toml declares


def _until(check, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            found = check()
        except Exception:  # not up yet: refused connections, in whatever wrapping
            found = None
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"{what} did not happen in {seconds} s")


async def _mcp_tool_names(url: str, token: str) -> set[str]:
    # With auth on, MCP on the web port acts only with the caller's own token.
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            return {tool.name for tool in (await client.list_tools()).tools}


@pytest.mark.slow
def test_a_fresh_install_from_requirements_runs_every_procfile_line(tmp_path, redis_url):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "-r", "requirements.txt"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert install.returncode == 0, install.stderr[-3000:]

    web_port = free_port()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("LOOM_", "REDIS_", "PYTHONPATH"))}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        # What app.json and the Redis add-on give the processes; HOST keeps the test on loopback.
        REDIS_URL=redis_url, PORT=str(web_port), HOST="127.0.0.1",
        LOOM_AUTH="on", LOOM_SECRET_KEY=SECRET_KEY, LOOM_ADMIN_TOKEN=ADMIN_TOKEN,
        LOOM_DATA_DIR=str(tmp_path / "data"),
    )
    # The release phase first, as the platform runs it: it must end, and well.
    released = subprocess.run(PROCFILE[RELEASE], shell=True, cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
    assert released.returncode == 0, released.stderr[-3000:]
    assert "release: recall:" in released.stdout
    processes = {
        name: subprocess.Popen(line, shell=True, cwd=ROOT, env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for name, line in PROCESSES.items()
    }
    connection = redis.Redis.from_url(redis_url)
    try:
        web = f"http://127.0.0.1:{web_port}"
        block = {"org": "acme", "namespace": "support", "agent": "triage-bot",
                 "run_id": "run-7", "block_key": "state"}
        written = _until(lambda: requests.post(
            web + "/v1/working_memory.set", json={**block, "content": "cursor: ticket 4812"},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=5,
        ), 60, "the web process answering")
        assert written.status_code == 200, written.text
        unauthenticated = requests.post(web + "/v1/working_memory.get", json=block, timeout=5)
        assert unauthenticated.status_code == 401

        workers = _until(lambda: Worker.all(connection=connection), 60, "a worker registering")
        assert workers
        periodic = _until(lambda: [job.id for job in Scheduler(connection=connection).get_jobs()
                                   if job.id.startswith(JOB_ID_PREFIX)],
                          60, "the scheduler registering its jobs")
        assert periodic

        names = _until(lambda: anyio.run(_mcp_tool_names, web + "/mcp", ADMIN_TOKEN),
                       60, "the web's /mcp listing its tools")
        assert "loom_working_memory_set" in names
        assert all(re.fullmatch(r"loom_[a-z_]+", name) for name in names)
        anonymous = requests.post(web + "/mcp", json={}, timeout=5)
        assert anonymous.status_code == 401
        for name, process in processes.items():
            assert process.poll() is None, f"{name} exited"
    finally:
        for process in processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        connection.close()


def test_the_env_example_is_settings_honcho_reads_and_they_load_once_the_secrets_are_filled(
        tmp_path):
    from honcho.environ import parse

    from app.settings import SETTINGS, load_settings

    text = (ROOT / ".env.example").read_text()
    # Filled in as its comments ask; honcho's own parser, as honcho and heroku local read it.
    filled = text.replace("LOOM_SECRET_KEY=\n", f"LOOM_SECRET_KEY={SECRET_KEY}\n").replace(
        "LOOM_ADMIN_TOKEN=\n", f"LOOM_ADMIN_TOKEN={ADMIN_TOKEN}\n")
    env = parse(filled)
    declared = {setting.name for setting in SETTINGS}
    assert set(env) <= declared, set(env) - declared
    commented = set(re.findall(r"^# ([A-Z_]+)=", text, flags=re.M))
    assert commented <= declared, commented - declared
    assert {"REDIS_URL", "LOOM_SECRET_KEY", "LOOM_ADMIN_TOKEN"} <= set(env)
    settings = load_settings({**env, "LOOM_DATA_DIR": str(tmp_path)})
    assert settings.auth == "on" and settings.admin_token == ADMIN_TOKEN
    assert settings.secret_key == SECRET_KEY
    # .env holds the secrets: git never takes it.
    assert ".env" in (ROOT / ".gitignore").read_text().split()
