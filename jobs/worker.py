"""``python -m jobs.worker``: an RQ worker on Loom's queues (scale by running more of them).

``python -m jobs.worker --queues loom-builds`` (or the queue names as arguments) listens on
those queues only: a builds-only worker makes model calls for the structured-profile passes
and nothing else, so N of them make N builds at once while the passes and maintenance jobs
keep their own workers.

Its log lines are Loom's (``LOOM_LOG_FORMAT``), and every line written while a job runs
carries the job's id and function. RQ's own lines leave out the job's arguments: a build's
arguments are a user id, which no log line may hold.
"""

from __future__ import annotations

import importlib
import logging
import signal
import sys
from typing import Any

import redis
from rq import Queue, Worker
from rq.job import Job

from app import logs
from app.settings import load_settings
from app.store.connection import UNAVAILABLE_ERRORS
from jobs.outage import ride_out
from jobs.periodic import JOB_ID_PREFIX
from jobs.queues import ALL_QUEUES, queue, queue_connection

log = logging.getLogger("loom.jobs.worker")

PRELOADED = ("jobs.agent_state_sweep", "jobs.consolidation", "jobs.structured_profile")


class QuietPeriodicJobs(logging.Filter):
    """RQ's INFO lines about Loom's periodic jobs (dequeued, completed, OK, result kept: four a
    job, every interval) as DEBUG lines. The pass itself says what it did, at INFO when it did
    something (``app.logs.pass_level``), so at INFO a pass with nothing to do writes no line;
    RQ's warnings and errors about those jobs stay as they are."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO:
            return True
        try:
            message = record.getMessage()
        except Exception:  # a record that cannot be formatted is the handler's to report
            return True
        if JOB_ID_PREFIX not in message:
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def job_function(job: Job) -> str:
    """The job's function for logs and metrics: Loom's own by name, anything else as other."""
    try:
        name = job.func_name
    except Exception:  # a job that cannot be read is still logged
        return "other"
    return name if name and name.startswith("jobs.") else "other"


class PromptUnsubscribe:
    """RQ's ``unsubscribe`` in an order that never waits out the pub/sub thread's poll.

    RQ unsubscribes, then stops its pub/sub thread, and redis-py's ``stop`` waits for the
    thread. When the thread reads the unsubscribe's reply before ``stop`` clears its running
    flag, it loops into its next read, which waits up to RQ's 60 s poll for a subscription
    that is gone: a worker's stop, and every burst run's end, then took a minute. Here the
    flag is cleared first and the unsubscribe's reply is what wakes the thread's read. For any
    RQ worker class: ``class W(PromptUnsubscribe, SimpleWorker)``.
    """

    pubsub: Any
    pubsub_thread: Any

    def unsubscribe(self) -> None:
        thread, pubsub = self.pubsub_thread, self.pubsub
        if thread is None:
            return
        thread.stop(timeout=0)  # the flag only: the thread is joined below
        pubsub.unsubscribe()
        thread.join(timeout=5)
        pubsub.close()


class LoomWorker(PromptUnsubscribe, Worker):
    # Set by SIGTERM / SIGINT: ``work()`` also returns after a Redis failure, and only a
    # stop asked for ends the process.
    stop_asked = False

    def request_stop(self, signum: int, frame: Any) -> None:
        self.stop_asked = True
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]  # rq: untyped

    def teardown(self) -> None:
        # RQ's teardown records the worker's death in Redis; with Redis away that raised out of
        # work(). The record expires by itself.
        try:
            super().teardown()  # type: ignore[no-untyped-call]  # rq leaves it untyped
        except UNAVAILABLE_ERRORS as error:
            log.warning("could not record the worker's death: %s", error)
        finally:
            # RQ unsubscribes only after the death is recorded, and its unsubscribe speaks to
            # Redis first: with Redis away neither runs, and the pub/sub thread would go on
            # reconnecting, one more thread and connection per outage, beside the next worker.
            self.release_pubsub()

    def release_pubsub(self) -> None:
        """Stop this worker's pub/sub thread and drop its connection, without asking Redis."""
        thread, pubsub = self.pubsub_thread, self.pubsub
        self.pubsub_thread = self.pubsub = None
        if thread is not None:
            thread.stop(timeout=0)  # the flag only: joining now would wait out its read
        if pubsub is not None:
            pubsub.close()  # disconnects the socket, so a thread blocked reading it wakes up
        if thread is not None:
            thread.join(timeout=5)

    def execute_job(self, job: Job, queue: Queue) -> None:
        # Bound before the fork: the work horse inherits the context, and the worker's own
        # lines about the job (started, OK, failed) carry it too.
        with logs.bound_to(job_id=job.id, function=job_function(job), queue=queue.name):
            super().execute_job(job, queue)


