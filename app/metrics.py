"""What ``GET /metrics`` exposes, in the Prometheus text format.

Three sources, gathered into one fresh registry per scrape:

- **the web processes**: prometheus_client instruments (requests by op and status, latency by
  op, Redis errors, 503s, rate-limited requests). Under gunicorn, ``gunicorn.conf.py`` sets
  ``PROMETHEUS_MULTIPROC_DIR`` before any worker imports this module, so every worker writes
  its values to files there and ``MultiProcessCollector`` adds them up at scrape time, whichever
  worker answers; ``child_exit`` marks a dead worker's files.
- **the worker and scheduler processes**: they add to counters kept in Redis
  (``app.store.metrics``), read back here in one round trip: passes, pass duration, builds by
  outcome, model calls and tokens by org.
- **the queues, read at scrape time**: depth and oldest job age per queue, failed jobs,
  workers alive, the lease holders' age, whether a scheduler runs; and the embeddings backlog
  (facts waiting for a vector, and their users), counted from the users' due lists.

Label values are bounded: ``op`` is a registry op or one of a few route names, ``status`` an
HTTP status, ``org`` at most ``LOOM_METRICS_MAX_ORGS`` orgs plus ``_other``, ``outcome``,
``queue``, ``pass`` and ``lease`` fixed lists.
"""

from __future__ import annotations

import functools
import logging
import os
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
    values,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from app.job_queues import JobQueueReader
from app.store.connection import STORE_ERROR
from app.store.lease import PASS_LEASES, LeaseStore
from app.store.metrics import JobMetricsStore, Labels
from app.store.profile_schema import ProfileSchemaStore
from app.store.recall_vectors import RecallVectorStore
from app.store.structured import StructuredStore

if TYPE_CHECKING:
    from app.services import Services

log = logging.getLogger("loom.metrics")

CONTENT_TYPE = CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# The _created series double every counter's size and multiprocess mode drops them anyway.
disable_created_metrics()

# This process's id, read again in a forked child only. In multiprocess mode every value's
# inc asks its process identifier whether the process forked, and os.getpid is a system call
# each time: three a request. ``MultiProcessValue`` takes the identifier as its documented
# argument; a C-level callable reading the kept id costs no call into the kernel, and the
# fork hook keeps it true (an exec'd child imports everything anew).
_PID = [os.getpid()]


def _forked() -> None:
    _PID[0] = os.getpid()


os.register_at_fork(after_in_child=_forked)
if values.ValueClass is not values.MutexValue:  # multiprocess mode: chosen at import
    values.ValueClass = values.MultiProcessValue(
        process_identifier=functools.partial(_PID.__getitem__, 0))

# Created once per process into a private registry: never the global default one, so tests
# and embedded uses do not see prometheus_client's process collectors twice.
WEB_REGISTRY = CollectorRegistry(auto_describe=True)
REQUESTS = Counter("loom_http_requests", "HTTP requests answered, by op and status.",
                   ["op", "status"], registry=WEB_REGISTRY)
LATENCY = Histogram("loom_http_request_duration_seconds", "Time to answer a request, by op.",
                    ["op"], buckets=LATENCY_BUCKETS, registry=WEB_REGISTRY)
REDIS_ERRORS = Counter("loom_redis_errors", "Redis errors met while answering, by process.",
                       ["process"], registry=WEB_REGISTRY)
UNAVAILABLE = Counter("loom_http_unavailable", "Requests answered 503, by op.", ["op"],
                      registry=WEB_REGISTRY)
RATE_LIMITED = Counter("loom_http_rate_limited", "Requests refused by the rate limit (429), "
                       "by op.", ["op"], registry=WEB_REGISTRY)

# What the worker and scheduler add to in Redis: name -> (kind, help, label names).
JOB_METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "loom_passes_total": ("counter", "Worker passes that ran, by pass.", ("pass",)),
    "loom_pass_duration_seconds": ("histogram", "Wall time of a pass, by pass.", ("pass",)),
    "loom_passes_full_total": ("counter", "Passes that handed out as many users as their cap "
                               "(LOOM_STRUCTURED_PROFILE_MAX_USERS_PER_PASS), by pass: while "
                               "it grows with every pass, the cap, not the workers, bounds "
                               "throughput.", ("pass",)),
    "loom_builds_total": ("counter", "Structured-profile builds, by outcome (built, short, "
                          "unchanged, refused, cut_off, failed).", ("outcome",)),
    "loom_model_calls_total": ("counter", "Model calls made, by org.", ("org",)),
    "loom_model_prompt_tokens_total": ("counter", "Prompt tokens the model counted, by org.",
                                       ("org",)),
    "loom_model_completion_tokens_total": ("counter", "Completion tokens the model counted, "
                                           "by org.", ("org",)),
    "loom_job_errors_total": ("counter", "RQ jobs that raised, by function and error kind "
                              "(redis, other).", ("function", "error")),
}

