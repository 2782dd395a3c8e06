"""The TypeScript SDK's generated files (``sdk-ts/src/generated``) follow the registry.

A fresh generation into a temporary folder must equal the committed files, so a changed op,
schema or error code fails here until ``python -m app.sdk_ts`` is run and its output committed.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from app import errors
from app.ops import load_ops
from app.sdk_ts import (
    CATALOGUE,
    ERROR_BASE,
    GENERATED,
    ROOT,
    CatalogueDrift,
    check_error_base,
    error_catalogue,
    generated_files,
    main,
    render_errors,
    sdk_error_classes,
)


def test_committed_generated_files_equal_a_fresh_generation(tmp_path: Path) -> None:
    fresh = generated_files(tmp_path)
    assert sorted(path.name for path in fresh) == ["errors.ts", "ops.ts"]
    for path, text in fresh.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        committed = ROOT / GENERATED / path.name
        assert committed.read_text() == path.read_text(), (
            f"{committed.name} is behind the registry: run python -m app.sdk_ts")
    assert main(["--check"]) == 0


def test_every_op_is_a_typed_method_and_every_error_code_a_class(tmp_path: Path) -> None:
    fresh = {path.name: text for path, text in generated_files(tmp_path).items()}
    ops = fresh["ops.ts"]
    for declared in load_ops():
        assert f'"{declared.name}": {{"kind": "{declared.kind}"' in ops
        method = re.escape(declared.name.split(".", 1)[1].split("_")[0])
        assert re.search(rf"\n    {method}\w*\(input\??: \w+Input, options\?: CallOptions\): "
                         rf"Promise<\w+Answer>;", ops), declared.name
    # Versions and nanosecond instants are bigint in answers, never a double.
    assert "  version?: bigint;" in ops
    assert "version?: number" not in ops
    codes = set()
    stack = list(errors.LoomError.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        codes.add(cls.code)
    for code in codes:
        assert f'  "{code}": ' in fresh["errors.ts"], code


def test_an_index_type_covers_every_named_key(tmp_path: Path) -> None:
    """Under ``strict`` an optional named key is ``T | undefined``: an interface with keys of
    the caller's choosing must hold undefined in its index type too, or tsc refuses the file
    (TS2411), as it did for a field's retention beside its optional ``state``."""
    ops = next(text for path, text in generated_files(tmp_path).items()
               if path.name == "ops.ts")
    checked = 0
    for body in re.findall(r"\nexport interface \w+ \{\n(.*?)\n\}", ops, re.S):
        index = re.search(r"^  \[field: string\]: (.+);$", body, re.M)
        if index is None:
            continue
        named = [line for line in body.splitlines() if re.match(r"^  [\w\"]+(\?)?: ", line)]
        for line in named:
            if "?: " in line:
                assert "undefined" in index.group(1).split(" | "), body
                checked += 1
    assert checked, "no interface with an index type and an optional key was generated"


def test_a_changed_registry_shows_as_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import app.sdk_ts as generator

    committed = {path.name: path.read_text() for path in generated_files(ROOT)}
    original = generator.render_ops
    monkeypatch.setattr(generator, "render_ops", lambda ops: original(
        {**ops, "extra.op": {**ops["memory.get"]}}))
    changed = {path.name: text for path, text in generator.generated_files(tmp_path).items()}
    assert changed["ops.ts"] != committed["ops.ts"]
    assert changed["errors.ts"] == committed["errors.ts"]
    assert generator.main(["--check"]) == 1  # CI's check fails, and writes nothing
    assert "ops.ts is behind the registry" in capsys.readouterr().out
    assert (ROOT / GENERATED / "ops.ts").read_text() == committed["ops.ts"]


# --- the error classes, from the Python SDK's catalogue ----------------------------------------


def _planted_catalogue(tmp_path: Path, extra: str) -> ModuleType:
    source = (ROOT / CATALOGUE).read_text()
    at = source.index("\nBY_CODE")
    path = tmp_path / "errors.py"
    path.write_text(source[:at] + textwrap.dedent(extra) + source[at:])
    return error_catalogue(path)


def test_every_class_of_the_python_catalogue_is_a_typescript_class_of_the_same_place(
    tmp_path: Path,
) -> None:
    from loom import errors as sdk_errors

    text = next(text for path, text in generated_files(tmp_path).items()
                if path.name == "errors.ts")
    base = (ROOT / ERROR_BASE).read_text()
    classes = sdk_error_classes(error_catalogue())
    assert len(classes) > 40
    for cls in classes:
        parent = "Error" if cls.__name__ == "LoomError" else cls.__bases__[0].__name__
        declared = (f"export class {cls.__name__} extends {parent} {{\n"
                    f"  static {'' if parent == 'Error' else 'override '}readonly code: string = "
                    f'"{cls.default_code}";')  # type: ignore[attr-defined]
        assert declared in (base if cls.__name__.startswith("Loom") else text), cls.__name__
    for code, cls in sdk_errors.BY_CODE.items():
        assert f'  "{code}": {cls.__name__},\n' in text
    for status, cls in sdk_errors.BY_STATUS.items():
        assert f"  {status}: {cls.__name__},\n" in text
    # Accessors follow the Python properties: .fields on ValidationError, the limits' lengths.
    validation = text.split("export class ValidationError")[1].split("\n}\n")[0]
    assert "get fields(): Record<string, unknown>" in validation
    limits = text.split("export class LimitExceeded")[1].split("\n}\n")[0]
    assert "get valueLength()" in limits and "get charLimit()" in limits


def test_a_class_added_to_the_python_catalogue_leaves_the_typescript_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import app.sdk_ts as generator

    committed = (ROOT / GENERATED / "errors.ts").read_text()
    planted = _planted_catalogue(tmp_path, '''

        class MemoryTooOld(NotFound):
            """A planted code."""

            default_code = "MEMORY_TOO_OLD"
        ''')
    monkeypatch.setattr(generator, "error_catalogue", lambda: planted)
    fresh = next(text for path, text in generator.generated_files(tmp_path).items()
                 if path.name == "errors.ts")
    assert "/** A planted code. */\nexport class MemoryTooOld extends NotFound {" in fresh
    assert generator.main(["--check"]) == 1
    assert "errors.ts is behind the registry" in capsys.readouterr().out
    assert (ROOT / GENERATED / "errors.ts").read_text() == committed


def test_a_property_without_a_typescript_accessor_stops_the_generation(tmp_path: Path) -> None:
    planted = _planted_catalogue(tmp_path, '''

        class Expired(NotFound):
            default_code = "EXPIRED"

            @property
            def expired_at(self) -> int | None:
                return self.details.get("expired_at")
        ''')
    with pytest.raises(CatalogueDrift, match=r"Expired\.expired_at has no TypeScript accessor"):
        render_errors(planted, [])


def test_hand_written_roots_that_drift_from_the_catalogue_fail_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import app.sdk_ts as generator

    catalogue = error_catalogue()
    check_error_base(catalogue)  # the committed roots match
    base = tmp_path / "error_base.ts"
    base.write_text((ROOT / ERROR_BASE).read_text().replace('"TIMEOUT"', '"TIMED_OUT"'))
    with pytest.raises(CatalogueDrift, match="TIMED_OUT"):
        check_error_base(catalogue, base)
    monkeypatch.setattr(generator, "check_error_base", lambda found: check_error_base(found, base))
    assert generator.main(["--check"]) == 1
    assert "error_base.ts differs from sdk/loom/errors.py" in capsys.readouterr().out
