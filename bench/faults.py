"""bench: what writers meet when Redis, a gunicorn worker and the gunicorn master are killed
and when Redis stalls.

Starts the embedded server (append-only, every write fsynced: ``appendfsync always``) and the
Procfile's web line on a free loopback port, then runs writers through HTTP for the whole run,
half of them without an ``Idempotency-Key`` (one try each) and half with one (retried with the
same key, honouring ``Retry-After``, until an answer settles: 200, or a refusal that is not "try
again"). Each write goes to one of four planes in turn, each applied-count readable afterwards:
a ``working_memory.append`` of a token of its own (working memory), a ``profile.append`` of a
token of its own (profile sections), a ``memory.set`` of a key of its own (facts) and a
``PUT /v1/agent-state`` (merge_by_key) to a conversation scope of its own (agent state).
Meanwhile, ``--kills`` times each and ``--gap`` seconds apart: it kills with SIGKILL Redis
(restarted at once on the same port and data), a gunicorn worker (its master starts another)
and the gunicorn master (a new one started at once, as a supervisor would), and stalls Redis
past the web's 2 s socket timeout (SIGSTOP for 3 to 6 s, then SIGCONT).

After the run every write is looked up: a block's or a section's tokens (counted in its
content), a fact's versions (one per applied ``memory.set``), a state's version (one per
applied write), and each user's recall index against the user's facts. It prints:

- acknowledged, lost (acknowledged, absent), duplicated (applied more than once),
  refused-but-present (never acknowledged, applied all the same) and outcome-unknown (a keyed
  write answered ``IDEMPOTENCY_OUTCOME_UNKNOWN``), keyed and unkeyed apart;
- per plane: acknowledged, lost, applied twice, outcome-unknown, and the keyed writes' retry
  wait (from the first failed try to the settled answer: p50, max);
- index drift: facts without a recall entry plus entries without a fact;
- per target, the keyed writes a kill made retry, their wait from the first failed try to the
  settled answer (p50, max), and the time each kill took to recover: for the master, from the
  new master's start to the first ``/readyz`` 200 answered by one of its own workers (the dead
  master's workers still serve until they stop), beside a cold start of the same command;
  for Redis and a worker, from the kill to the next ``/readyz`` 200.

It also counts the workers of a killed master still running at the end (each holds a share of
the port and answers none of it), and kills them. It exits 1 when a write was lost, applied
twice or answered outcome-unknown, or the index drifted, and with ``--strict`` also when a
restart took longer than 3 s or a killed master's worker never stopped.

    .venv/bin/python bench/faults.py [--kills 3] [--writers 4] [--keyed 4] [--gap 4]
        [--targets redis,worker,master,stall] [--strict]
"""

from __future__ import annotations

import argparse
import http.client
import os
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.local import RedisServerProcess, die_with_parent, free_port  # noqa: E402
from app.store import keys  # noqa: E402

ORG = "default"  # auth off: every call is the default org's
NAMESPACE = "faults"
AGENT = "writer"
RUN_ID = "r"
TOKENS_PER_BLOCK = 300  # lines of up to 10 characters: well under a block's default cap
TOKENS_PER_SECTION = 500  # well under a profile section's default cap (8192)
# The write of each plane, in the order a writer takes them.
PLANES = ("working_memory", "profile", "facts", "agent_state")
STATE_TYPE = {
    "type": "faults_state", "ownership": "agent", "fields": {"step": {"type": "string"}},
    "agent_state": {"scope": "conversation", "max_bytes": 4096, "write": "both"},
}
STALL_SECONDS = (3.0, 6.0)  # past the web's 2 s socket timeout
# Answers that say "nothing settled, ask again".
RETRY_STATUSES = {409, 429, 500, 502, 503, 504}
OUTCOME_UNKNOWN = "IDEMPOTENCY_OUTCOME_UNKNOWN"
SETTLED_409 = {OUTCOME_UNKNOWN}
# A write sent this long before a kill counts as that kill's (Redis's fsync window and more).
WINDOW_BEFORE = 3.0
RESTART_TARGET = 3.0  # seconds from a new master's start to its first /readyz 200


@dataclass
class Write:
    writer: int
    keyed: bool
    plane: str  # one of PLANES
    name: str  # the token appended, the fact's key, or the state's conversation
    block: str = ""  # the block or the section appended to
    outcome: str = "refused"  # "acknowledged", "refused", "unknown" or "unsettled"
    sent_at: float = 0.0
    applied: int = 0  # times found in Redis after the run
    refusal: str = ""  # the status of a refusal, or "no answer"
    tries: int = 0
    first_failure: float | None = None
    settled_at: float | None = None


