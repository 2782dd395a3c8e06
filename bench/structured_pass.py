"""The structured_profile pass: its cost grows with the changed users, not with all users.

    .venv/bin/python bench/structured_pass.py [--users 10000] [--small 1000]

What one run does:

1. Starts its own redis-server on a free loopback port (append-only off), unless REDIS_URL is
   set. With REDIS_URL it writes under namespaces ``bench-sp-<run>-<population>``, resets the
   server's statistics (CONFIG RESETSTAT) before every measured pass and takes the
   structured_profile worker lease: point it at a scratch server with no worker running.
2. Starts the scripted model server of the tests (``tests/support/model_server.py``) on
   loopback. It answers at once with a profile whose ``preferred_name`` is the first fact it was
   sent, so a changed fact gives a new profile and a real write.
3. For each population (``--small`` users, then ``--users`` users), in a namespace of its own
   whose schema is set (the previous population's schema is cleared, so a pass sees one
   namespace): seeds every user with 2 or 3 facts through ``MemoryStore.set`` (the same Lua
   script an API write runs), from ``--threads`` threads; then runs real passes
   (``jobs.structured_profile.run_pass``, ``--build-batch`` users a pass) until every user is
   built, timed and counted as a phase of its own.
4. Then measures, with ``--max-users-per-pass`` users a pass (200) and the seed's cooldown and
   scan age (600 s) on a frozen clock moved past both before each case: an idle pass (nobody
   changed), and the passes that drain 1% and 10% of the users changed (one fact rewritten
   each). Each pass: Redis commands (``INFO commandstats``, which also counts the commands a
   script runs inside Redis), the commands and round trips the worker's Redis clients sent
   (counted in the connection: one round trip per request written, a pipeline is one), the
   server's read events, wall time and model calls.
5. Prints a table, the commands of the 1%-changed pass at the large population by name, the
   ratios between the populations, and a one-line verdict: an idle pass must cost about the same
   at both populations, a pass that drains the same number of changed users must cost about the
   same at both, and the cost per changed user must not grow with the changed users.

Passes are called directly, not as RQ jobs, so they build in this process (bench/fanout.py
measures the fan-out to RQ workers) and the model calls are in the wall time; the scripted
model answers over loopback HTTP in a thread of this process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from app.clock import FrozenClock  # noqa: E402
from app.local import RedisServerProcess  # noqa: E402
from app.services import Services  # noqa: E402
from app.settings import load_settings  # noqa: E402
from app.store import keys  # noqa: E402
from app.store.memory import Content, Location, MemoryStore  # noqa: E402
from app.store.profile_schema import ProfileSchemaStore  # noqa: E402
from bench import results  # noqa: E402
from jobs.structured_profile import run_pass  # noqa: E402
from tests.support.model_server import ScriptedModelServer  # noqa: E402

ORG = "default"
AGENT = "chat"
HOLDER = "bench:structured_pass"
SCHEMA = {
    "type": "object",
    "properties": {
        "preferred_name": {"type": "string", "description": "What the user asks to be called"},
        "timezone": {"type": "string", "description": "IANA time zone, e.g. Europe/Berlin"},
        "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 5,
                      "description": "Languages they speak"},
    },
}
CHANGED_FRACTIONS = (0.0, 0.01, 0.10)
# Moved before each measured case: past the cooldown and the scan age (both 600 s), so the
# changes are due and the first pass scans.
SETTLE_SECONDS = 601
# Between the passes of one drain, as the scheduler would (the interval, 60 s).
PASS_GAP_SECONDS = 60
# Verdict bounds: "about the same" is within this factor either way.
SAME_FACTOR = 1.5


# --- counting what the worker's clients send --------------------------------------------------


class Tally:
    """Requests the worker's Redis clients wrote (round trips) and the commands in them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.round_trips = 0
        self.commands = 0

    def add(self, round_trips: int = 0, commands: int = 0) -> None:
        with self.lock:
            self.round_trips += round_trips
            self.commands += commands

    def take(self) -> tuple[int, int]:
        with self.lock:
            out = (self.round_trips, self.commands)
            self.round_trips = self.commands = 0
            return out


