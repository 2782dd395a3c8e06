"""The documentation site builds with ``mkdocs build --strict`` and its generated reference names
every op, setting, error code and metric the code declares (and every metric a real
``/metrics`` scrape answers); a broken link fails the build."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app import docs_reference
from app.ops import load_ops
from app.settings import SETTINGS

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
pytest.importorskip("material", reason="the docs extra is not installed: pip install -e '.[docs]'")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        # Never --quiet: it drops the warnings --strict counts, and a broken link would pass.
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(config), "--site-dir", str(site)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


@pytest.fixture(scope="module")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    built = _build(ROOT / "mkdocs.yml", site)
    assert built.returncode == 0, built.stderr
    return site


def _page_text(site: Path, page: str) -> str:
    """The text a reader sees on one built page (tags dropped, entities decoded)."""
    raw = (site / page / "index.html").read_text()
    return html.unescape(re.sub(r"<[^>]+>", "", raw))


def test_every_op_with_each_of_its_fields_is_in_the_built_reference(built_site):
    text = _page_text(built_site, "reference/ops")
    raw = (built_site / "reference/ops/index.html").read_text()
    for declared in load_ops():
        assert declared.name in text, declared.name
        # Each op has a section of its own, with every input field the registry declares.
        anchor = re.sub(r"[^\w-]", "", declared.name.lower())
        section = raw.split(f'id="{anchor}"', 1)[1].split("<h2", 1)[0]
        for name in declared.args().load_fields:
            field = declared.args().load_fields[name]
            assert f"<code>{field.data_key or name}</code>" in section, (declared.name, name)


def test_every_setting_is_in_the_built_reference(built_site):
    text = _page_text(built_site, "reference/settings")
    missing = [setting.name for setting in SETTINGS if setting.name not in text]
    assert missing == []


def test_every_error_code_with_its_status_is_in_the_built_reference(built_site):
    text = _page_text(built_site, "reference/errors")
    from app.error_catalogue import CATALOGUE as catalogue
    from app.errors import StoreUnavailable, WorkingMemoryLimitExceeded

    assert {entry.code for entry in catalogue} >= {StoreUnavailable.code,
                                                   WorkingMemoryLimitExceeded.code}
    for entry in catalogue:
        assert re.search(rf"{re.escape(entry.code)}\s*{entry.status}\b", text), entry.code


def test_every_metric_is_in_the_built_reference(built_site):
    text = _page_text(built_site, "reference/metrics")
    names = [entry.name for entry in docs_reference.metric_catalogue()]
    assert "loom_http_requests_total" in names and "loom_queue_depth" in names
    assert [name for name in names if name not in text] == []


def test_every_metric_a_real_scrape_answers_is_declared_for_the_reference(client):
    # A request first, so the web's labelled series have samples.
    client.post("/v1/working_memory.get", json={"namespace": "n", "agent": "a"})
    scrape = client.get("/metrics")
    assert scrape.status_code == 200
    exposed = set()
    for family in text_string_to_metric_families(scrape.get_data(as_text=True)):
        exposed |= {sample.name.removesuffix("_bucket").removesuffix("_count")
                    .removesuffix("_sum") for sample in family.samples}
        exposed.add(family.name + ("_total" if family.type == "counter" else ""))
    declared = {entry.name for entry in docs_reference.metric_catalogue()}
    assert {"loom_http_requests_total", "loom_queue_depth"} <= exposed
    assert exposed - declared == set(), "declare these in app/metrics.py"


def test_a_broken_link_fails_the_strict_build(tmp_path):
    """--strict is what CI runs: a link to a page that does not exist stops the build."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + "\nSee [the old page](guides/no-such-page.md).\n")
    built = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0
    assert "no-such-page.md" in built.stderr


