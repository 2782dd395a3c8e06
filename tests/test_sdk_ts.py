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
from app.sdk_ts import GENERATED, ROOT, generated_files, main


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
