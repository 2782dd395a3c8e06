"""The README's run command on a fresh machine: only Python, no redis-server on PATH.

The command runs from an empty working directory with the default (relative) data folder,
the way a newcomer's first run resolves it; the README's own ``curl`` example must answer,
the block must survive a restart, and every file written must be under the data folder.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from app.local import free_port
from tests.support.listening import listening_addresses

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def readme_curl_example() -> tuple[str, dict[str, str], str]:
    """The path, headers and body of the README's first ``curl`` example, as written."""
    block = re.search(r"```sh\n(curl .*?)```", README, re.S)
    assert block, "the README has no curl example"
    words = shlex.split(block.group(1).replace("\\\n", " "))
    url = next(word for word in words[1:] if word.startswith("localhost:8000/"))
    headers = dict(
        tuple(part.strip() for part in words[i + 1].split(":", 1))
        for i, word in enumerate(words) if word == "-H"
    )
    return url.removeprefix("localhost:8000"), headers, words[words.index("-d") + 1]


def _start(workdir: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "app.local"], cwd=workdir, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _wait(url: str, process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            requests.get(url + "/openapi.json", timeout=2)
            return
        except requests.RequestException:
            time.sleep(0.3)
    raise AssertionError("the local run did not start")


def _stop(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _files_under(folder: Path) -> set[Path]:
    return {
        path.relative_to(folder) for path in folder.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and ".venv" not in path.parts
        and ".git" not in path.parts and ".hypothesis" not in path.parts
    }


def test_the_readme_names_the_command_this_test_runs():
    assert ".venv/bin/python -m app.local" in README
    path, headers, body = readme_curl_example()
    assert path == "/v1/working_memory.set" and headers == {"content-type": "application/json"}


@pytest.mark.slow
def test_a_fresh_machine_runs_the_readme_command_and_keeps_its_data(tmp_path):
    # PATH has this environment's programs and nothing else: no redis-server anywhere.
    bin_dir = os.path.dirname(sys.executable)
    assert shutil.which("redis-server", path=bin_dir) is None
    workdir, tmpdir = tmp_path / "work", tmp_path / "tmp"
    workdir.mkdir()
    tmpdir.mkdir()
    port = free_port()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("LOOM_", "REDIS_", "HOST"))}
    env.update(PATH=bin_dir, TMPDIR=str(tmpdir), PORT=str(port), MCP_PORT=str(free_port()),
               LOOM_LOCAL_REDIS_PORT=str(free_port()))
    url = f"http://127.0.0.1:{port}"
    path, headers, body = readme_curl_example()
    clone_before = _files_under(ROOT)

    process = _start(workdir, env)
    try:
        _wait(url, process)
        answer = requests.post(url + path, data=body, headers=headers, timeout=5)
        assert answer.status_code == 200, answer.text
        assert answer.json()["block_key"] == "state"
        # Auth is off and HOST unset: the API answers on loopback only.
        assert listening_addresses(port) == {"127.0.0.1"}
    finally:
        _stop(process)
    data_dir = workdir / "var"
    assert (data_dir / "secret_key").read_text().strip()
    assert (data_dir / "redis" / "appendonlydir").is_dir()

    process = _start(workdir, env)
    try:
        _wait(url, process)
        block = {key: value for key, value in json.loads(body).items() if key != "content"}
        out = requests.post(url + "/v1/working_memory.get", json=block, timeout=5).json()
        assert out["found"] is True and out["content"] == "cursor: ticket 4812"
    finally:
        _stop(process)

    assert {path.parts[0] for path in _files_under(workdir)} == {"var"}
    assert _files_under(tmpdir) == set()
    assert _files_under(ROOT) - clone_before == set()