TALLY = Tally()


class CountingConnection(redis.Connection):
    """A redis-py connection that counts what it writes: each ``send_packed_command`` is one
    request the client then waits on (a pipeline packs all its commands into one)."""

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        TALLY.add(round_trips=1)
        super().send_packed_command(command, check_health)

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        TALLY.add(commands=1)
        super().send_command(*args, **kwargs)

    def pack_commands(self, commands: Any) -> Any:
        commands = list(commands)
        TALLY.add(commands=len(commands))
        return super().pack_commands(commands)


def counting_client(url: str, decode: bool) -> redis.Redis:
    pool = redis.ConnectionPool.from_url(
        url, connection_class=CountingConnection, decode_responses=decode
    )
    return redis.Redis(connection_pool=pool)


# --- one measured pass ------------------------------------------------------------------------


@dataclass
class Figures:
    passes: int = 0
    commands: int = 0  # server side, INFO commandstats (with the commands scripts run)
    client_commands: int = 0
    round_trips: int = 0
    server_reads: int = 0
    wall: float = 0.0
    model_calls: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    by_command: Counter[str] = field(default_factory=Counter)

    def add(self, other: Figures) -> None:
        self.passes += other.passes
        self.commands += other.commands
        self.client_commands += other.client_commands
        self.round_trips += other.round_trips
        self.server_reads += other.server_reads
        self.wall += other.wall
        self.model_calls += other.model_calls
        self.outcomes.update(other.outcomes)
        self.by_command.update(other.by_command)

    @property
    def built(self) -> int:
        return sum(self.outcomes.values())


# The measuring client's own commands, left out of every figure.
PROBE_COMMANDS = {"config", "info"}


class Meter:
    def __init__(self, probe: redis.Redis) -> None:
        self.probe = probe

    def measure(self, work: Callable[[], dict[str, Any]]) -> tuple[Figures, dict[str, Any]]:
        self.probe.config_resetstat()
        TALLY.take()
        began = time.perf_counter()
        result = work()
        wall = time.perf_counter() - began
        round_trips, client_commands = TALLY.take()
        info = self.probe.info("all")
        by_command: Counter[str] = Counter()
        for name, stats in info.items():
            if name.startswith("cmdstat_") and isinstance(stats, dict):
                command = name[len("cmdstat_"):]
                if command.split("|")[0] not in PROBE_COMMANDS:
                    by_command[command] = int(stats["calls"])
        figures = Figures(
            passes=1,
            commands=sum(by_command.values()),
            client_commands=client_commands,
            round_trips=round_trips,
            # Less the INFO's own read (CONFIG RESETSTAT's came before the reset).
            server_reads=max(0, int(info.get("total_reads_processed", 0)) - 1),
            wall=wall,
            model_calls=int(result.get("model_calls", 0)),
            outcomes=Counter(outcome for _ns, _user, outcome in result.get("built", [])),
            by_command=by_command,
        )
        return figures, result


# --- the population ---------------------------------------------------------------------------


def user_id(i: int) -> str:
    return f"u{i:06d}"


def fact_location(namespace: str, i: int, key: str) -> Location:
    return Location(ORG, namespace, user_id(i), AGENT, "-", key)


def facts_of(i: int) -> list[tuple[str, str]]:
    """Two or three facts; every third user also has a language."""
    facts = [("name", f"Call me User {i}"), ("tz", "Lives in Europe/Berlin")]
    if i % 3 == 0:
        facts.append(("lang", "Speaks English and German"))
    return facts


def write_fact(memory: MemoryStore, namespace: str, i: int, key: str, text: str) -> None:
    memory.set(
        fact_location(namespace, i, key),
        Content(memory_type="semantic", value=text, actor=AGENT),
        written_by=AGENT,
    )


