"""The error catalogue (``app.error_catalogue``) is the one place codes are declared.

Every code the server's code can answer is in it, every entry an op can answer is in the OpenAPI
document, real error answers carry the detail keys (and types) the catalogue declares, and the
SDK files generated from it are current.
"""

from __future__ import annotations

import ast
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app import error_catalogue as catalogue
from app import errors
from app.error_reference import main as reference_main
from app.error_reference import markdown_table
from app.ops import load_ops
from app.sdk_manifest import main as manifest_main
from app.sdk_ts import main as ts_main
from tests.auth_support import ADMIN_TOKEN, auth_app, bearer, mint
from tests.conftest import make_app

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*ROOT.joinpath("app").rglob("*.py"), *ROOT.joinpath("jobs").rglob("*.py")])
WHO = {"namespace": "support", "agent": "triage-bot", "user_id": "u-1"}
JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "object": (dict,), "array": (list,),
}


# --- every code in the code is in the catalogue -------------------------------------------


def _trees(sources: list[Path] = SOURCES) -> Iterator[tuple[Path, ast.AST]]:
    for path in sources:
        yield path, ast.parse(path.read_text(), str(path))


def _error_classes() -> dict[str, str]:
    """Every class under app/ and jobs/ that extends LoomError (by name, through any depth),
    with the code it declares (inherited codes are their parent's)."""
    bases: dict[str, list[str]] = {}
    codes: dict[str, str] = {}
    for _path, tree in _trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases[node.name] = [base.id if isinstance(base, ast.Name) else
                                base.attr if isinstance(base, ast.Attribute) else ""
                                for base in node.bases]
            for statement in node.body:
                if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                        and isinstance(statement.targets[0], ast.Name)
                        and statement.targets[0].id == "code"
                        and isinstance(statement.value, ast.Constant)):
                    codes[node.name] = statement.value.value

    def is_error(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name == "LoomError":
            return True
        return name not in seen and any(is_error(base, seen | {name})
                                        for base in bases.get(name, []))

    found = {name: codes.get(name, "") for name in bases if name != "LoomError" and
             is_error(name)}
    return found


def _code_literals(sources: list[Path] = SOURCES) -> list[tuple[str, int, str | None]]:
    """Codes written as strings: ``{"code": "X"}``, ``something.code = "X"``, ``code="X"``;
    a code set from a value that is not a literal is ``None``."""
    found: list[tuple[str, int, str | None]] = []
    for path, tree in _trees(sources):
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if (isinstance(key, ast.Constant) and key.value == "code"
                            and isinstance(value, ast.Constant) and isinstance(value.value, str)):
                        found.append((str(path), node.lineno, value.value))
            elif isinstance(node, ast.Assign):
                target = node.targets[0]
                if isinstance(target, ast.Attribute) and target.attr == "code":
                    value = node.value
                    found.append((str(path), node.lineno,
                                  value.value if isinstance(value, ast.Constant) else None))
            elif isinstance(node, ast.Call):
                for keyword in node.keywords:
                    if (keyword.arg == "code" and isinstance(keyword.value, ast.Constant)
                            and isinstance(keyword.value.value, str)
                            and keyword.value.value.isupper()):
                        found.append((str(path), node.lineno, keyword.value.value))
    return found


def test_every_error_class_in_app_and_jobs_declares_a_code_of_the_catalogue() -> None:
    classes = _error_classes()
    assert len(classes) > 40, classes  # the scan found the classes (app.errors and beyond)
    assert "AnswerContractViolation" in classes  # declared outside app/errors.py
    for name, code in classes.items():
        # A subclass without its own code answers its parent's, checked as the parent.
        if code:
            assert code in catalogue.BY_CODE, f"{name} answers {code}, not in the catalogue"


# Codes not known until the answer: werkzeug's own HTTP errors that Loom has no code for (their
# name, upper-cased), and an Idempotency-Key's replay of the first answer's code.
DYNAMIC_CODES = {"app/api.py", "app/idempotency.py"}


def test_every_code_written_as_a_string_is_in_the_catalogue(tmp_path: Path) -> None:
    for path, line, code in _code_literals():
        if code is None:
            assert str(Path(path).relative_to(ROOT)) in DYNAMIC_CODES, f"{path}:{line}"
            continue
        assert code in catalogue.BY_CODE, f"{path}:{line} answers {code!r}, not in the catalogue"
    # The scan sees each way of writing one.
    planted = tmp_path / "planted.py"
    planted.write_text('body = {"error": {"code": "PLANTED_A", "message": "m"}}\n'
                       'error.code = "PLANTED_B"\nrefuse(code="PLANTED_C")\n'
                       'error.code = computed()\n')
    assert sorted((line, code or "") for _, line, code in _code_literals([planted])) == [
        (1, "PLANTED_A"), (2, "PLANTED_B"), (3, "PLANTED_C"), (4, "")]


def test_the_loaded_error_classes_take_their_status_from_the_catalogue() -> None:
    load_ops()
    stack = list(errors.LoomError.__subclasses__())
    seen = 0
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        assert cls.status == catalogue.status_of(cls.code), cls
        seen += 1
    assert seen > 40
    with pytest.raises(KeyError, match="NOT_A_CODE"):
        type("Planted", (errors.LoomError,), {"code": "NOT_A_CODE"})


def test_every_detail_an_error_is_built_with_is_declared_for_its_code() -> None:
    """Statically, every keyword a LoomError subclass is built with anywhere in app/ and jobs/
    is a detail its catalogue entry declares (``field=`` is sent as ``fields``)."""
    classes = {name: code for name, code in _error_classes().items() if code}
    built = 0
    for path, tree in _trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = (node.func.id if isinstance(node.func, ast.Name) else
                    node.func.attr if isinstance(node.func, ast.Attribute) else "")
            if name not in classes:
                continue
            declared = catalogue.spec(classes[name]).detail_names
            for keyword in node.keywords:
                if keyword.arg is None:
                    continue  # a replayed answer's details, as stored
                sent = "fields" if keyword.arg == "field" else keyword.arg
                assert sent in declared, (
                    f"{path}:{node.lineno}: {name} sends {sent!r}, which the catalogue does "
                    f"not declare for {classes[name]}")
                built += 1
    assert built > 50


def test_one_name_for_the_fields_at_fault() -> None:
    """``fields`` (a path with its messages) is the one key naming input at fault."""
    for entry in catalogue.CATALOGUE:
        assert "field" not in entry.detail_names, entry.code
        for detail in entry.details:
            if detail.name == "fields":
                assert detail is catalogue.FIELDS, entry.code
    # The constructor's one-field form is the same shape VALIDATION_ERROR gives every field.
    single = errors.AuthInsufficient("org 'x' is beyond reach", field="org")
    assert single.to_dict() == {"code": "AUTH_INSUFFICIENT", "message": "org 'x' is beyond reach",
                                "fields": {"org": ["org 'x' is beyond reach"]}}


def test_an_op_that_raises_a_code_outside_the_catalogue_is_refused_at_declaration() -> None:
    from app.registry import Op, OpRegistry

    memory_get = next(declared for declared in load_ops() if declared.name == "memory.history")
    registry = OpRegistry()
    registry.add(memory_get)
    planted = Op(**{**memory_get.__dict__, "name": "memory.planted", "tool": "loom_planted",
                    "raises": ("MEMORY_NOT_FOUND", "MEMORY_GONE")})
    with pytest.raises(ValueError, match=r"memory.planted raises codes not in the catalogue: "
                                         r"\['MEMORY_GONE'\]"):
        registry.add(planted)


# --- the OpenAPI document ------------------------------------------------------------------


@pytest.fixture
def document(client) -> dict[str, Any]:
    return client.get("/openapi.json").get_json()


def test_every_entry_an_op_can_answer_is_in_the_document_for_at_least_one_op(document) -> None:
    listed: dict[str, set[str]] = {}
    for methods in document["paths"].values():
        for operation in methods.values():
            if "operationId" not in operation:
                continue
            for status, response in operation["responses"].items():
                for code in response.get("x-error-codes", []):
                    assert catalogue.status_of(code) == int(status), (code, status)
                    listed.setdefault(code, set()).add(operation["operationId"])
    for entry in catalogue.CATALOGUE:
        if entry.reach in ("outside_ops", "worker"):
            assert entry.code not in listed, entry.code
        else:
            assert listed.get(entry.code), f"{entry.code} is in no op's responses"
    # Every op meets the request's codes; writes the Idempotency-Key's; an op its own.
    ops = {declared.name: declared for declared in load_ops()}
    assert listed["STORE_UNAVAILABLE"] == set(ops)
    assert listed["IDEMPOTENCY_IN_PROGRESS"] == {name for name, declared in ops.items()
                                                 if declared.kind != "read"}
    assert listed["agent_state_conflict"] == {"agent_state.put"}
    assert listed["MODEL_BUDGET_EXCEEDED"] == {"memory.ask"}
    # The whole catalogue is the document's x-error-catalogue, outside-op codes included.
    whole = {entry["code"]: entry for entry in document["x-error-catalogue"]}
    assert set(whole) == set(catalogue.BY_CODE)
    assert whole["WORKING_MEMORY_LIMIT_EXCEEDED"]["details"] == {
        "value_length": {"type": "integer", "description": "the length of what was sent"},
        "char_limit": {"type": "integer", "description": "the cap it is over"}}
    assert whole["STORE_UNAVAILABLE"]["remedy"] == "retry_after"


def test_an_ops_examples_show_each_code_with_its_declared_details(document) -> None:
    replace = document["paths"]["/v1/working_memory.replace"]["post"]["responses"]
    assert set(replace["404"]["x-error-codes"]) == {"WORKING_MEMORY_BLOCK_NOT_FOUND"}
    examples = replace["422"]["content"]["application/json"]["examples"]
    assert {"VALIDATION_ERROR", "SUBSTRING_NOT_FOUND", "WORKING_MEMORY_LIMIT_EXCEEDED",
            "IDEMPOTENCY_KEY_REUSED", "IDENTITY_INCOMPLETE"} <= set(examples)
    limit = examples["WORKING_MEMORY_LIMIT_EXCEEDED"]["value"]["error"]
    assert set(limit) == {"code", "message", "value_length", "char_limit"}
    # A read answers no 409 of its own; the working-memory read no 404 (found=false).
    get = document["paths"]["/v1/working_memory.get"]["post"]["responses"]
    assert "409" not in get and "404" not in get


def test_an_error_code_its_op_does_not_list_is_a_contract_violation(app) -> None:
    contract = app.extensions["loom_contract"]
    with app.app_context():
        assert contract.mismatch("memory.history", 404, {"error": {
            "code": "MEMORY_NOT_FOUND", "message": "no row", "key": "k"}}) is None
        found = contract.mismatch("memory.history", 404, {"error": {
            "code": "TOKEN_NOT_FOUND", "message": "no token"}})
        assert found is not None and "'TOKEN_NOT_FOUND' is not one the document lists" in found
        # Outside the ops, any code of the catalogue; none other.
        assert contract.mismatch(None, 404, {"error": {"code": "NOT_FOUND", "message": "m"}}) \
            is None
        assert contract.mismatch(None, 404, {"error": {"code": "GONE", "message": "m"}})


# --- real answers carry the declared details -------------------------------------------------


def _assert_declared(response: Any, code: str, always: set[str] | None = None) -> dict:
    entry = catalogue.spec(code)
    body = response.get_json()
    assert response.status_code == entry.status, body
    error = body["error"]
    assert error["code"] == code, body
    details = set(error) - {"code", "message"}
    assert details <= entry.detail_names, (code, details - entry.detail_names)
    if always is not None:
        assert details == always, (code, details)
    for detail in entry.details:
        if detail.name in error:
            assert isinstance(error[detail.name], JSON_TYPES[detail.type]), (code, detail)
    if "retry_after" in error:
        assert response.headers["Retry-After"] == str(error["retry_after"])
    return error


def test_real_error_answers_carry_the_catalogues_details(client) -> None:
    def post(op: str, **body: Any) -> Any:
        return client.post(f"/v1/{op}", json={**WHO, **body})

    _assert_declared(post("working_memory.set", block_key="b", content=5), "VALIDATION_ERROR",
                     {"fields"})
    error = _assert_declared(client.post("/v1/working_memory.set", json={"agent": "a"}),
                             "IDENTITY_INCOMPLETE", {"fields"})
    assert error["fields"] == {"namespace": ["namespace is required"]}
    _assert_declared(client.post("/v1/working_memory.set", data="x=1",
                                 content_type="text/plain"),
                     "UNSUPPORTED_CONTENT_TYPE", {"content_type"})
    _assert_declared(client.post("/v1/working_memory.set", data="{",
                                 content_type="application/json"), "MALFORMED_JSON", set())
    _assert_declared(client.post("/v1/no.such_op", json={}), "UNKNOWN_OP", {"op"})
    _assert_declared(client.get("/v1/working_memory.set"), "METHOD_NOT_ALLOWED")

    assert post("working_memory.set", block_key="b", content="abc", char_limit=10).status_code \
        == 200
    _assert_declared(post("working_memory.set", block_key="b", content="x" * 11, char_limit=10),
                     "WORKING_MEMORY_LIMIT_EXCEEDED", {"value_length", "char_limit"})
    _assert_declared(post("working_memory.replace", block_key="b", old="zzz", new="y"),
                     "SUBSTRING_NOT_FOUND", {"block_key"})
    _assert_declared(post("working_memory.replace", block_key="none", old="a", new="b"),
                     "WORKING_MEMORY_BLOCK_NOT_FOUND", {"block_key"})

    written = post("profile.set", label="tone", value="brief")
    assert written.status_code == 200, written.get_json()
    _assert_declared(post("profile.set", label="tone", value="long", if_match_sha256="0" * 64),
                     "HASH_MISMATCH", {"key", "content_sha256"})
    _assert_declared(post("profile.replace", label="absent", old="a", new="b"),
                     "PROFILE_SECTION_NOT_FOUND", {"label"})
    _assert_declared(post("memory.history", key="never-written"), "MEMORY_NOT_FOUND", {"key"})
    error = _assert_declared(
        post("profile_schema.set", json_schema={"type": "object", "properties": 5}),
        "SCHEMA_INVALID")
    assert "rule" in error

    headers = {"Idempotency-Key": "catalogue-1"}
    first = client.post("/v1/working_memory.set", json={**WHO, "block_key": "k", "content": "a"},
                        headers=headers)
    assert first.status_code == 200
    _assert_declared(client.post("/v1/working_memory.set",
                                 json={**WHO, "block_key": "k", "content": "b"}, headers=headers),
                     "IDEMPOTENCY_KEY_REUSED", {"idempotency_key"})


def test_auth_errors_carry_the_catalogues_details(app_factory) -> None:
    client = auth_app(app_factory).test_client()
    _assert_declared(client.post("/v1/working_memory.get", json=WHO), "AUTH_REQUIRED", set())
    _assert_declared(client.post("/v1/working_memory.get", json=WHO,
                                 headers=bearer("lm_not-a-token")), "AUTH_INVALID", set())
    viewer = mint(client, ADMIN_TOKEN, role="viewer", namespace="support")
    _assert_declared(client.post("/v1/working_memory.set", json={**WHO, "block_key": "b",
                                                                  "content": "c"},
                                 headers=bearer(viewer)),
                     "AUTH_INSUFFICIENT", {"required_role"})
    error = _assert_declared(client.post("/v1/working_memory.get",
                                         json={**WHO, "namespace": "elsewhere"},
                                         headers=bearer(viewer)), "AUTH_INSUFFICIENT")
    assert list(error["fields"]) == ["namespace"]


def test_a_store_that_is_down_answers_the_catalogues_503(tmp_path: Path) -> None:
    with socket.socket() as closed:  # a port nothing listens on: every connect is refused
        closed.bind(("127.0.0.1", 0))
        url = f"redis://127.0.0.1:{closed.getsockname()[1]}/0"
        app = make_app(url, tmp_path, redis_socket_timeout_seconds=0.5,
                       redis_connect_timeout_seconds=0.5)
        response = app.test_client().post("/v1/working_memory.get",
                                          json={**WHO, "block_key": "b"})
    _assert_declared(response, "STORE_UNAVAILABLE", {"retry_after"})


# --- generated files and the reference ------------------------------------------------------


def test_the_sdk_files_generated_from_the_catalogue_are_current() -> None:
    assert manifest_main(["--check"]) == 0
    assert ts_main(["--check"]) == 0


def test_the_markdown_reference_has_a_row_per_code(capsys: pytest.CaptureFixture[str]) -> None:
    table = markdown_table()
    rows = table.splitlines()[2:]
    assert len(rows) == len(catalogue.CATALOGUE)
    limit = next(row for row in rows if row.startswith("| `WORKING_MEMORY_LIMIT_EXCEEDED` |"))
    assert "| 422 |" in limit and "`value_length` (integer)" in limit and "`char_limit`" in limit
    assert "`fix_input`" in limit
    assert reference_main(["--markdown"]) == 0
    assert capsys.readouterr().out.strip() == table
    assert reference_main([]) == 2