# What ``/metrics`` reads from the queues' Redis and the data Redis at scrape time: name ->
# (help, label names). The collector builds each family from here, and the reference page
# (``python -m app.docs_reference``) lists them from here, so the two cannot differ.
SCRAPE_METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "loom_queue_depth": ("Jobs waiting, by queue.", ("queue",)),
    "loom_queue_oldest_job_age_seconds": ("Age of the oldest waiting job, by queue (0: none "
                                          "waits).", ("queue",)),
    "loom_queue_failed_jobs": ("Jobs in the failed registry, by queue.", ("queue",)),
    "loom_workers_alive": ("RQ workers listening, by queue.", ("queue",)),
    "loom_schedulers_alive": ("rq-scheduler processes whose heartbeat is current.", ()),
    "loom_scheduled_jobs": ("Jobs rq-scheduler holds.", ()),
    "loom_lease_held": ("1 while a pass holds the lease.", ("lease",)),
    "loom_lease_holder_age_seconds": ("Seconds since the current holder took the lease (0: "
                                      "free).", ("lease",)),
    "loom_recall_vectors_backlog_facts": ("Facts waiting for a vector (memory.search's vector "
                                          "leg): written or changed since their last "
                                          "embedding.", ()),
    "loom_recall_vectors_backlog_users": ("Users with facts waiting for a vector.", ()),
    "loom_structured_users_waiting": (
        "Users waiting for a structured-profile build, by namespace and state: pending (never "
        "built), stale (changed since their build) or parked (a failed build's backoff or a "
        "refusal).", ("org", "namespace", "state")),
    "loom_structured_oldest_wait_seconds": (
        "Seconds since the change of the longest-waiting pending or stale user, by namespace "
        "(0: none waits).", ("org", "namespace")),
}


def _gauge(name: str) -> GaugeMetricFamily:
    """The gauge family ``name`` as ``SCRAPE_METRICS`` declares it, without samples yet."""
    doc, label_names = SCRAPE_METRICS[name]
    return GaugeMetricFamily(name, doc, labels=list(label_names))


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


# The labelled children of REQUESTS and LATENCY per (op, status): ``labels()`` takes a lock
# and builds its key on every call, and the label sets are few (ops x statuses).
_REQUEST_CHILDREN: dict[tuple[str, int], tuple[Any, Any]] = {}


def observe_request(op: str, status: int, seconds: float) -> None:
    children = _REQUEST_CHILDREN.get((op, status))
    if children is None:
        children = (REQUESTS.labels(op=op, status=str(status)), LATENCY.labels(op=op))
        _REQUEST_CHILDREN[(op, status)] = children
    children[0].inc()
    children[1].observe(seconds)
    if status == 503:
        UNAVAILABLE.labels(op=op).inc()
    elif status == 429:
        RATE_LIMITED.labels(op=op).inc()


def note_exception(error: BaseException, process: str = "web") -> None:
    if isinstance(error, STORE_ERROR):
        REDIS_ERRORS.labels(process=process).inc()


def render(services: Services) -> bytes:
    registry = CollectorRegistry()
    # First: a Redis error met while reading it is then counted in this same scrape.
    registry.register(JobsCollector(services))
    directory = multiprocess_dir()
    if directory:
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry, path=directory)
    else:
        registry.register(WEB_REGISTRY)
    return generate_latest(registry)