def seed(memory: MemoryStore, namespace: str, users: int, threads: int) -> int:
    """Every user's facts, written from ``threads`` threads; answers how many facts."""

    def one_slice(start: int) -> int:
        written = 0
        for i in range(start, users, threads):
            for key, text in facts_of(i):
                write_fact(memory, namespace, i, key, text)
                written += 1
        return written

    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(one_slice, range(threads)))


def model_answer(body: Any) -> dict[str, Any]:
    """The first fact sent (most confident, newest) as the preferred name."""
    text = body["messages"][-1]["content"]
    first = json.loads(text.split("\n")[1])
    return {"preferred_name": str(first["fact"])[:80], "timezone": None, "languages": None}


# --- the bench --------------------------------------------------------------------------------


@dataclass
class Case:
    population: int
    changed: int
    first: Figures
    drain: Figures
    idle_after: Figures
    change_seconds: float
    walls: list[float] = field(default_factory=list)


class Bench:
    def __init__(self, args: argparse.Namespace, redis_url: str, workdir: Path,
                 model: ScriptedModelServer) -> None:
        self.args = args
        self.redis_url = redis_url
        self.clock = FrozenClock()
        self.probe = redis.Redis.from_url(redis_url, decode_responses=True)
        self.meter = Meter(self.probe)
        self.run = secrets.token_hex(3) if os.environ.get("REDIS_URL") else "own"
        client = counting_client(redis_url, decode=True)
        queue_client = counting_client(redis_url, decode=False)

        def services(max_users: int) -> Services:
            settings = load_settings(environ={}, overrides={
                "redis_url": redis_url,
                "secret_key": secrets.token_hex(32),
                "data_dir": str(workdir / "loom"),
                "llm_base_url": model.base_url,
                "llm_model": "scripted-model",
                "llm_timeout_seconds": 10.0,
                "structured_profile_max_users_per_pass": max_users,
            })
            return Services(settings, redis_client=client, clock=self.clock,
                            queue_redis=queue_client)

        self.build_svc = services(args.build_batch)
        self.pass_svc = services(args.max_users_per_pass)
        self.memory = self.pass_svc.store(MemoryStore)
        self.rng = random.Random(args.seed)
        self.edition = 0

    def change_and_drain(self, namespace: str, population: int, changed: int) -> Case:
        """Rewrite one fact of ``changed`` users picked at random, then drain them."""
        chosen = sorted(self.rng.sample(range(population), changed))
        self.clock.advance(SETTLE_SECONDS)
        self.edition += 1
        began = time.perf_counter()
        for i in chosen:
            write_fact(self.memory, namespace, i, "name", f"Call me U{i} (edition {self.edition})")
        change_seconds = time.perf_counter() - began
        self.clock.advance(SETTLE_SECONDS)
        first, drain, idle = self.drain(self.pass_svc)
        if changed == 0:
            drain = Figures()
        built = drain.outcomes.get("built", 0)
        if built != changed or self.changed_left(namespace) != 0:
            raise RuntimeError(
                f"{population}/{changed}: built {dict(drain.outcomes)}, "
                f"{self.changed_left(namespace)} still listed"
            )
        return Case(population, changed, first, drain, idle, change_seconds)

    def namespace(self, population: int) -> str:
        return f"bench-sp-{self.run}-{population}"

    def changed_left(self, namespace: str) -> int:
        return int(self.probe.zcard(keys.profile_changed_users(ORG, namespace)))

    def drain(self, svc: Services) -> tuple[Figures, Figures, Figures]:
        """Passes until one builds nobody: (the first pass, every pass that built someone,
        the closing pass that found nobody behind)."""
        first: Figures | None = None
        total = Figures()
        while True:
            figures, result = self.meter.measure(
                lambda: run_pass(svc, holder=HOLDER, force=True)
            )
            if "skipped" in result:
                raise RuntimeError(f"pass skipped: {result['skipped']}")
            if first is None:
                first = figures
            if not result["built"]:
                return first, total, figures
            total.add(figures)
            self.clock.advance(PASS_GAP_SECONDS)

    def population(self, population: int, previous: str | None) -> tuple[list[Case], dict]:
        args = self.args
        namespace = self.namespace(population)
        schemas = self.pass_svc.store(ProfileSchemaStore)
        if previous is not None:
            schemas.clear(ORG, previous)
        others = [m for m in schemas.namespaces() if m != (ORG, namespace)]
        if others:
            print(f"  note: other namespaces have a schema and take part in the passes: {others}")
        schemas.set(ORG, namespace, SCHEMA, "bench")

        began = time.perf_counter()
        facts = seed(self.memory, namespace, population, args.threads)
        seed_seconds = time.perf_counter() - began
        print(f"  seeded {population} users, {facts} facts in {seed_seconds:.1f}s "
              f"({facts / seed_seconds:.0f} writes/s, {args.threads} threads)")

        self.clock.advance(SETTLE_SECONDS)
        began = time.perf_counter()
        _first, build, _idle = self.drain(self.build_svc)
        build_seconds = time.perf_counter() - began
        built_users = int(self.probe.scard(keys.structured_users(ORG, namespace)))
        print(f"  initial build: {build.passes} passes of up to {args.build_batch}, "
              f"{build.built} builds {dict(build.outcomes)}, {build.model_calls} model calls, "
              f"{built_users} users with a build record, {self.changed_left(namespace)} still "
              f"listed as changed; {build_seconds:.1f}s "
              f"({build_seconds / max(1, build.built) * 1000:.2f} ms a user), "
              f"{build.commands} commands ({build.commands / max(1, build.built):.1f} a user)")
        if built_users != population or build.outcomes.get("built", 0) != population:
            raise RuntimeError("the initial build did not build every user")
        summary = {"seed_seconds": seed_seconds, "facts": facts, "build": build,
                   "build_seconds": build_seconds}

        cases = []
        for fraction in CHANGED_FRACTIONS:
            changed = round(population * fraction)
            reps = []
            for _ in range(args.repeats):
                reps.append(self.change_and_drain(namespace, population, changed))
            # Commands and round trips are the same in every repetition; wall time is not, so
            # the repetition with the median wall time stands for the case.
            reps.sort(key=lambda c: (c.drain if changed else c.idle_after).wall)
            case = reps[len(reps) // 2]
            case.walls = [(c.drain if changed else c.idle_after).wall for c in reps]
            cases.append(case)
            spread = ", ".join(f"{w * 1000:.0f}" for w in case.walls)
            print(f"  {changed:>5} changed: {case.drain.passes} passes built "
                  f"{case.drain.outcomes.get('built', 0)}, then an idle pass; "
                  f"{args.repeats} repetitions, wall ms {spread}")
        return cases, summary


@contextlib.contextmanager
def redis_for_bench(workdir: Path) -> Iterator[str]:
    given = os.environ.get("REDIS_URL")
    if given:
        yield given
        return
    server = RedisServerProcess(workdir / "redis", appendonly=False).start()
    try:
        yield server.url
    finally:
        server.stop()


# --- the report -------------------------------------------------------------------------------


def row(label: str, population: int, changed: int, f: Figures, per_user: bool = False) -> str:
    per_pass = max(1, f.passes)
    per_changed = f"{f.commands / changed:9.1f}" if per_user and changed else f"{'-':>9}"
    return (f"  {label:<11}{population:>7}{changed:>8}{f.passes:>7}{f.commands / per_pass:>10.0f}"
            f"{f.client_commands / per_pass:>10.0f}{f.round_trips / per_pass:>8.0f}"
            f"{f.server_reads / per_pass:>8.0f}{f.wall * 1000 / per_pass:>10.1f}"
            f"{f.model_calls:>7}{per_changed}")


def ratio(a: float, b: float) -> float:
    return a / b if b else float("inf")


def report(cases: list[Case]) -> tuple[bool, str]:
    print("\nPer pass (commands: INFO commandstats, with those scripts run; client cmds and "
          "round trips: what the worker's clients sent; srv reads: the server's read events)")
    print(f"  {'case':<11}{'users':>7}{'changed':>8}{'passes':>7}{'commands':>10}"
          f"{'client':>10}{'rtrips':>8}{'reads':>8}{'wall ms':>10}{'model':>7}{'cmd/chg':>9}")
    for c in cases:
        if c.changed == 0:
            print(row("idle", c.population, 0, c.idle_after))
            continue
        print(row("1st pass", c.population, c.changed, c.first))
        print(row("drain/pass", c.population, c.changed, c.drain, per_user=True))
        print(row("idle after", c.population, 0, c.idle_after))
    print("  (1st pass: the first pass after the changes; drain/pass: the mean of the passes "
          "that built someone, cmd/chg over all of them; idle after: the pass that found "
          "nobody behind)")

    by = {(c.population, c.changed): c for c in cases}
    small, large = sorted({c.population for c in cases})
    checks: list[tuple[str, float, bool]] = []

    def same(name: str, a: float, b: float) -> None:
        r = ratio(a, b)
        checks.append((name, r, 1 / SAME_FACTOR <= r <= SAME_FACTOR))

    idle_large = by[(large, 0)].idle_after
    idle_small = by[(small, 0)].idle_after
    print("\nRatios")
    same(f"idle pass commands, {large} vs {small} users", idle_large.commands,
         idle_small.commands)
    same(f"idle pass round trips, {large} vs {small} users", idle_large.round_trips,
         idle_small.round_trips)
    # The same number of changed users at both populations: 1% of the large one, 10% of the
    # small one when the large is ten times the small.
    shared = sorted({c.changed for c in cases if c.population == large and c.changed}
                    & {c.changed for c in cases if c.population == small and c.changed})
    for n in shared:
        a, b = by[(large, n)].drain, by[(small, n)].drain
        same(f"{n} changed, drain commands, {large} vs {small} users", a.commands, b.commands)
        same(f"{n} changed, drain round trips, {large} vs {small} users", a.round_trips,
             b.round_trips)
        same(f"{n} changed, drain wall time, {large} vs {small} users", a.wall, b.wall)
    for population in (small, large):
        few, many = sorted(c.changed for c in cases if c.population == population and c.changed)
        a, b = by[(population, many)].drain, by[(population, few)].drain
        # Less what any pass costs (an idle pass's commands), so a handful of changed users
        # is not dominated by that fixed part.
        fixed = by[(population, 0)].idle_after.commands
        same(f"commands per changed user beyond the fixed pass cost, {many} vs {few} changed "
             f"of {population}",
             (a.commands - a.passes * fixed) / many, (b.commands - b.passes * fixed) / few)
        print(f"  drain commands, {many} vs {few} changed of {population}: "
              f"{ratio(a.commands, b.commands):.2f}x for {many / few:.0f}x the changed users")
    outside = f"  <- outside 1/{SAME_FACTOR:.1f}..{SAME_FACTOR:.1f}"
    for name, r, ok in checks:
        print(f"  {name}: {r:.2f}{'' if ok else outside}")
    failed = [name for name, _r, ok in checks if not ok]
    if failed:
        return False, "pass cost grows with something other than the changed users: " + "; ".join(
            failed)
    return True, (f"pass cost follows the changed users: an idle pass costs the same at {small} "
                  f"and {large} users, the same changed users cost the same at both, and the "
                  "cost per changed user holds as the changed users grow")


def print_breakdown(case: Case) -> None:
    f = case.first
    print(f"\nCommands of the first pass, {case.changed} changed of {case.population} users "
          f"(per changed user in brackets)")
    for command, calls in f.by_command.most_common():
        print(f"  {command:<14}{calls:>8}  ({calls / case.changed:.2f})")
    idle = f"{case.idle_after.commands} commands: " + ", ".join(
        f"{c} {n}" for c, n in case.idle_after.by_command.most_common())
    print(f"  the idle pass after it: {idle}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=10_000, help="the large population (10000)")
    parser.add_argument("--small", type=int, default=1_000, help="the small population (1000)")
    parser.add_argument("--max-users-per-pass", type=int, default=200,
                        help="LOOM_STRUCTURED_PROFILE_MAX_USERS_PER_PASS of the measured passes")
    parser.add_argument("--build-batch", type=int, default=2000,
                        help="max users per pass of the initial build (2000)")
    parser.add_argument("--threads", type=int, default=8, help="seeding threads (8)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="repetitions of each measured case; the median wall time is shown")
    parser.add_argument("--seed", type=int, default=7, help="which users change (7)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when the verdict fails")
    args = parser.parse_args(argv)
    if args.small >= args.users:
        parser.error("--small must be below --users")

    started = time.monotonic()
    cases: list[Case] = []
    with tempfile.TemporaryDirectory(prefix="loom-bench-") as tmp:
        workdir = Path(tmp)
        with redis_for_bench(workdir) as redis_url, \
                ScriptedModelServer(default=model_answer) as model:
            given = bool(os.environ.get("REDIS_URL"))
            print("redis: " + ("REDIS_URL (namespaces bench-sp-*, statistics reset, takes the "
                               "structured_profile lease)" if given
                               else "own redis-server on a free port, appendonly off"))
            bench = Bench(args, redis_url, workdir, model)
            with redis.Redis.from_url(redis_url) as info_client:
                redis_name = results.server_name(info_client.info("server"))
            at_start = results.machine(redis_name)
            print(f"measured passes: up to {args.max_users_per_pass} users a pass, cooldown and "
                  f"scan age 600 s (frozen clock moved {SETTLE_SECONDS} s before each case, "
                  f"{PASS_GAP_SECONDS} s between passes); changed fractions "
                  + ", ".join(f"{f:.0%}" for f in CHANGED_FRACTIONS))
            previous = None
            summaries = {}
            for population in (args.small, args.users):
                print(f"\nPopulation {population}")
                found, summaries[population] = bench.population(population, previous)
                cases.extend(found)
                previous = bench.namespace(population)
            bench.pass_svc.store(ProfileSchemaStore).clear(ORG, previous)
            requests = len(model.completion_requests)

    print("\nSetup (not part of the pass figures)")
    for population, s in summaries.items():
        b = s["build"]
        print(f"  {population} users: seeding {s['facts']} facts {s['seed_seconds']:.1f}s; "
              f"initial build {b.passes} passes, {b.built} users, {s['build_seconds']:.1f}s, "
              f"{b.commands} commands, {b.round_trips} round trips, {b.model_calls} model calls")
    ok, verdict = report(cases)
    large_one = next(c for c in cases if c.population == args.users and c.changed
                     and c.changed == round(args.users * 0.01))
    print_breakdown(large_one)
    print(f"\nmodel requests served in all: {requests}; total {time.monotonic() - started:.0f}s")
    print(("OK: " if ok else "NOT OK: ") + verdict)
    figures: dict[str, str] = {}
    for c in cases:
        per_pass = max(1, c.drain.passes)
        if c.changed == 0:
            figures[f"{c.population} users, none changed: the idle pass"] = (
                f"{c.idle_after.commands} commands, {c.idle_after.round_trips} round trips")
            continue
        figures[f"{c.population} users, {c.changed} changed: the passes that rebuild them"] = (
            f"{c.drain.passes} passes, {c.drain.commands / per_pass:,.0f} commands and "
            f"{c.drain.round_trips / per_pass:,.0f} round trips a pass, "
            f"{c.drain.commands / c.changed:.1f} commands a changed user, "
            f"{c.drain.wall * 1000 / per_pass:,.1f} ms a pass")
    figures["verdict"] = ("OK: " if ok else "NOT OK: ") + verdict
    results.record(
        "structured_pass", f"Structured-profile passes against a scripted model on loopback, "
        f"{args.small:,} and {args.users:,} users seeded and built, then "
        + ", ".join(f"{f:.0%}" for f in CHANGED_FRACTIONS) + " of them changed; Redis commands "
        "(INFO commandstats), round trips and wall time of the passes that rebuild them, "
        f"up to {args.max_users_per_pass} users a pass.", figures, redis_name, at_start)
    return 1 if args.strict and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
