"""Blocks survive a restart of every process: Redis (append-only file) and the app."""

from __future__ import annotations

from tests.conftest import make_app
from tests.support.persistence import append_only_files, own_server

BLOCK = {"namespace": "n", "agent": "a", "block_key": "resume", "run_id": "run-7"}


def test_blocks_survive_a_restart_of_redis_and_the_app(tmp_path):
    server = own_server(tmp_path / "redis", appendonly=True).start()
    try:
        client = make_app(server.url, tmp_path).test_client()
        written = client.post(
            "/v1/working_memory.set", json={**BLOCK, "content": "cursor: 4812", "char_limit": 99}
        ).get_json()
    finally:
        server.stop()

    assert append_only_files(tmp_path / "redis")
    restarted = own_server(tmp_path / "redis", port=server.port, appendonly=True).start()
    try:
        client = make_app(restarted.url, tmp_path).test_client()
        out = client.post("/v1/working_memory.get", json=BLOCK).get_json()
    finally:
        restarted.stop()
    assert out["found"] is True
    assert (out["content"], out["char_limit"], out["version"]) == (
        "cursor: 4812", 99, written["version"]
    )
