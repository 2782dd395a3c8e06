"""The layers import downwards only, on the whole import graph of app/, jobs/, bench/ and
sdk/loom: no module imports itself round a circle, a store reaches nothing above it, the server
(app/, the model client included) reaches no job and no bench, the SDK nothing of the server,
and only the stores and the jobs speak Redis. Every import
counts, inside functions and under ``TYPE_CHECKING`` too (tests/support/import_graph.py).
"""

from __future__ import annotations

import textwrap
import tomllib
from pathlib import Path

import pytest
from mypy.main import process_options
from mypy.options import PER_MODULE_OPTIONS

from tests.support import import_graph

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"app": ROOT / "app", "jobs": ROOT / "jobs", "bench": ROOT / "bench",
            "loom": ROOT / "sdk" / "loom"}

# What a store may import outside app/store: modules below every layer, which import none of
# the layers above (the check is transitive, so they are held to it too).
BELOW_THE_STORES = {
    "app.clock", "app.error_catalogue", "app.errors", "app.json_patterns", "app.keyed",
    "app.object_types", "app.pii", "app.principal", "app.profile_schema", "app.queue_names",
    "app.scope_ids", "app.settings",
}
# The clients of Redis and of RQ's keys. The stores and the jobs (RQ's workers and scheduler)
# use them; outside those, only these, each for the reason given.
REDIS_CLIENTS = {"redis", "rq", "rq_scheduler", "rq_dashboard"}
SPEAKS_REDIS_OUTSIDE_THE_STORES = {
    # Builds each process's clients (through app.store.connection) and hands them to the stores.
    "app.services",
    # The run command waits for the embedded server it started to answer.
    "app.local",
    # Mounts rq-dashboard at /rq, which reads RQ's keys itself.
    "app.operate",
    # The one dispatcher of the stores' intents (app.store.intents): enqueues them, and finds
    # and deletes the queued jobs naming a user for the erasure.
    "app.job_dispatch",
    # Reads RQ's queues, registries and workers for GET /metrics.
    "app.job_queues",
}


@pytest.fixture(scope="module")
def graph() -> import_graph.ImportGraph:
    return import_graph.build(PACKAGES)


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_graph_holds_every_module(graph):
    assert {"app.registry", "app.ops.memory", "app.store.erasure.saga", "jobs.worker",
            "loom.client", "loom.answers"} <= set(graph.modules)
    # A function-level import is an edge (the manifest imports the ops only when it builds),
    # and so is a type-only one (the registry names Services in its Call's fields).
    assert "app.ops" in graph.edges["app.sdk_manifest"]
    assert "app.services" in graph.edges["app.registry"]


def test_no_module_imports_itself_round_a_circle(graph):
    # The server, the jobs, the benches and the SDK alike, and the tests with them.
    assert {package for package in PACKAGES
            if not any(_in(module, package) for module in graph.modules)} == set()
    assert graph.cycles() == []
    with_tests = import_graph.build({**PACKAGES, "tests": ROOT / "tests"})
    assert "tests.support.import_graph" in with_tests.modules
    assert with_tests.cycles() == []
    # Nothing of the product imports the tests (the benches may use their scripted servers).
    assert {module for module in with_tests.modules
            if not _in(module, "tests") and not _in(module, "bench")
            and any(_in(name, "tests") for name in with_tests.reach(module))} == set()


def test_a_store_reaches_nothing_above_it(graph):
    above = {}
    for module in graph.modules:
        if _in(module, "app.store"):
            outside = {reached for reached in graph.reach(module)
                       if not _in(reached, "app.store") and reached not in BELOW_THE_STORES}
            if outside:
                above[module] = [graph.path(module, reached) for reached in sorted(outside)]
    assert above == {}


def test_the_server_imports_no_job_and_no_bench(graph):
    # app/ is below jobs/ and bench/: the model client, the stores and the ops are theirs to
    # call, never the other way (memory.ask's model call goes through app/model like a worker's).
    reached = {module: sorted(name for name in graph.reach(module)
                              if _in(name, "jobs") or _in(name, "bench"))
               for module in graph.modules if _in(module, "app")}
    assert {module: above for module, above in reached.items() if above} == {}


def test_the_sdk_reaches_nothing_of_the_server_and_no_redis(graph):
    for module in graph.modules:
        if _in(module, "loom"):
            assert {name for name in graph.reach(module)
                    if not _in(name, "loom")} == set(), module
            assert graph.external[module] & (REDIS_CLIENTS | {"flask", "marshmallow"}) == set()


def test_only_the_stores_and_the_jobs_speak_redis(graph):
    # The benches set up and read Redis beside the apps they measure; they are not the server.
    speaking = {module for module in graph.modules
                if graph.external[module] & REDIS_CLIENTS and not _in(module, "bench")}
    others = {module for module in speaking
              if not _in(module, "app.store") and not _in(module, "jobs")}
    assert others == SPEAKS_REDIS_OUTSIDE_THE_STORES


# --- the checker itself, on a package planted in tmp_path ------------------------------------


def _plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "pkg"


def test_the_checker_finds_a_circle_hidden_in_a_function_or_a_type_only_import(tmp_path):
    folder = _plant(tmp_path, {
        "__init__.py": "",
        "low.py": "import json\n",
        "a.py": "from pkg import b\n",
        "b.py": "def later():\n    from pkg.c import thing\n",
        "c.py": """\
            from typing import TYPE_CHECKING
            from . import low
            if TYPE_CHECKING:
                from pkg.a import Something
            thing = 1
            """,
        "sub/__init__.py": "",
        "sub/d.py": "from ..low import json\nimport redis\n",
    })
    graph = import_graph.build({"pkg": folder})
    assert graph.cycles() == [["pkg.a", "pkg.b", "pkg.c"]]
    assert graph.edges["pkg.sub.d"] == {"pkg.low"}
    assert graph.external["pkg.sub.d"] == {"redis"}
    assert graph.reach("pkg.a") == {"pkg.b", "pkg.c", "pkg.low"}
    assert graph.path("pkg.a", "pkg.low") == ["pkg.a", "pkg.b", "pkg.c", "pkg.low"]


def test_the_checker_finds_no_circle_in_a_downward_package(tmp_path):
    folder = _plant(tmp_path, {
        "__init__.py": "from pkg import top\n",
        "top.py": "from pkg.middle import run\n",
        "middle.py": "from pkg import bottom\n\ndef run():\n    return bottom.VALUE\n",
        "bottom.py": "VALUE = 1\n",
    })
    graph = import_graph.build({"pkg": folder})
    assert graph.cycles() == []
    # A submodule does not depend on its package's __init__ (which imports it).
    assert graph.reach("pkg.bottom") == set()
    assert graph.reach("pkg") == {"pkg.top", "pkg.middle", "pkg.bottom"}


# --- mypy --------------------------------------------------------------------------------------


def test_the_stores_are_checked_with_every_per_module_flag_of_mypy_strict():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    override = next(block for block in config["overrides"] if "app.store.*" in block["module"])
    _, strict = process_options(["--strict", "--config-file", "", "x.py"])
    _, plain = process_options(["--config-file", "", "x.py"])
    wanted = {name: getattr(strict, name) for name in PER_MODULE_OPTIONS
              if getattr(strict, name) != getattr(plain, name)}
    assert len(wanted) > 10
    assert {name: override.get(name) for name in wanted} == wanted
    # mypy's `strict` key in an override turns strict on for every module, not the stores'.
    assert "strict" not in override