def test_a_page_left_out_of_the_nav_fails_the_strict_build(tmp_path):
    """A page no reader can reach from the nav is a mistake: docs/ holds only nav'd pages."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    (tmp_path / "docs" / "guides" / "orphan.md").write_text("# Orphan\n")
    built = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0
    assert "orphan.md" in built.stderr


def test_the_site_builds_offline_and_loads_nothing_from_elsewhere(built_site):
    """No plugin that fetches at build time, and no page asks a browser for another site's
    script, stylesheet or font."""
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["plugins"] == ["search"]
    assert config["theme"]["font"] is False
    for page in built_site.rglob("*.html"):
        for url in re.findall(r'(?:src|href)="(https?://[^"]+)"', page.read_text()):
            # The theme's footer credits its home page: a link, not a load.
            assert url.startswith("https://squidfunk.github.io/mkdocs-material"), (page, url)
    assert not list(built_site.rglob("*fonts.googleapis*"))


def test_a_bench_run_rewrites_its_result_file_and_the_benchmarks_page(tmp_path, monkeypatch):
    from bench import results

    monkeypatch.setattr(docs_reference, "BENCH_RESULTS", tmp_path / "results")
    monkeypatch.setattr(docs_reference, "BENCHMARKS_PAGE", tmp_path / "benchmarks.md")
    monkeypatch.setattr(sys, "argv", ["bench/memory.py", "--count", "30"])
    path = results.record("memory", "Bytes per stored thing.", {"fact, first version": "5,104 B"},
                          "Valkey 9.1.2", results.machine("Valkey 9.1.2"))
    saved = json.loads(path.read_text())
    assert saved["command"] == "python bench/memory.py --count 30"
    assert saved["machine"]["redis"] == "Valkey 9.1.2" and saved["machine"]["cores"]
    page = (tmp_path / "benchmarks.md").read_text()
    assert page == docs_reference.benchmarks_page()
    assert "| fact, first version | 5,104 B |" in page
    assert f"on {saved['date']}" in page and "Valkey 9.1.2" in page
    assert "at the start." in page and "at the end." not in page
    # Recorded without the machine read before the run: the page says whose load it shows.
    results.record("recall", "Search latency.", {"p50": "3 ms"}, "Valkey 9.1.2")
    page = (tmp_path / "benchmarks.md").read_text()
    assert page == docs_reference.benchmarks_page()
    assert page.count("at the start.") == 1 and page.count("at the end.") == 1


# Modules under bench/ that are not a bench run: the baseline app, the straight WSGI call and
# the result files' own writer.
BENCH_HELPERS = {"__init__", "baseline_app", "wsgi_call", "results"}


def _record_calls(path: Path) -> int:
    """Calls of ``<bench.results>.record(...)`` in a bench script, whatever name it imports the
    module under (``results``, or another where a local already takes that name)."""
    import ast

    tree = ast.parse(path.read_text())
    names = {alias.asname or alias.name for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and node.module == "bench"
             for alias in node.names if alias.name == "results"}
    return sum(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr == "record" and isinstance(node.func.value, ast.Name)
               and node.func.value.id in names for node in ast.walk(tree))


def test_every_bench_script_keeps_its_figures_in_a_result_file():
    """A bench that prints figures without recording them would put nothing on the benchmarks
    page, or leave a stale figure there: every bench script calls ``bench.results.record``."""
    scripts = sorted(p for p in (ROOT / "bench").glob("*.py") if p.stem not in BENCH_HELPERS)
    assert len(scripts) >= 16
    assert [p.name for p in scripts if not _record_calls(p)] == []


def test_a_result_names_the_server_it_measured(redis_server_url):
    import redis

    from bench import results

    info = redis.Redis.from_url(redis_server_url).info("server")
    assert results.server_at(redis_server_url) == results.server_name(info)
    embedded = results.embedded_server()
    assert re.fullmatch(r"Valkey \d+\.\d+\.\d+ \(embedded\)", embedded), embedded
    if "valkey_version" in info:  # the suite runs on the embedded server: the same version
        assert embedded == f"Valkey {info['valkey_version']} (embedded)"


def test_every_figure_on_the_benchmarks_page_comes_from_a_result_file():
    """The committed page is the one the committed result files render: no figure by hand."""
    assert docs_reference.benchmarks_page() == docs_reference.BENCHMARKS_PAGE.read_text()
    for result in docs_reference.benchmark_results():
        assert {"bench", "what", "command", "date", "machine", "figures"} <= set(result)
        assert result["figures"]


def test_decisions_end_with_the_section_new_entries_are_appended_to():
    """Entries are appended at the end of docs/decisions.md: the last heading is the one that
    takes them, so an appended entry never lands inside a topic by accident."""
    text = (ROOT / "docs" / "decisions.md").read_text()
    headings = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    assert headings[-1] == "Added since the last grouping"
    assert len(headings) == len(set(headings)), "a topic appears twice"