@dataclass
class Run:
    url: str
    writes: list[Write] = field(default_factory=list)
    orphans: list[int] = field(default_factory=list)  # the workers of every master killed
    # (target, when it was killed, seconds to recover)
    kills: list[tuple[str, float, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)

    def record(self, write: Write) -> None:
        with self.lock:
            self.writes.append(write)


def user_of(writer: int) -> str:
    return f"w{writer}"


def identity(writer: int) -> dict[str, str]:
    return {"namespace": NAMESPACE, "agent": AGENT, "user_id": user_of(writer)}


def retry_after(answer: requests.Response | None) -> float:
    if answer is None:
        return 0.5
    try:
        return min(float(answer.headers.get("Retry-After", "1")), 5.0)
    except ValueError:
        return 1.0


def settled(answer: requests.Response) -> bool:
    if answer.status_code not in RETRY_STATUSES:
        return True
    if answer.status_code == 409:
        try:
            code = (answer.json().get("error") or {}).get("code")
        except ValueError:
            return False
        return code in SETTLED_409
    return False


def outcome_unknown(answer: requests.Response) -> bool:
    try:
        return answer.status_code == 409 and (answer.json().get("error") or {}).get(
            "code") == OUTCOME_UNKNOWN
    except ValueError:
        return False


# (HTTP method, path) of each plane's write.
REQUESTS = {
    "working_memory": ("POST", "/v1/working_memory.append"),
    "profile": ("POST", "/v1/profile.append"),
    "facts": ("POST", "/v1/memory.set"),
    "agent_state": ("PUT", "/v1/agent-state"),
}


def send(run: Run, session: requests.Session, write: Write, body: dict[str, Any],
         settle_limit: float) -> None:
    method, path = REQUESTS[write.plane]
    headers = {"Idempotency-Key": str(uuid.uuid4())} if write.keyed else {}
    write.sent_at = time.monotonic()
    while True:
        write.tries += 1
        answer: requests.Response | None = None
        try:
            answer = session.request(method, f"{run.url}{path}", json=body, headers=headers,
                                     timeout=5)
        except requests.RequestException:
            session.close()
        if answer is not None and answer.status_code == 200:
            write.outcome = "acknowledged"
        elif answer is not None and outcome_unknown(answer):
            write.outcome = "unknown"
        elif answer is not None and settled(answer):
            write.outcome = "refused"
            write.refusal = str(answer.status_code)
        else:
            now = time.monotonic()
            write.first_failure = write.first_failure or now
            if not write.keyed:
                write.outcome = "refused"
                write.refusal = "no answer" if answer is None else str(answer.status_code)
                # A client that was refused waits a little before its next write.
                time.sleep(0.1)
                return
            if now - write.first_failure > settle_limit:
                write.outcome = "unsettled"
                return
            time.sleep(retry_after(answer))
            continue
        if write.first_failure is not None:
            write.settled_at = time.monotonic()
        return


def writer(run: Run, number: int, keyed: bool, settle_limit: float) -> None:
    session = requests.Session()
    n = 0
    while not run.stopping.is_set():
        plane = PLANES[n % len(PLANES)]
        if plane == "working_memory":
            # An append makes its block (default cap) when there is none.
            block = f"b{n // (len(PLANES) * TOKENS_PER_BLOCK)}"
            write = Write(number, keyed, plane, f"|{number}-{n}", block=block)
            body = {**identity(number), "run_id": RUN_ID, "block_key": block,
                    "addition": write.name}
        elif plane == "profile":
            section = f"s{n // (len(PLANES) * TOKENS_PER_SECTION)}"
            write = Write(number, keyed, plane, f"|{number}-{n}", block=section)
            body = {**identity(number), "label": section, "addition": write.name}
        elif plane == "facts":
            write = Write(number, keyed, plane, f"k{n}")
            body = {**identity(number), "key": write.name,
                    "value": f"fact {n} of writer {number}"}
        else:
            write = Write(number, keyed, plane, f"c{number}-{n}")
            body = {"namespace": NAMESPACE, "agent": AGENT, "mode": "merge_by_key",
                    "scope": {"kind": "conversation", "id": write.name},
                    "body": {"step": f"step {n}"}}
        send(run, session, write, body, settle_limit)
        run.record(write)
        n += 1


# --- the processes ---------------------------------------------------------------------------

def procfile_web(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """The Procfile's web line as written (the port comes from PORT)."""
    line = next(row.split(":", 1)[1] for row in (ROOT / "Procfile").read_text().splitlines()
                if row.startswith("web:"))
    command = shlex.split(line)
    with log.open("ab") as output:
        return subprocess.Popen([sys.executable, "-m", *command], cwd=ROOT, env=env,
                                stdout=output, stderr=subprocess.STDOUT,
                                preexec_fn=die_with_parent)


def children(pid: int) -> list[int]:
    """The processes ``pid`` started, whichever of its threads started them."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def server_socket_inode(port: int, client_port: int) -> str | None:
    """The inode of the server's end of a loopback connection, from /proc/net/tcp."""
    local, remote = f":{port:04X}", f":{client_port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(local) and fields[2].endswith(remote) and fields[9] != "0":
            return fields[9]
    return None


def held_by(pids: Sequence[int], inode: str) -> bool:
    target = f"socket:[{inode}]"
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except FileNotFoundError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return True
            except OSError:
                continue
    return False


def ready(port: int, master: int | None = None) -> bool:
    """``/readyz`` answered 200, with ``master`` by one of its workers (the connection's server
    end open in it: a worker of a dead master answers too, and closes as it stops)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=0.5)
    try:
        connection.request("GET", "/readyz")
        assert connection.sock is not None
        client_port = connection.sock.getsockname()[1]
        answer = connection.getresponse()
        # Looked up while the connection is open: the answer came from its server end.
        inode = server_socket_inode(port, client_port) if master is not None else None
        answer.read()
        if answer.status != 200:
            return False
        if master is None:
            return True
        return inode is not None and held_by(children(master), inode)
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def wait_ready(port: int, since: float, master: int | None = None,
               limit: float = 60.0) -> float:
    while time.monotonic() - since < limit:
        if ready(port, master):
            return time.monotonic() - since
        time.sleep(0.02)
    raise RuntimeError(f"no /readyz 200 within {limit:g} s")


# --- the checks ------------------------------------------------------------------------------

def _post(session: requests.Session, url: str, body: dict[str, Any]) -> dict[str, Any]:
    for attempt in range(3):
        try:
            answer = session.post(url, json=body, timeout=10)
            break
        except requests.RequestException:
            if attempt == 2:
                raise
    answer.raise_for_status()
    found: dict[str, Any] = answer.json()
    return found


def look_up(run: Run, client: redis.Redis, writers: int) -> dict[str, Any]:
    contents: dict[tuple[str, int, str], str] = {}
    state_versions: dict[str, int] = {}
    with requests.Session() as session:
        for plane, number, block in sorted({(w.plane, w.writer, w.block)
                                            for w in run.writes if w.block}):
            if plane == "working_memory":
                body = {**identity(number), "run_id": RUN_ID, "block_key": block}
                found = _post(session, f"{run.url}/v1/working_memory.get", body)
                contents[(plane, number, block)] = found.get("content", "")
            else:
                body = {**identity(number), "key": block}
                found = _post(session, f"{run.url}/v1/memory.get", body)
                contents[(plane, number, block)] = (found.get("memory") or {}).get("value", "")
        for w in run.writes:
            if w.plane == "agent_state":
                found = _post(session, f"{run.url}/v1/agent-state/read", {
                    "namespace": NAMESPACE, "agent": AGENT,
                    "scope": {"kind": "conversation", "id": w.name}})
                state_versions[w.name] = int(found.get("version", 0))
    lines = {block: Counter(content.split("\n")) for block, content in contents.items()}
    pipe = client.pipeline(transaction=False)
    sets = [w for w in run.writes if w.plane == "facts"]
    for w in sets:
        # The version order lists every version, the current one too (the versions hash holds
        # the earlier ones only).
        pipe.zcard(keys.memory_version_order(ORG, NAMESPACE, user_of(w.writer), AGENT, "-",
                                             w.name))
    versions = dict(zip((id(w) for w in sets), pipe.execute(), strict=True))
    figures: dict[str, Any] = {}
    for keyed in (False, True):
        side = "keyed" if keyed else "unkeyed"
        mine = [w for w in run.writes if w.keyed == keyed]
        applied = []
        for w in mine:
            if w.plane in ("working_memory", "profile"):
                # An append adds a line: a token applied twice is two lines.
                applied.append(lines[(w.plane, w.writer, w.block)].get(w.name, 0))
            elif w.plane == "facts":
                applied.append(versions[id(w)])
            else:
                applied.append(state_versions[w.name])
        pairs = list(zip(mine, applied, strict=True))
        for w, n in pairs:
            w.applied = n
        figures[side] = {
            "writes": len(mine),
            "acknowledged": sum(w.outcome == "acknowledged" for w in mine),
            "lost": sum(w.outcome == "acknowledged" and n == 0 for w, n in pairs),
            "duplicated": sum(n > 1 for _, n in pairs),
            "refused_but_present": sum(w.outcome != "acknowledged" and n > 0 for w, n in pairs),
            "refused": sum(w.outcome == "refused" for w in mine),
            "unknown": sum(w.outcome == "unknown" for w in mine),
            "unsettled": sum(w.outcome == "unsettled" for w in mine),
        }
    drift = facts_count = 0
    for number in range(writers):
        user = user_of(number)
        # The user's facts: their rows but the profile sections, which recall does not index.
        sections = {keys.memory_row(ORG, NAMESPACE, user, AGENT, "-", w.block)
                    for w in run.writes if w.plane == "profile" and w.writer == number}
        rows = client.hgetall(keys.memory_ids(ORG, NAMESPACE, user))
        facts = {memory_id for memory_id, row in rows.items() if row.decode() not in sections}
        entries = {entry for entry in client.hkeys(keys.recall_docs(ORG, NAMESPACE, user))}
        drift += len(facts ^ entries)
        facts_count += len(facts)
    figures["index_drift"] = drift
    figures["facts"] = facts_count
    return figures


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=3, help="kills of each target")
    parser.add_argument("--writers", type=int, default=4, help="writers without a key")
    parser.add_argument("--keyed", type=int, default=4, help="writers with a key")
    parser.add_argument("--gap", type=float, default=4.0, help="seconds of load between kills")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers")
    parser.add_argument("--settle-limit", type=float, default=120.0,
                        help="seconds a keyed write is retried before it counts as unsettled")
    parser.add_argument("--targets", default="redis,worker,master,stall")
    parser.add_argument("--strict", action="store_true", help="exit 1 on a restart over 3 s")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="loom-faults-"))
    server = fsync_always(RedisServerProcess(work / "redis", appendonly=True).start())
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": server.url, "PORT": str(port),
           "LOOM_DATA_DIR": str(work), "LOOM_SECRET_KEY": "faults-bench-secret",
           "WEB_CONCURRENCY": str(args.workers)}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = work / "web.log"
    run = Run(url=f"http://127.0.0.1:{port}")
    started = time.monotonic()
    master = procfile_web(env, log)
    threads: list[threading.Thread] = []
    cold_beside: list[float] = []
    try:
        cold_start = wait_ready(port, started)
        enable_agent_state(run.url)
        total = args.writers + args.keyed
        threads = [threading.Thread(target=writer,
                                    args=(run, n, n >= args.writers, args.settle_limit),
                                    daemon=True) for n in range(total)]
        for thread in threads:
            thread.start()
        for target in args.targets.split(","):
            for _ in range(args.kills):
                time.sleep(args.gap)
                at = time.monotonic()
                if target == "redis":
                    assert server.process is not None
                    server.process.kill()
                    server.process.wait()
                    fsync_always(server.start())
                    recovery = wait_ready(port, at)
                elif target == "stall":
                    assert server.process is not None
                    server.process.send_signal(signal.SIGSTOP)
                    time.sleep(random.uniform(*STALL_SECONDS))
                    server.process.send_signal(signal.SIGCONT)
                    recovery = wait_ready(port, at)
                elif target == "worker":
                    os.kill(random.choice(children(master.pid)), signal.SIGKILL)
                    recovery = wait_ready(port, at)
                else:
                    run.orphans += children(master.pid)
                    master.kill()
                    master.wait()
                    restarted = time.monotonic()
                    master = procfile_web(env, log)
                    recovery = wait_ready(port, restarted, master=master.pid)
                    # The same command's cold start under the same load, just after.
                    cold_beside.append(cold_start_beside(env, log))
                run.kills.append((target, at, recovery))
        time.sleep(args.gap)
        run.stopping.set()
        for thread in threads:
            thread.join(timeout=args.settle_limit + 30)
        # A worker of a dead master should have stopped long since: one still running holds
        # its share of the port and answers none of it. Counted, then killed, so that the
        # look-up below is answered.
        stuck = [pid for pid in run.orphans if alive(pid)]
        for pid in stuck:
            os.kill(pid, signal.SIGKILL)
        figures = look_up(run, redis.Redis.from_url(server.url), total)
        figures["stuck"] = len(stuck)
    finally:
        run.stopping.set()
        master.terminate()
        try:
            master.wait(timeout=20)
        except subprocess.TimeoutExpired:
            master.kill()
        server.stop()
    in_use = log.read_text(errors="replace").count("Connection in use")
    return report(run, figures, (cold_start, cold_beside), in_use, args)


def fsync_always(server: RedisServerProcess) -> RedisServerProcess:
    """Every write fsynced before it is answered: a kill -9 loses nothing Redis acknowledged,
    so what the bench counts is the service's own, not Redis's fsync window."""
    client = redis.Redis.from_url(server.url)
    try:
        client.config_set("appendfsync", "always")
    finally:
        client.close()
    return server


def enable_agent_state(url: str) -> None:
    """The agent-state plane's switch and type, set once before the load."""
    for op_name, body in (("features.set", {"features": {"agent_state": True}}),
                          ("object_types.set", {"types": [STATE_TYPE]})):
        answer = requests.post(f"{url}/v1/{op_name}", json={"namespace": NAMESPACE, **body},
                               timeout=10)
        answer.raise_for_status()


def cold_start_beside(env: dict[str, str], log: Path) -> float:
    """A cold start of the same command on another port, under the run's load: the baseline
    a restart is compared with on a machine whose speed the load and its neighbours set."""
    port = free_port()
    started = time.monotonic()
    baseline = procfile_web({**env, "PORT": str(port)}, log.with_name("baseline.log"))
    try:
        return wait_ready(port, started, master=baseline.pid)
    finally:
        workers = children(baseline.pid)
        baseline.terminate()
        try:
            baseline.wait(timeout=60)
        except subprocess.TimeoutExpired:
            # A worker that does not stop is the run's figure, not the baseline's: end it.
            print(f"the baseline master did not stop within 60 s; killed ({len(workers)} "
                  f"workers)", file=sys.stderr)
            for pid in workers:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
            baseline.kill()
            baseline.wait()


def report(run: Run, figures: dict[str, Any], cold_starts: tuple[float, list[float]],
           in_use: int, args: argparse.Namespace) -> int:
    print(f"{args.writers} writers without a key, {args.keyed} with one, {args.workers} "
          f"gunicorn workers; {args.kills} fault(s) of each target ({args.targets}), "
          f"{args.gap:g} s apart")
    print(f"{'':<10}{'writes':>8}{'acked':>8}{'lost':>6}{'dup':>6}{'refused':>9}"
          f"{'refused but present':>21}{'unknown':>9}{'unsettled':>11}")
    for side in ("unkeyed", "keyed"):
        f = figures[side]
        print(f"{side:<10}{f['writes']:>8}{f['acknowledged']:>8}{f['lost']:>6}"
              f"{f['duplicated']:>6}{f['refused']:>9}{f['refused_but_present']:>21}"
              f"{f['unknown']:>9}{f['unsettled']:>11}")
    print(f"{'plane':<16}{'acked':>8}{'lost':>6}{'applied twice':>15}{'outcome unknown':>17}"
          f"{'keyed retried':>15}{'wait p50 s':>12}{'wait max s':>12}")
    by_plane: dict[str, str] = {}
    for plane in PLANES:
        mine = [w for w in run.writes if w.plane == plane]
        waits = [w.settled_at - w.first_failure for w in mine
                 if w.keyed and w.first_failure is not None and w.settled_at is not None]
        acked = sum(w.outcome == 'acknowledged' for w in mine)
        lost = sum(w.outcome == 'acknowledged' and w.applied == 0 for w in mine)
        twice = sum(w.applied > 1 for w in mine)
        unknown = sum(w.outcome == 'unknown' for w in mine)
        p50 = statistics.median(waits) if waits else 0
        most = max(waits) if waits else 0
        print(f"{plane:<16}{acked:>8}{lost:>6}{twice:>15}{unknown:>17}{len(waits):>15}"
              f"{p50:>12.2f}{most:>12.2f}")
        by_plane[plane] = (f"acknowledged {acked}, lost {lost}, applied twice {twice}, "
                           f"outcome unknown {unknown}; {len(waits)} keyed writes retried, "
                           f"wait p50 {p50:.2f} s, max {most:.2f} s")
    print(f"index drift: {figures['index_drift']} ({figures['facts']} facts)")
    refusals = Counter(f"{'keyed' if w.keyed else 'unkeyed'} {w.refusal}" for w in run.writes
                       if w.outcome == "refused")
    if refusals:
        print("refused, by answer:", ", ".join(f"{k} {n}" for k, n in sorted(refusals.items())))
    kills = sorted(run.kills, key=lambda kill: kill[1])

    def target_of(moment: float) -> str:
        """The kill a moment belongs to: the last one at most WINDOW_BEFORE seconds after it."""
        found = [kill[0] for kill in kills if kill[1] - WINDOW_BEFORE <= moment]
        return found[-1] if found else "none"

    print(f"{'target':<8}{'recovery s (each kill)':<26}{'lost':>6}{'dup':>5}"
          f"{'refused but present':>21}{'keyed retried':>15}{'wait p50 s':>12}"
          f"{'wait max s':>12}")
    for target in dict.fromkeys(kill[0] for kill in kills):
        mine = [w for w in run.writes if target_of(w.sent_at) == target]
        waits = [w.settled_at - w.first_failure for w in mine
                 if w.keyed and w.first_failure is not None and w.settled_at is not None]
        lost = sum(w.outcome == "acknowledged" and w.applied == 0 for w in mine)
        dup = sum(w.applied > 1 for w in mine)
        present = sum(w.outcome != "acknowledged" and w.applied > 0 for w in mine)
        each = " ".join(f"{kill[2]:.2f}" for kill in kills if kill[0] == target)
        p50 = f"{statistics.median(waits):.2f}" if waits else "-"
        worst = f"{max(waits):.2f}" if waits else "-"
        print(f"{target:<8}{each:<26}{lost:>6}{dup:>5}{present:>21}{len(waits):>15}{p50:>12}"
              f"{worst:>12}")
    lost_kinds = Counter(f"{target_of(w.sent_at)} {'keyed' if w.keyed else 'unkeyed'} {w.plane}"
                         for w in run.writes if w.outcome == "acknowledged" and w.applied == 0)
    if lost_kinds:
        print("lost, by kill and write:", ", ".join(f"{k} {n}" for k, n in lost_kinds.items()))
    restarts = [kill[2] for kill in kills if kill[0] == "master"]
    cold, beside = cold_starts
    if restarts:
        print(f"restart after kill -9 of the master: p50 {statistics.median(restarts):.2f} s, "
              f"max {max(restarts):.2f} s (target {RESTART_TARGET:g} s); 'Connection in use' "
              f"lines: {in_use}")
        ratios = " ".join(f"{r / b:.2f}" for r, b in zip(restarts, beside, strict=True))
        print(f"cold start of the same command: {cold:.2f} s before the load; beside it, just "
              f"after each restart: {' '.join(f'{b:.2f}' for b in beside)} s; restart / cold "
              f"start beside it: {ratios}")
    keyed, unkeyed = figures["keyed"], figures["unkeyed"]
    bad = (unkeyed["lost"] + keyed["lost"] + keyed["duplicated"] + unkeyed["duplicated"]
           + keyed["unknown"] + unkeyed["unknown"] + keyed["unsettled"]
           + figures["index_drift"])
    if figures["stuck"]:
        print(f"workers of a killed master still running at the end: {figures['stuck']} "
              f"(of {len(run.orphans)})")
    slow = args.strict and (any(restart > RESTART_TARGET for restart in restarts)
                            or figures["stuck"] > 0)
    from bench import results
    recorded = {side: ", ".join(f"{name.replace('_', ' ')} {figures[side][name]}"
                                for name in figures[side]) for side in ("unkeyed", "keyed")}
    recorded.update({f"plane {plane}": line for plane, line in by_plane.items()})
    recorded["index drift"] = f"{figures['index_drift']} ({figures['facts']} facts)"
    for target in dict.fromkeys(kill[0] for kill in kills):
        fault = "SIGSTOP" if target == "stall" else "kill -9"
        recorded[f"recovery after {fault} of {target}"] = " ".join(
            f"{kill[2]:.2f}" for kill in kills if kill[0] == target) + " s"
    if restarts:
        recorded["master restart / cold start beside it"] = ratios
    results.record("faults", f"Writers through HTTP ({args.writers} without an Idempotency-Key, "
                   f"{args.keyed} with one) while Redis, a gunicorn worker and the master are "
                   f"killed {args.kills} time(s) each, {args.gap:g} s apart; every write looked "
                   "up in Redis after.", recorded, results.embedded_server())
    return 1 if bad or slow else 0


if __name__ == "__main__":
    sys.exit(main())
