"""Every generated file is checked: the generators' ``--check`` names a file that is behind and
writes nothing, and CI runs each of them before the suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from app import docs_reference, generated, sdk_manifest

ROOT = Path(__file__).resolve().parents[1]
GENERATORS = {"python -m app.docs_reference": docs_reference,
              "python -m app.sdk_manifest": sdk_manifest}


@pytest.mark.parametrize("command", sorted(GENERATORS))
def test_each_generated_file_is_committed_as_generated(command):
    files = GENERATORS[command].generated_files()
    assert files
    assert generated.behind(files) == [], f"run `{command}`"


def test_check_names_a_file_behind_and_writes_nothing(tmp_path, capsys):
    current, stale, missing = tmp_path / "current.py", tmp_path / "stale.py", tmp_path / "new.py"
    current.write_text("A = 1\n")
    stale.write_text("B = 1\n")
    files = {current: "A = 1\n", stale: "B = 2\n", missing: "C = 3\n"}
    assert generated.sync(files, ["--check"], "python -m gen") == 1
    assert stale.read_text() == "B = 1\n" and not missing.exists()
    reported = capsys.readouterr().err.splitlines()
    assert reported == ["stale.py is behind the code: run python -m gen",
                        "new.py is behind the code: run python -m gen"]
    assert generated.sync(files, [], "python -m gen") == 0
    assert (stale.read_text(), missing.read_text()) == ("B = 2\n", "C = 3\n")
    assert generated.sync(files, ["--check"], "python -m gen") == 0


def test_ci_checks_every_generator_before_the_suite():
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    suite = next(index for index, line in enumerate(lines) if line.endswith(".venv/bin/pytest"))
    for command in GENERATORS:
        checks = [index for index, line in enumerate(lines)
                  if f".venv/bin/{command} --check" in line]
        assert checks and checks[0] < suite, command
