"""Loopback unless protected: with auth off and no HOST, the web and MCP processes stay local."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.local import free_port
from app.settings import listen_host, load_settings
from loom import mcp_server
from tests.conftest import TEST_SECRET
from tests.support.listening import listening_addresses

ROOT = Path(__file__).resolve().parents[1]
PROCFILE = dict(
    line.split(": ", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line.strip()
)

CASES = [
    ({"LOOM_AUTH": "off"}, "127.0.0.1"),
    ({}, "127.0.0.1"),
    ({"LOOM_AUTH": "on"}, "0.0.0.0"),
    ({"LOOM_AUTH": "off", "HOST": "0.0.0.0"}, "0.0.0.0"),
    ({"LOOM_AUTH": "on", "HOST": "127.0.0.1"}, "127.0.0.1"),
]


@pytest.mark.parametrize("environ,host", CASES)
def test_the_web_and_the_mcp_server_choose_the_same_address(environ, host):
    assert listen_host(environ) == host
    assert mcp_server.listen_host(environ) == host


def test_host_is_a_documented_setting(tmp_path):
    settings = load_settings({"HOST": " 10.1.2.3 ", "LOOM_DATA_DIR": str(tmp_path)})
    assert settings.host == "10.1.2.3"


def _listens_on(process: subprocess.Popen[bytes], port: int, timeout: float = 30) -> set[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = listening_addresses(port)
        if found:
            return found
        assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")


@pytest.mark.slow
@pytest.mark.parametrize("line", ["web", "mcp"])
@pytest.mark.parametrize("environ,host", [CASES[0], CASES[2], CASES[3]],
                         ids=["auth-off", "auth-on", "host-set"])
def test_the_procfile_lines_listen_where_the_rule_says(line, environ, host, redis_url, tmp_path):
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key not in ("HOST", "LOOM_AUTH")}
    env.update(environ, PORT=str(port), MCP_PORT=str(port), REDIS_URL=redis_url,
               LOOM_SECRET_KEY=TEST_SECRET, LOOM_DATA_DIR=str(tmp_path),
               PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))
    # The Procfile's line as a platform runs it: through a shell, from the clone's root.
    process = subprocess.Popen(PROCFILE[line], shell=True, cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True)
    try:
        assert _listens_on(process, port) == {host}
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=15)
