"""The MCP project's reference client, the MCP Inspector (``@modelcontextprotocol/inspector``,
``--cli`` mode), against ``loom-mcp`` over stdio and Streamable HTTP in front of a live API,
and against the web process's own ``/mcp``.

Its ``--strict`` portability check must report nothing for every listing (``all``, ``full``,
each plane), and a write, a read and a refused write (422) must come back through it, with
versions past 2^53 also as exact decimal strings. The Inspector is installed from the npm
registry once into a cache folder (``LOOM_INSPECTOR_DIR``, default under ``~/.cache``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loom.mcp_server import select_tools
from loom.ops_manifest import OPS
from tests.support.live_server import LiveServer
from tests.test_mcp import PYTHONPATH, HttpMCP

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"
CACHE = Path(os.environ.get("LOOM_INSPECTOR_DIR")
             or Path.home() / ".cache" / "loom" / "mcp-inspector-2.12.0")
IDENTITY = {"LOOM_MCP_NAMESPACE": "support", "LOOM_MCP_AGENT": "desktop"}


@pytest.fixture(scope="module")
def inspector() -> Path:
    binary = CACHE / "node_modules" / ".bin" / "mcp-inspector"
    if not binary.exists():
        if shutil.which("npm") is None:
            if os.environ.get("CI"):
                pytest.fail("npm is needed to install the MCP Inspector")
            pytest.skip("npm is not installed")
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--prefix", str(CACHE), "--no-fund", "--no-audit",
                        "--loglevel=error", INSPECTOR], check=True, timeout=600)
    return binary


def inspect_cli(inspector: Path, target: list[str], *args: str,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    options = [item for name, value in (env or {}).items() for item in ("-e", f"{name}={value}")]
    return subprocess.run(
        [str(inspector), "--cli", *options, *args, "--", *target],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )


def stdio_target() -> list[str]:
    return [sys.executable, "-m", "loom.mcp_server", "stdio"]


def stdio_env(api_url: str, **extra: str) -> dict[str, str]:
    return {"PYTHONPATH": PYTHONPATH, "LOOM_API_URL": api_url, **IDENTITY, **extra}


def listings() -> list[str]:
    planes = sorted({name.split(".", 1)[0] for name, entry in OPS.items() if entry["mcp"]})
    return ["all", "full", *planes]


@pytest.fixture(scope="module")
def api(redis_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    from tests.conftest import TEST_SECRET

    env = {"REDIS_URL": redis_server_url, "LOOM_SECRET_KEY": TEST_SECRET,
           "LOOM_DATA_DIR": str(tmp_path_factory.mktemp("api"))}
    with LiveServer(env) as server:
        yield server


@pytest.mark.parametrize("listing", listings())
def test_the_strict_portability_check_reports_nothing(inspector: Path, listing: str):
    done = inspect_cli(inspector, stdio_target(), "--method", "tools/list", "--strict",
                       env=stdio_env("http://127.0.0.1:9", LOOM_MCP_TOOLSETS=listing))
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr and "Error" not in done.stderr, done.stderr
    listed = sorted(tool["name"] for tool in json.loads(done.stdout)["tools"])
    assert listed == sorted(select_tools([listing]))


def calls(inspector: Path, target: list[str], env: dict[str, str] | None) -> list[Any]:
    """A write, a read and a refused write through the Inspector; their results."""
    results = []
    # The Inspector exits 5 on a result with isError: true (the refused write).
    for tool, arguments, exit_code in (
        ("loom_working_memory_set",
         ["block_key=state", "content=cursor: ticket 4812", "char_limit=40", "run_id=run-7"], 0),
        ("loom_working_memory_render", ["run_id=run-7"], 0),
        ("loom_working_memory_set",
         ["block_key=state", "content=" + "x" * 60, "char_limit=40", "run_id=run-7"], 5),
    ):
        done = inspect_cli(inspector, target, "--method", "tools/call", "--tool-name", tool,
                           "--tool-arg", *arguments, env=env)
        assert done.returncode == exit_code, done.stderr
        results.append(json.loads(done.stdout))
    return results


def check(results: list[Any]) -> None:
    written, read, refused = results
    assert written["isError"] is False
    exact = json.loads(written["content"][0]["text"])["version"]
    assert exact > 2**53
    assert written["structuredContent"]["version_text"] == str(exact)
    block = read["structuredContent"]["blocks"][0]
    assert read["isError"] is False and block["content"] == "cursor: ticket 4812"
    assert block["version_text"] == str(exact)
    assert refused["isError"] is True
    error = refused["structuredContent"]["error"]
    assert (error["status"], error["code"]) == (422, "WORKING_MEMORY_LIMIT_EXCEEDED")
    assert (error["value_length"], error["char_limit"]) == (60, 40)


def test_calls_over_stdio(inspector: Path, api: LiveServer, redis_url: str):
    check(calls(inspector, stdio_target(), stdio_env(api.url)))


def test_calls_and_strict_listing_over_streamable_http(inspector: Path, api: LiveServer,
                                                       redis_url: str):
    with HttpMCP(api.url, **IDENTITY) as server:
        listed = inspect_cli(inspector, [server.url], "--method", "tools/list", "--strict")
        assert listed.returncode == 0, listed.stderr
        assert "Warning" not in listed.stderr and "Error" not in listed.stderr, listed.stderr
        assert len(json.loads(listed.stdout)["tools"]) == len(select_tools(["all"]))
        check(calls(inspector, [server.url], None))


@pytest.fixture(scope="module")
def web(redis_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The web process alone, serving MCP at /mcp with the identity defaults set."""
    from tests.conftest import TEST_SECRET

    env = {"REDIS_URL": redis_server_url, "LOOM_SECRET_KEY": TEST_SECRET,
           "LOOM_DATA_DIR": str(tmp_path_factory.mktemp("web")), **IDENTITY}
    with LiveServer(env, workers=1) as server:
        yield server


def test_calls_and_strict_listing_on_the_web_port(inspector: Path, web: LiveServer,
                                                  redis_url: str):
    url = web.url + "/mcp"
    listed = inspect_cli(inspector, [url], "--method", "tools/list", "--strict")
    assert listed.returncode == 0, listed.stderr
    assert "Warning" not in listed.stderr and "Error" not in listed.stderr, listed.stderr
    assert sorted(tool["name"] for tool in json.loads(listed.stdout)["tools"]) == sorted(
        select_tools(["all"]))
    check(calls(inspector, [url], None))