class JobsCollector:
    """The worker-side counters and the queue gauges, read from Redis at scrape time."""

    def __init__(self, services: Services) -> None:
        self.services = services

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self._guarded(self._job_metrics)
        yield from self._guarded(self._queue_metrics)
        yield from self._guarded(self._lease_metrics)
        yield from self._guarded(self._backlog_metrics)
        yield from self._guarded(self._structured_backlog_metrics)

    def _guarded(self, source: Any) -> Iterator[Metric]:
        try:
            families = list(source())
        except STORE_ERROR as error:
            # One Redis down must not hide the web's own metrics: leave its families out.
            note_exception(error)
            log.warning("metrics: %s skipped: %s", source.__name__, error)
            return
        yield from families

    def _job_metrics(self) -> Iterator[Metric]:
        values = self.services.store(JobMetricsStore).read()
        by_name: dict[str, dict[Labels, float]] = defaultdict(dict)
        for (name, labels), value in values.items():
            by_name[name][labels] = value
        for name, (kind, doc, label_names) in JOB_METRICS.items():
            if kind == "counter":
                family = CounterMetricFamily(name, doc, labels=list(label_names))
                for labels, value in sorted(by_name.get(name, {}).items()):
                    family.add_metric(_values(labels, label_names), value)
                yield family
            else:
                yield _histogram(name, doc, label_names, by_name)

    def _queue_metrics(self) -> Iterator[Metric]:
        census = self.services.store(JobQueueReader).read(datetime.now(UTC))
        depth = _gauge("loom_queue_depth")
        oldest = _gauge("loom_queue_oldest_job_age_seconds")
        failed = _gauge("loom_queue_failed_jobs")
        workers = _gauge("loom_workers_alive")
        for queue in census.queues:
            depth.add_metric([queue.name], queue.depth)
            oldest.add_metric([queue.name], queue.oldest_age_seconds)
            failed.add_metric([queue.name], queue.failed)
            workers.add_metric([queue.name], queue.workers)
        yield from (depth, oldest, failed, workers)
        alive = _gauge("loom_schedulers_alive")
        alive.add_metric([], census.schedulers_alive)
        yield alive
        scheduled = _gauge("loom_scheduled_jobs")
        scheduled.add_metric([], census.scheduled_jobs)
        yield scheduled

    def _lease_metrics(self) -> Iterator[Metric]:
        leases = self.services.store(LeaseStore)
        held = _gauge("loom_lease_held")
        age = _gauge("loom_lease_holder_age_seconds")
        for name in PASS_LEASES:
            seconds = leases.holder_age(name)
            held.add_metric([name], 0 if seconds is None else 1)
            age.add_metric([name], seconds or 0.0)
        yield held
        yield age


    def _backlog_metrics(self) -> Iterator[Metric]:
        backlog = self.services.store(RecallVectorStore).backlog()
        facts = _gauge("loom_recall_vectors_backlog_facts")
        facts.add_metric([], backlog.facts)
        users = _gauge("loom_recall_vectors_backlog_users")
        users.add_metric([], backlog.users)
        yield facts
        yield users


    def _structured_backlog_metrics(self) -> Iterator[Metric]:
        namespaces = self.services.store(ProfileSchemaStore).namespaces()
        backlogs = self.services.store(StructuredStore).backlog(namespaces)
        now_ns = self.services.clock.now_ns()
        waiting = _gauge("loom_structured_users_waiting")
        oldest = _gauge("loom_structured_oldest_wait_seconds")
        for backlog in backlogs:
            where = [backlog.org, backlog.namespace]
            waiting.add_metric([*where, "pending"], backlog.pending)
            waiting.add_metric([*where, "stale"], backlog.stale)
            waiting.add_metric([*where, "parked"], backlog.parked)
            since = backlog.oldest_changed_ns
            oldest.add_metric(where, 0.0 if since is None else max(0.0, (now_ns - since) / 1e9))
        yield waiting
        yield oldest


def _values(labels: Labels, label_names: tuple[str, ...]) -> list[str]:
    found = dict(labels)
    return [found.get(name, "") for name in label_names]


def _histogram(name: str, doc: str, label_names: tuple[str, ...],
               by_name: dict[str, dict[Labels, float]]) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=list(label_names))
    series: dict[tuple[str, ...], dict[str, Any]] = defaultdict(
        lambda: {"buckets": {}, "sum": 0.0})
    for labels, value in by_name.get(name + "_bucket", {}).items():
        found = dict(labels)
        le = found.pop("le", "+Inf")
        key = tuple(found.get(n, "") for n in label_names)
        series[key]["buckets"][le] = value
    for labels, value in by_name.get(name + "_sum", {}).items():
        series[tuple(_values(labels, label_names))]["sum"] = value
    for key, data in sorted(series.items()):
        buckets = sorted(data["buckets"].items(),
                         key=lambda item: float("inf") if item[0] == "+Inf" else float(item[0]))
        if not buckets or buckets[-1][0] != "+Inf":
            continue  # a half-written observation: wait for the next scrape
        family.add_metric(list(key), buckets=buckets, sum_value=data["sum"])
    return family
