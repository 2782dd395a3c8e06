"""The metrics the worker and scheduler processes keep in Redis, for the web's ``/metrics``.

Workers run on other machines than the web (Heroku-style dynos), so they cannot share
prometheus_client's multiprocess directory; instead every worker adds to one Redis hash
(HINCRBY / HINCRBYFLOAT, atomic across any number of workers) and whichever web process is
scraped reads it back in one round trip. A field is a compact JSON ``[name, [[label, value],
...]]``; a histogram keeps Prometheus's cumulative ``_bucket`` fields, ``_sum`` and ``_count``.

Org labels are bounded: the first ``LOOM_METRICS_MAX_ORGS`` orgs seen get their own label, in
one script with the counter (``app/store/lua/metrics_add_by_org.lua``) so two workers cannot
both take the last place; every later org counts under ``_other``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import redis

from app.store import keys
from app.store.lua import script
from app.store.replies import text
from app.store.script_interfaces import METRICS_ADD_BY_ORG

if TYPE_CHECKING:
    from app.store.services import StoreServices

OTHER_ORG = "_other"

PASS_DURATION_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

Labels = tuple[tuple[str, str], ...]

log = logging.getLogger("loom.metrics")


def field_name(name: str, labels: Mapping[str, str] | Labels = ()) -> str:
    pairs = sorted(labels.items() if isinstance(labels, Mapping) else labels)
    return json.dumps([name, [list(pair) for pair in pairs]], separators=(",", ":"),
                      ensure_ascii=False)


def parse_field(field: str) -> tuple[str, Labels]:
    name, pairs = json.loads(field)
    return name, tuple((str(k), str(v)) for k, v in pairs)


class JobMetricsStore:
    def __init__(self, services: StoreServices) -> None:
        self.redis = services.redis
        self.max_orgs = int(services.settings.metrics_max_orgs)
        self._add_by_org = script(self.redis, "metrics_add_by_org")

    def add(self, name: str, labels: Mapping[str, str] | None = None, amount: float = 1) -> None:
        field = field_name(name, labels or {})
        if float(amount).is_integer():
            self.redis.hincrby(keys.job_metrics(), field, int(amount))
        else:
            self.redis.hincrbyfloat(keys.job_metrics(), field, amount)

    def add_many(self, counts: Iterable[tuple[str, Mapping[str, str], int]]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for name, labels, amount in counts:
            if amount:
                pipe.hincrby(keys.job_metrics(), field_name(name, labels), amount)
        pipe.execute()

    def observe(self, name: str, labels: Mapping[str, str], value: float,
                buckets: Sequence[float]) -> None:
        """One histogram observation: every bucket at or above it, the sum and the count."""
        pipe = self.redis.pipeline(transaction=True)
        key = keys.job_metrics()
        for bound in (*buckets, math.inf):
            if value <= bound:
                le = "+Inf" if bound == math.inf else repr(float(bound))
                pipe.hincrby(key, field_name(name + "_bucket", {**labels, "le": le}), 1)
        pipe.hincrbyfloat(key, field_name(name + "_sum", labels), value)
        pipe.hincrby(key, field_name(name + "_count", labels), 1)
        pipe.execute()

    def add_by_org(self, org: str, counts: Mapping[str, int]) -> str:
        """Add org-labelled counters; answers the label used (the org, or ``_other``)."""
        counters: list[str | int] = []
        for name, amount in counts.items():
            if amount:
                counters += [field_name(name, {"org": org}),
                             field_name(name, {"org": OTHER_ORG}), int(amount)]
        if not counters:
            return org
        own = self._add_by_org(*METRICS_ADD_BY_ORG.ordered(
            {"metrics": keys.job_metrics(), "orgs": keys.job_metrics_orgs()},
            {"cap": self.max_orgs, "org": org}, more_args=counters))
        return org if own else OTHER_ORG

    def read(self) -> dict[tuple[str, Labels], float]:
        raw = self.redis.hgetall(keys.job_metrics())
        values: dict[tuple[str, Labels], float] = {}
        for field, value in raw.items():
            try:
                values[parse_field(text(field))] = float(value)
            except (ValueError, TypeError):
                continue
        return values


def record_pass(services: StoreServices, pass_name: str, seconds: float,
                build_outcomes: Iterable[str] = (), full: bool = False) -> None:
    """Count a pass that ran, its duration, its builds by outcome, and whether it handed out
    as many users as its cap (``full``).

    Best effort: the pass's work is written already, so a Redis error here is logged, never
    raised (RQ would mark a finished pass failed).
    """
    store = services.store(JobMetricsStore)
    outcomes: dict[str, int] = {}
    for outcome in build_outcomes:
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    try:
        store.add_many([("loom_passes_total", {"pass": pass_name}, 1),
                        ("loom_passes_full_total", {"pass": pass_name}, int(full))]
                       + [("loom_builds_total", {"outcome": o}, n) for o, n in outcomes.items()])
        store.observe("loom_pass_duration_seconds", {"pass": pass_name}, seconds,
                      PASS_DURATION_BUCKETS)
    except redis.RedisError as error:
        log.warning("metrics: could not count a %s pass: %s", pass_name, error)
