"""The layers import downwards only: a store never imports the auth, API or op layer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

STORES = sorted((Path(__file__).resolve().parents[1] / "app" / "store").rglob("*.py"))
# app.services is imported for its type only: it hands each store its clients.
ABOVE_THE_STORES = ("app.auth", "app.api", "app.ops", "jobs")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("path", STORES, ids=[path.name for path in STORES])
def test_a_store_imports_nothing_above_it(path):
    above = {name for name in _imports(path)
             if any(name == layer or name.startswith(layer + ".") for layer in ABOVE_THE_STORES)}
    assert above == set(), f"{path.name} imports {sorted(above)}"