def count_job_error(job: Job, exc_type: type[BaseException], exc_value: BaseException,
                    traceback: Any) -> bool:
    """An RQ exception handler: count the failure for /metrics, then let RQ go on."""
    from app.store.metrics import JobMetricsStore
    from jobs.context import services

    kind = "redis" if isinstance(exc_value, redis.RedisError) else "other"
    try:
        services().store(JobMetricsStore).add(
            "loom_job_errors_total", {"function": job_function(job), "error": kind})
    except redis.RedisError:
        log.warning("could not count a job error: Redis is not answering")
    return True


def parse_queues(args: list[str]) -> tuple[list[str], bool]:
    """(queue names, burst) from ``[--burst] [--queues a,b] [name ...]``; every queue when
    none is named. An unknown name is an error: a worker on a queue nothing feeds would idle."""
    burst = False
    names: list[str] = []
    rest = iter(args)
    for arg in rest:
        if arg == "--burst":
            burst = True
        elif arg == "--queues" or arg.startswith("--queues="):
            value = arg.partition("=")[2] if "=" in arg else next(rest, "")
            names += [name.strip() for name in value.split(",") if name.strip()]
        elif arg.startswith("--"):
            raise SystemExit(f"jobs.worker: unknown option {arg}")
        else:
            names.append(arg)
    unknown = [name for name in names if name not in ALL_QUEUES]
    if unknown:
        raise SystemExit(f"jobs.worker: no such queue {', '.join(unknown)} "
                         f"(queues: {', '.join(ALL_QUEUES)})")
    return list(dict.fromkeys(names)) or list(ALL_QUEUES), burst


def preload_jobs() -> None:
    """Import the job modules before RQ forks a work horse per job: each horse then starts
    with them loaded, instead of importing them for every build."""
    for module in PRELOADED:
        importlib.import_module(module)


def resume_erasures() -> None:
    """An erasure whose worker died mid-saga is enqueued again as soon as a worker starts."""
    from jobs.context import services
    from jobs.erasure import resume_interrupted

    try:
        resume_interrupted(services())
    except UNAVAILABLE_ERRORS as error:  # the scheduler's resume pass will do it
        log.warning("could not resume erasures: %s", type(error).__name__)


def main(argv: list[str] | None = None) -> int:
    names, burst = parse_queues(list(argv or []))
    settings = load_settings()
    preload_jobs()
    logs.configure_logging(settings.log_format)
    logging.getLogger("rq.worker").addFilter(QuietPeriodicJobs())
    connection = queue_connection(settings)
    resume_erasures()

    def work() -> bool:
        # A new worker each time: RQ refuses to register a second birth under one name.
        worker = LoomWorker([queue(name, connection) for name in names], connection=connection,
                            log_job_description=False, exception_handlers=[count_job_error])
        try:
            worker.work(burst=burst, with_scheduler=False)
        finally:
            # RQ's handlers point at this worker; while waiting for Redis a stop must end the
            # process as usual.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
        return burst or worker.stop_asked

    ride_out(work, connection, "worker")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
