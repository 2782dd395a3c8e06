"""The Procfile's ``release:`` line (``app.release``), run as a platform's release phase runs
it: through a shell, from the clone's root, on a store written by this version with one
user's index left as an earlier version wrote it. Run twice, the second run writes nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.local import free_port
from tests.conftest import TEST_SECRET
from tests.support.api import op_helpers
from tests.support.redis_dump import dump_everything
from tests.test_recall import _back_to_layout_1, index_matches_rows

ROOT = Path(__file__).resolve().parents[1]
PROCFILE = dict(
    line.split(": ", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line.strip()
)
FACTS = {"namespace": "support", "agent": "triage-bot", "user_id": "u-42"}
BLOCKS = {"namespace": "support", "agent": "triage-bot", "run_id": "run-7"}
call, ok = op_helpers()


def release(redis_url: str, data_dir: Path, *flags: str,
            **extra: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("LOOM_EMBED")}
    env.update(REDIS_URL=redis_url, LOOM_SECRET_KEY=TEST_SECRET, LOOM_DATA_DIR=str(data_dir),
               LOOM_LOG_FORMAT="text",
               PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
               PYTHONPATH=os.pathsep.join([str(ROOT / "sdk"), str(ROOT)]), **extra)
    return subprocess.run(" ".join([PROCFILE["release"], *flags]), shell=True, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def reads(client) -> dict[str, object]:
    """What a caller reads back: the facts, a search over them, the blocks."""
    return {
        "facts": [ok(client, "memory.get", **FACTS, key=f"walk{i}") for i in range(6)],
        "other": ok(client, "memory.get", **{**FACTS, "user_id": "u-7"}, key="ferry"),
        "search": ok(client, "memory.search", **FACTS, query="harbour walk",
                     read_scope="namespace")["hits"],
        "blocks": ok(client, "working_memory.render", **BLOCKS)["rendered"],
    }


def test_the_release_line_upgrades_a_store_once_and_a_second_run_writes_nothing(
        app, client, redis_url, redis_client, tmp_path):
    for i in range(6):
        ok(client, "memory.set", **FACTS, key=f"walk{i}", value="harbour walk " * (i % 3 + 1))
    ok(client, "memory.set", **{**FACTS, "user_id": "u-7"}, key="ferry", value="harbour ferry")
    ok(client, "working_memory.set", **BLOCKS, block_key="state", content="ticket 4812")
    before = reads(client)
    # One user's index as a version before the current posting layout left it.
    _back_to_layout_1(app, "support", "u-42")

    first = release(redis_url, tmp_path)
    assert first.returncode == 0, first.stderr
    assert "release: recall: 6 facts moved to the current index layout" in first.stdout
    assert "nothing written" not in first.stdout
    index_matches_rows(app, "support", "u-42")
    index_matches_rows(app, "support", "u-7")
    assert reads(client) == before
    upgraded = dump_everything(redis_client)

    second = release(redis_url, tmp_path)
    assert second.returncode == 0, second.stderr
    assert "release: recall: 0 facts moved to the current index layout, 0 recall entries" \
        in second.stdout
    assert "the store was up to date; nothing written" in second.stdout
    assert dump_everything(redis_client) == upgraded
    assert reads(client) == before


def test_the_release_line_fails_the_deploy_when_the_store_does_not_answer(tmp_path):
    failed = release(f"redis://127.0.0.1:{free_port()}/0", tmp_path)
    assert failed.returncode == 1
    assert "release: the store failed" in failed.stderr
    assert "run the release again" in failed.stderr


def test_the_contract_run_moves_the_row_layout_only_when_asked(
        app, client, redis_url, redis_client, tmp_path):
    """The release line a platform runs beside the earlier version leaves the earlier row
    layout in place (that version could not read the moved form); ``--contract``, run after the
    deploy, moves it, and a second contract run writes nothing."""
    from tests.test_memory_layout_move import back_to_the_earlier_layout

    for i in range(3):
        ok(client, "memory.set", **FACTS, key=f"walk{i}", value=f"harbour walk {i}")
    before = reads(client)
    back_to_the_earlier_layout(redis_client, "u-42")
    earlier = dump_everything(redis_client)

    plain = release(redis_url, tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert "memory layout" not in plain.stdout
    assert dump_everything(redis_client) == earlier
    assert reads(client) == before

    contract = release(redis_url, tmp_path, "--contract")
    assert contract.returncode == 0, contract.stderr
    assert "release: memory layout: 3 rows moved to the current row layout" in contract.stdout
    assert "3 memory_id pointers moved" in contract.stdout
    assert reads(client) == before
    moved = dump_everything(redis_client)
    assert moved != earlier

    again = release(redis_url, tmp_path, "--contract")
    assert again.returncode == 0, again.stderr
    assert "the store was up to date; nothing written" in again.stdout
    assert dump_everything(redis_client) == moved


def test_the_release_line_without_redis_url_says_what_to_set(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    env.update(LOOM_SECRET_KEY=TEST_SECRET, LOOM_DATA_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(ROOT / "sdk"), str(ROOT)]))
    done = subprocess.run([sys.executable, "-m", "app.release", "--contract"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("release: REDIS_URL is not set"), done.stderr
    assert "Traceback" not in done.stderr
