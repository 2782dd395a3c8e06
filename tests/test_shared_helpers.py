"""The suite's helpers live once: every module calls ops through ``tests/support/api.py``'s
``call`` and ``ok`` and takes the shared fixtures from ``tests/conftest.py``, so a change to how
a test reaches the API (a header, the identity, a live server) is made in one place."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.auth_support import ADMIN_TOKEN, auth_app, bearer
from tests.support.api import op_helpers

TESTS = Path(__file__).resolve().parent


def _modules() -> dict[str, ast.Module]:
    return {path.name: ast.parse(path.read_text(), str(path))
            for path in sorted(TESTS.glob("*.py"))}


def _body(node: ast.FunctionDef) -> str:
    """What a fixture does, its docstring aside."""
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return ast.dump(ast.Module(body, []))


def _fixtures(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(
                "fixture" in ast.unparse(decorator) for decorator in node.decorator_list):
            found[node.name] = node
    return found


def _posts_an_op_it_is_given(node: ast.FunctionDef) -> bool:
    """A helper under another name: it takes ``op`` and posts to ``f"/v1/{op}"``."""
    if node.name.startswith("test_") or "op" not in {argument.arg for argument in node.args.args}:
        return False
    return any(isinstance(part, ast.JoinedStr) and "/v1/{op}" in ast.unparse(part)
               for part in ast.walk(node))


def test_no_test_module_writes_its_own_call_or_ok():
    modules = _modules()
    assert len(modules) > 100
    own = sorted(f"{name}:{node.lineno} def {node.name}"
                 for name, tree in modules.items() for node in tree.body
                 if isinstance(node, ast.FunctionDef)
                 and (node.name in {"call", "ok"} or _posts_an_op_it_is_given(node)))
    assert own == [], "use call, ok = op_helpers(...) from tests/support/api.py"


def test_no_test_module_repeats_a_fixture_of_conftest():
    modules = _modules()
    shared = _fixtures(modules.pop("conftest.py"))
    assert {"client", "app_factory", "model", "live_server"} <= set(shared)
    repeated = sorted(
        f"{name}: {fixture}" for name, tree in modules.items()
        for fixture, node in _fixtures(tree).items()
        if fixture in shared and _body(node) == _body(shared[fixture]))
    assert repeated == [], "a module overrides a fixture only to change it"


def test_the_checks_see_a_planted_helper_and_a_planted_fixture_copy():
    tree = ast.parse("import pytest\n\n@pytest.fixture\ndef model():\n"
                     "    with ScriptedModelServer() as server:\n        yield server\n\n"
                     "def ok(client, op):\n    return op\n\n"
                     "def post(client, op, **body):\n"
                     "    return client.post(f'/v1/{op}', json=body)\n")
    shared = _fixtures(_modules()["conftest.py"])
    planted = _fixtures(tree)
    assert _body(planted["model"]) == _body(shared["model"])
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    assert [node.name for node in functions if node.name in {"call", "ok"}] == ["ok"]
    assert [node.name for node in functions if _posts_an_op_it_is_given(node)] == ["post"]


# --- the helpers themselves, on a real app ----------------------------------------------------


def test_call_sends_the_identity_under_the_body_and_the_prefix_before_the_op(client):
    call, ok = op_helpers({"namespace": "helpers", "agent": "bot"}, prefix="working_memory.")
    written = ok(client, "set", block_key="b1", content="one")
    assert written["block_key"] == "b1"
    # The identity went under the body: the block is in namespace "helpers", not elsewhere.
    status, out = call(client, "get", block_key="b1")
    assert (status, out["content"]) == (200, "one")
    # A field the body names wins over the identity's: namespace "elsewhere" has no block b1.
    status, out = call(client, "replace", block_key="b1", old="one", namespace="elsewhere")
    assert status == 404 and out["error"]["code"] == "WORKING_MEMORY_BLOCK_NOT_FOUND"
    with pytest.raises(AssertionError, match="WORKING_MEMORY_BLOCK_NOT_FOUND"):
        ok(client, "replace", block_key="b1", old="one", namespace="elsewhere")
    ok(client, "replace", block_key="b1", old="one", new="two")
    assert ok(client, "get", block_key="b1")["content"] == "two"


def test_headers_for_turns_the_third_argument_into_the_request_headers(app_factory):
    client = auth_app(app_factory).test_client()
    call, ok = op_helpers({"namespace": "helpers"}, headers_for=bearer)
    assert ok(client, "token.create", ADMIN_TOKEN, role="viewer")["token"]
    status, out = call(client, "token.create", "not-a-token", role="viewer")
    assert status == 401 and out["error"]["code"] == "AUTH_INVALID"
    # Without headers_for, the third argument is the headers themselves.
    plain_call, _ = op_helpers({"namespace": "helpers"})
    status, _ = plain_call(client, "token.create", bearer(ADMIN_TOKEN), role="viewer")
    assert status == 200
