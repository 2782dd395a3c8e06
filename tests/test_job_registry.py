"""Background work is declared once and enqueued by one dispatcher: every intent a store hands
``services.jobs`` has a declaration in ``app.job_registry`` (function, queue, timeout, result
and failure lifetimes, retry policy) naming a job function that carries ``@declared_job``;
the dispatcher enqueues on a real RQ queue with exactly those settings; the scheduler's
periodic jobs and a pass's fanned-out jobs are declared there too; nothing under
``app/store`` imports RQ, and no module but the registry names a job function by string.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
import typing
from pathlib import Path

import pytest
import redis
from rq import Queue
from rq.job import Job
from rq_scheduler import Scheduler

from app import job_registry
from app.job_dispatch import JobDispatcher
from app.job_registry import (
    BUILD_USER,
    END_PASS,
    JOBS,
    PASS_JOBS,
    PERIODIC,
    JobSpec,
    RetryPolicy,
    declared_job,
    spec_for,
)
from app.queue_names import ALL_QUEUES
from app.settings import load_settings
from app.store.intents import (
    EmbedUserFacts,
    Intent,
    QueuedJob,
    RefreshProfileVectors,
    RunErasure,
)
from jobs.scheduler import periodic_jobs, register
from tests.conftest import TEST_SECRET
from tests.support import import_graph

ROOT = Path(__file__).resolve().parents[1]
STORES = ROOT / "app" / "store"
RQ_PACKAGES = {"rq", "rq_scheduler", "rq_dashboard"}
# A dotted path into the jobs package, as RQ names a job function.
JOB_PATH = re.compile(r"^jobs\.\w+(\.\w+)+$")

SAMPLES: list[Intent] = [
    EmbedUserFacts("acme", "support", "u-1", "embed-job-1"),
    RefreshProfileVectors("acme", "support", "u-1"),
    RunErasure("acme", "support", "e" * 64),
]


# --- the stores -------------------------------------------------------------------------------


def _non_doc_strings(tree: ast.AST) -> list[ast.Constant]:
    """Every string constant of the source but the docstrings."""
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docs.add(id(body[0].value))
    return [node for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in docs]


def job_names_in(source: str) -> list[str]:
    """The strings of ``source`` (docstrings aside) that name a job function."""
    declared = job_registry.declared_functions()
    return [node.value for node in _non_doc_strings(ast.parse(source))
            if JOB_PATH.match(node.value) or any(name in node.value for name in declared)]


def test_no_store_imports_rq():
    graph = import_graph.build({"app": ROOT / "app"})
    stores = {module for module in graph.modules
              if module == "app.store" or module.startswith("app.store.")}
    assert len(stores) > 20
    assert {module: sorted(graph.external[module] & RQ_PACKAGES) for module in stores
            if graph.external[module] & RQ_PACKAGES} == {}


def test_no_module_but_the_registry_names_a_job_by_string():
    paths = [*STORES.rglob("*.py"), *(ROOT / "app").glob("*.py"), *(ROOT / "jobs").rglob("*.py")]
    found = {str(path.relative_to(ROOT)): job_names_in(path.read_text()) for path in paths
             if path != ROOT / "app" / "job_registry.py"}
    assert len(found) > 60
    assert {path: names for path, names in found.items() if names} == {}


# Calls that put a job on a queue or a schedule, and the modules allowed to make them: the
# dispatcher (a store's intents), the scheduler (``PERIODIC``), a pass's fan-out (``PASS_JOBS``).
ENQUEUING = {"enqueue", "enqueue_many", "enqueue_call", "enqueue_at", "enqueue_in", "schedule",
             "prepare_data", "cron"}
ENQUEUERS = {"app/job_dispatch.py", "jobs/scheduler.py", "jobs/structured_profile.py"}


def enqueuing_calls(source: str) -> list[str]:
    return [node.func.attr for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ENQUEUING]


def test_only_the_dispatcher_the_scheduler_and_the_fan_out_enqueue():
    paths = [*(ROOT / "app").rglob("*.py"), *(ROOT / "jobs").rglob("*.py")]
    found = {str(path.relative_to(ROOT)) for path in paths
             if enqueuing_calls(path.read_text())}
    assert found == ENQUEUERS
    assert enqueuing_calls("q.enqueue(f)\nscheduler.schedule(when, f)\nq.count\n") == [
        "enqueue", "schedule"]


def test_the_string_check_finds_a_job_named_in_code_and_spares_a_docstring():
    source = '''
"""Enqueues ``jobs.recall_embed.embed_user``: a docstring may say so."""
FUNC = "jobs.recall_embed.embed_user"
def later():
    """Runs jobs.erasure.run_erasure."""
    return enqueue("jobs.erasure.resume_pass", f"x {'jobs.erasure.run_erasure'}")
'''
    assert job_names_in(source) == ["jobs.recall_embed.embed_user", "jobs.erasure.resume_pass",
                                    "jobs.erasure.run_erasure"]
    assert job_names_in('"""jobs.a.b"""\nTEXT = "see the jobs page"\n') == []


# --- the registry -----------------------------------------------------------------------------


def test_every_intent_is_declared_with_its_settings():
    kinds = set(typing.get_args(Intent))
    assert kinds == set(JOBS) == {type(intent) for intent in SAMPLES}
    for kind, spec in JOBS.items():
        assert spec.queue in ALL_QUEUES, kind
        assert spec.timeout > 0 and spec.result_ttl > 0 and spec.failure_ttl > 0, kind
        assert spec.retry is None or (spec.retry.max > 0 and spec.retry.intervals), kind
        assert spec.description, kind


def test_every_declared_function_exists_and_carries_the_decorator():
    specs = [*JOBS.values(), *PERIODIC, *PASS_JOBS]
    assert len({spec.func for spec in specs}) == len(specs) == 10
    for spec in specs:
        assert spec.queue in ALL_QUEUES, spec
        module_name, _, name = spec.func.rpartition(".")
        function = getattr(importlib.import_module(module_name), name)
        assert callable(function)
        assert function.__dict__.get("loom_job") == spec.func


def test_an_undeclared_function_is_refused_when_declared():
    def stray(org: str) -> None:
        """A job body no declaration names."""

    with pytest.raises(LookupError, match="not declared"):
        declared_job(stray)


def test_the_settings_kept_from_before_the_registry():
    # The values the stores passed to RQ themselves before there was a registry: a change
    # here changes what operators see on the queues (timeouts, how long results stay).
    day = 24 * 3600
    assert JOBS[EmbedUserFacts] == JobSpec(
        "jobs.recall_embed.embed_user", "loom-builds", 900, 600, day, None,
        "recall embeddings")
    assert JOBS[RefreshProfileVectors] == JobSpec(
        "jobs.profile_vectors.refresh_sections", "loom-builds", 300, 600, day, None,
        "profile section vectors")
    assert JOBS[RunErasure] == JobSpec(
        "jobs.erasure.run_erasure", "loom-maintenance", day, 3600, 7 * day, None,
        "erasure {erasure_id:.12}")


# --- the dispatcher on a real queue -----------------------------------------------------------


@pytest.fixture
def dispatcher(app) -> JobDispatcher:
    services = app.extensions["loom"]
    assert isinstance(services.jobs, JobDispatcher)
    return services.jobs


@pytest.mark.parametrize("intent", SAMPLES, ids=lambda intent: type(intent).__name__)
def test_the_dispatcher_enqueues_with_the_declared_settings(dispatcher, intent):
    spec = spec_for(intent)
    job_id = dispatcher.dispatch(intent)
    job = Job.fetch(job_id, connection=dispatcher.connection)
    assert job.func_name == spec.func
    assert job.origin == spec.queue
    assert job_id in Queue(spec.queue, connection=dispatcher.connection).get_job_ids()
    assert job.timeout == spec.timeout
    assert job.result_ttl == spec.result_ttl
    assert job.failure_ttl == spec.failure_ttl
    assert job.retries_left is None
    assert tuple(job.args) == intent.args()
    if intent.job_id:
        assert job_id == intent.job_id  # the dedup key a queued marker holds
    assert dispatcher.job(job_id) == QueuedJob(job_id, "queued", None, True)


def test_an_erasure_run_names_the_erasure_never_the_user(dispatcher):
    intent = RunErasure("acme", "support", "ab" * 32)
    job = Job.fetch(dispatcher.dispatch(intent), connection=dispatcher.connection)
    assert job.description == "erasure " + "ab" * 6
    assert tuple(job.args) == ("acme", "support", "ab" * 32)


def test_a_rerun_replaces_the_stale_job(dispatcher):
    first = dispatcher.dispatch(RunErasure("acme", "support", "e1"))
    second = dispatcher.dispatch(RunErasure("acme", "support", "e1", replaces=first))
    assert dispatcher.job(first) is None
    queued = Queue("loom-maintenance", connection=dispatcher.connection).get_job_ids()
    assert queued == [second]


def test_a_declared_retry_policy_reaches_rq(dispatcher, monkeypatch):
    retried = dataclasses.replace(JOBS[RefreshProfileVectors],
                                  retry=RetryPolicy(max=3, intervals=(5, 30)))
    monkeypatch.setitem(JOBS, RefreshProfileVectors, retried)
    job = Job.fetch(dispatcher.dispatch(RefreshProfileVectors("acme", "support", "u-2")),
                    connection=dispatcher.connection)
    assert job.retries_left == 3
    assert job.retry_intervals == [5, 30]


def test_the_dispatcher_finds_and_purges_the_jobs_naming_a_user(dispatcher):
    mine = dispatcher.dispatch(EmbedUserFacts("acme", "support", "u-9", "embed-u-9"))
    other = dispatcher.dispatch(EmbedUserFacts("acme", "support", "u-10", "embed-u-10"))
    found = list(dispatcher.jobs_about("acme", "support", "u-9"))
    assert [job.id for job in found] == [mine]
    dispatcher.purge(found[0])
    assert dispatcher.job(mine) is None
    assert list(dispatcher.jobs_about("acme", "support", "u-9")) == []
    assert Queue("loom-builds", connection=dispatcher.connection).get_job_ids() == [other]


# --- the scheduler and a pass -----------------------------------------------------------------


def _every_periodic_job_on(redis_url: str):
    return load_settings(overrides={
        "redis_url": redis_url, "secret_key": TEST_SECRET, "embed_base_url": "http://127.0.0.1:9",
        "embed_model": "m", "profile_consolidation_enabled": True})


def test_every_periodic_job_is_declared_and_scheduled_with_its_settings(redis_url):
    definitions = periodic_jobs(_every_periodic_job_on(redis_url))
    declared = {spec.func: spec for spec in PERIODIC}
    assert {definition.func for definition in definitions} == set(declared)
    for definition in definitions:
        assert (definition.queue, definition.timeout) == (declared[definition.func].queue,
                                                          declared[definition.func].timeout)
    connection = redis.Redis.from_url(redis_url)
    scheduler = Scheduler(connection=connection)
    register(scheduler, definitions)
    for definition in definitions:
        job = Job.fetch(definition.job_id, connection=connection)
        assert (job.func_name, job.origin) == (definition.func, definition.queue)
        assert job.timeout == definition.timeout == 180
        assert job.result_ttl == definition.result_ttl
        assert job.retries_left is None


def test_a_pass_fans_out_on_the_declared_queues():
    assert (BUILD_USER.queue, END_PASS.queue) == ("loom-builds", "loom-passes")
    assert all(spec.retry is None for spec in PASS_JOBS)
