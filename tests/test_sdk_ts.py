"""The TypeScript SDK's generated files (``sdk-ts/src/generated``) follow the registry.

A fresh generation into a temporary folder must equal the committed files, so a changed op,
schema or error code fails here until ``python -m app.sdk_ts`` is run and its output committed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app import errors
from app.ops import load_ops
from app.sdk_ts import (
    ERROR_BASE,
    GENERATED,
    ROOT,
    CatalogueDrift,
    check_error_base,
    generated_files,
    main,
    python_roots,
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


# --- the error classes, from the server's error catalogue --------------------------------------


def test_every_class_of_the_python_sdk_is_a_typescript_class_of_the_same_place(
    tmp_path: Path,
) -> None:
    from loom import error_classes

    text = next(text for path, text in generated_files(tmp_path).items()
                if path.name == "errors.ts")
    classes = [value for value in vars(error_classes).values()
               if isinstance(value, type) and value.__module__ == error_classes.__name__]
    assert len(classes) > 40
    for cls in classes:
        declared = (f"export class {cls.__name__} extends {cls.__bases__[0].__name__} {{\n"
                    f'  static override readonly code: string = "{cls.default_code}";')
        assert declared in text, cls.__name__
        if cls.__dict__.get("remedy") is not None:
            assert f'readonly remedy: string | null = "{cls.remedy}";' in text.split(
                f"export class {cls.__name__} ")[1].split("\n}\n")[0], cls.__name__
    for code, cls in error_classes.BY_CODE.items():
        assert f'  "{code}": {cls.__name__},\n' in text
    for status, cls in error_classes.BY_STATUS.items():
        assert f"  {status}: {cls.__name__},\n" in text
    # Accessors follow the Python properties: .fields on ValidationError, the limits' lengths.
    validation = text.split("export class ValidationError")[1].split("\n}\n")[0]
    assert "get fields(): Record<string, unknown>" in validation
    limits = text.split("export class LimitExceeded")[1].split("\n}\n")[0]
    assert "get valueLength()" in limits and "get charLimit()" in limits
    for cls in classes:
        own = [name for name, value in vars(cls).items() if isinstance(value, property)]
        body = text.split(f"export class {cls.__name__} ")[1].split("\n}\n")[0]
        for name in own:
            camel = name.split("_")[0] + "".join(part.title() for part in name.split("_")[1:])
            assert f"  get {camel}(): " in body, (cls.__name__, name)


def test_a_code_added_to_the_catalogue_leaves_both_sdks_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import app.sdk_errors as sdk_errors
    import app.sdk_manifest as manifest
    import app.sdk_ts as generator
    from app import error_catalogue

    committed = (ROOT / GENERATED / "errors.ts").read_text()
    planted = error_catalogue.ErrorSpec(
        "MEMORY_TOO_OLD", 404, "A planted code.", error_catalogue.Remedy.FIX_INPUT,
        "MemoryTooOld", "op", (error_catalogue.Detail("expired_at", "integer", "when"),))
    catalogue = (*error_catalogue.CATALOGUE, planted)
    monkeypatch.setattr(sdk_errors, "CATALOGUE", catalogue)
    monkeypatch.setattr(generator, "CATALOGUE", catalogue)
    fresh = next(text for path, text in generator.generated_files(tmp_path).items()
                 if path.name == "errors.ts")
    assert "export class MemoryTooOld extends NotFound {" in fresh
    assert "get expiredAt(): number | bigint | null {" in fresh
    assert '  "MEMORY_TOO_OLD": MemoryTooOld,\n' in fresh
    assert generator.main(["--check"]) == 1
    assert "errors.ts is behind the registry" in capsys.readouterr().out
    assert (ROOT / GENERATED / "errors.ts").read_text() == committed
    python = sdk_errors.render_python()
    assert "class MemoryTooOld(NotFound):" in python
    assert "    def expired_at(self) -> int | None:" in python
    assert manifest.main(["--check"]) == 1
    assert "error_classes.py is behind the code" in capsys.readouterr().err


def test_a_detail_that_cannot_be_an_accessor_stops_the_generation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import app.sdk_errors as sdk_errors
    from app import error_catalogue

    planted = error_catalogue.ErrorSpec(
        "EXPIRED", 404, "A planted code.", error_catalogue.Remedy.FIX_INPUT, "Expired", "op",
        (error_catalogue.Detail("expired-at", "integer", "when"),))
    monkeypatch.setattr(sdk_errors, "CATALOGUE", (*error_catalogue.CATALOGUE, planted))
    with pytest.raises(CatalogueDrift, match=r"Expired: detail 'expired-at' cannot be"):
        sdk_errors.sdk_classes()


def test_hand_written_roots_that_drift_from_the_python_roots_fail_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import app.sdk_ts as generator

    roots = python_roots()
    check_error_base(roots)  # the committed roots match
    base = tmp_path / "error_base.ts"
    base.write_text((ROOT / ERROR_BASE).read_text().replace('"TIMEOUT"', '"TIMED_OUT"'))
    with pytest.raises(CatalogueDrift, match="TIMED_OUT"):
        check_error_base(roots, base)
    monkeypatch.setattr(generator, "check_error_base", lambda found: check_error_base(found, base))
    assert generator.main(["--check"]) == 1
    assert "error_base.ts differs from sdk/loom/error_base.py" in capsys.readouterr().out
