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


def test_app_json_declares_every_process_the_redis_add_on_and_the_protected_settings():
    manifest = json.loads((ROOT / "app.json").read_text())
    assert set(manifest["formation"]) == set(PROCFILE) == {"web", "worker", "scheduler", "mcp"}
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
    # With auth on, the MCP server over HTTP acts only with the caller's own token.
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

    web_port, mcp_port = free_port(), free_port()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("LOOM_", "REDIS_", "PYTHONPATH"))}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        # What app.json and the Redis add-on give the processes; HOST keeps the test on loopback.
        REDIS_URL=redis_url, PORT=str(web_port), MCP_PORT=str(mcp_port), HOST="127.0.0.1",
        LOOM_AUTH="on", LOOM_SECRET_KEY=SECRET_KEY, LOOM_ADMIN_TOKEN=ADMIN_TOKEN,
        LOOM_DATA_DIR=str(tmp_path / "data"),
        LOOM_API_URL=f"http://127.0.0.1:{web_port}", LOOM_API_KEY=ADMIN_TOKEN,
    )
    processes = {
        name: subprocess.Popen(line, shell=True, cwd=ROOT, env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for name, line in PROCFILE.items()
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

        names = _until(lambda: anyio.run(_mcp_tool_names, f"http://127.0.0.1:{mcp_port}/mcp",
                                 ADMIN_TOKEN),
                       60, "the MCP server listing its tools")
        assert "loom_working_memory_set" in names
        assert all(re.fullmatch(r"loom_[a-z_]+", name) for name in names)
        anonymous = requests.post(f"http://127.0.0.1:{mcp_port}/mcp", json={}, timeout=5)
        assert anonymous.status_code == 401  # the server's own key is lent to no caller
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
