"""Loopback unless protected: with auth off and no HOST, the web and MCP processes stay local;
on a platform (``DYNO`` set) the web with auth off and no HOST says what to set and exits, and
its log names the address it listens on."""

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
# The web as the Procfile runs it; the separate MCP server as its command line runs it (it has
# no Procfile line: the web serves /mcp).
COMMANDS = {"web": PROCFILE["web"], "mcp": "python -m loom.mcp_server http --port $PORT"}

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
@pytest.mark.parametrize("line", sorted(COMMANDS))
@pytest.mark.parametrize("environ,host", [CASES[0], CASES[2], CASES[3]],
                         ids=["auth-off", "auth-on", "host-set"])
def test_the_procfile_lines_listen_where_the_rule_says(line, environ, host, redis_url, tmp_path):
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key not in ("HOST", "LOOM_AUTH")}
    env.update(environ, PORT=str(port), REDIS_URL=redis_url,
               LOOM_SECRET_KEY=TEST_SECRET, LOOM_DATA_DIR=str(tmp_path),
               PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))
    # The Procfile's line as a platform runs it: through a shell, from the clone's root.
    process = subprocess.Popen(COMMANDS[line], shell=True, cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True)
    try:
        assert _listens_on(process, port) == {host}
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=15)


def _platform_web(redis_url: str, tmp_path: Path, port: int, **environ: str
                  ) -> tuple[subprocess.Popen[bytes], Path]:
    """The Procfile's web line as a dyno runs it: ``DYNO`` and ``PORT`` set, nothing of
    app.json's settings unless given, its output to a file."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("LOOM_", "HOST", "DYNO"))}
    env.update(DYNO="web.1", PORT=str(port), REDIS_URL=redis_url, LOOM_DATA_DIR=str(tmp_path),
               LOOM_LOG_FORMAT="text",
               PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
               **environ)
    output = tmp_path / "web.log"
    process = subprocess.Popen(PROCFILE["web"], shell=True, cwd=ROOT, env=env,
                               stdout=output.open("wb"), stderr=subprocess.STDOUT,
                               start_new_session=True)
    return process, output


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize("auth", [{}, {"LOOM_AUTH": "off"}], ids=["auth-unset", "auth-off"])
def test_on_a_platform_the_web_with_auth_off_says_what_to_set_and_exits(auth, redis_url,
                                                                          tmp_path):
    port = free_port()
    process, output = _platform_web(redis_url, tmp_path, port, LOOM_SECRET_KEY=TEST_SECRET,
                                    **auth)
    try:
        assert process.wait(timeout=60) != 0
    finally:
        _stop(process)
    lines = output.read_text().splitlines()
    assert len(lines) == 1, lines
    for needed in ("DYNO", "LOOM_AUTH=on", "LOOM_SECRET_KEY", "LOOM_ADMIN_TOKEN", "HOST"):
        assert needed in lines[0]
    assert listening_addresses(port) == set()


@pytest.mark.slow
@pytest.mark.parametrize("environ,host", [
    ({"LOOM_AUTH": "on", "LOOM_ADMIN_TOKEN": "platform-admin-token-0123456789"}, "0.0.0.0"),
    ({"HOST": "0.0.0.0"}, "0.0.0.0"),
], ids=["auth-on", "host-set"])
def test_on_a_platform_the_web_binds_where_it_is_told_and_its_log_names_it(
        environ, host, redis_url, tmp_path):
    port = free_port()
    process, output = _platform_web(redis_url, tmp_path, port, LOOM_SECRET_KEY=TEST_SECRET,
                                    **environ)
    try:
        assert _listens_on(process, port) == {host}
    finally:
        _stop(process)
    assert f"Listening at: http://{host}:{port} (" in output.read_text()
