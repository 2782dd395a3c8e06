"""How a ``rediss://`` server's certificate is checked, set apart from ``REDIS_URL``
(``LOOM_REDIS_TLS_VERIFY``, ``LOOM_REDIS_TLS_CA_CERTS``): the options every client gets, and a
real TLS redis-server (the one on PATH, when it is built with TLS; the embedded servers are
not) with a certificate signed by a CA made here, reached by the data plane's client, RQ's,
``/readyz`` and the Procfile's release line.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from app import create_app
from app.local import free_port
from app.settings import SettingsError, load_settings
from app.store.connection import connect, tls_options
from jobs.queues import queue_connection
from tests.conftest import TEST_SECRET
from tests.test_release import release


def settings_for(url: str, tmp_path: Path, **environ: str):
    return load_settings({"REDIS_URL": url, "LOOM_DATA_DIR": str(tmp_path), **environ})


def test_only_a_rediss_url_gets_certificate_options(tmp_path):
    plain = settings_for("redis://127.0.0.1:6379/0", tmp_path, LOOM_REDIS_TLS_VERIFY="off")
    assert tls_options(plain, plain.redis_url) == {}
    url = "rediss://cache.example:6380/0"
    assert tls_options(settings_for(url, tmp_path), url) == {"ssl_cert_reqs": "required"}
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    checked = settings_for(url, tmp_path, LOOM_REDIS_TLS_CA_CERTS=str(bundle))
    assert tls_options(checked, url) == {"ssl_cert_reqs": "required",
                                         "ssl_ca_certs": str(bundle)}
    unchecked = settings_for(url, tmp_path, LOOM_REDIS_TLS_VERIFY="off")
    assert tls_options(unchecked, url) == {"ssl_cert_reqs": "none", "ssl_check_hostname": False}
    # The client the data plane builds carries them to its connections.
    pool = connect(unchecked).connection_pool
    assert pool.connection_kwargs["ssl_cert_reqs"] == "none"
    assert pool.connection_kwargs["ssl_check_hostname"] is False


def test_a_missing_ca_bundle_is_a_settings_error_that_names_it(tmp_path):
    with pytest.raises(SettingsError, match="LOOM_REDIS_TLS_CA_CERTS"):
        settings_for("rediss://x:6380", tmp_path,
                     LOOM_REDIS_TLS_CA_CERTS=str(tmp_path / "absent.pem"))
    with pytest.raises(SettingsError, match="LOOM_REDIS_TLS_VERIFY"):
        settings_for("rediss://x:6380", tmp_path, LOOM_REDIS_TLS_VERIFY="maybe")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A TLS-only redis-server on loopback; its URL and the CA that signed its certificate."""
    server = shutil.which("redis-server")
    if server is None or shutil.which("openssl") is None:
        pytest.skip("no redis-server (and openssl) on PATH; the embedded servers are built "
                    "without TLS")
    folder = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.pem", "-days", "1", "-subj", "/CN=loom-test-ca", cwd=folder)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
             "server.csr", "-subj", "/CN=127.0.0.1", cwd=folder)
    (folder / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "ext",
             cwd=folder)
    port = free_port()
    process = subprocess.Popen(
        [server, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", "server.pem", "--tls-key-file", "server.key",
         "--tls-auth-clients", "no", "--save", "", "--appendonly", "no"],
        cwd=folder, stdout=(folder / "log").open("wb"), stderr=subprocess.STDOUT)
    url = f"rediss://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                redis.Redis.from_url(url, ssl_cert_reqs="none").ping()
                break
            except redis.ConnectionError:
                if process.poll() is not None and "TLS support" in (folder / "log").read_text():
                    pytest.skip("the redis-server on PATH is built without TLS")
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        yield url, folder / "ca.pem"
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_a_tls_server_is_reached_with_its_ca_or_unchecked_and_refused_otherwise(
        tls_server, tmp_path):
    url, ca = tls_server
    unknown_ca = settings_for(url, tmp_path)
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        connect(unknown_ca).ping()
    with_ca = settings_for(url, tmp_path, LOOM_REDIS_TLS_CA_CERTS=str(ca))
    assert connect(with_ca).ping() and queue_connection(with_ca).ping()
    unchecked = settings_for(url, tmp_path, LOOM_REDIS_TLS_VERIFY="off")
    assert connect(unchecked).ping() and queue_connection(unchecked).ping()


def test_readyz_and_the_release_line_follow_the_tls_settings(tls_server, tmp_path):
    url, ca = tls_server
    for extra, ready in (({}, 503), ({"redis_tls_ca_certs": str(ca)}, 200),
                         ({"redis_tls_verify": "off"}, 200)):
        app = create_app({"redis_url": url, "data_dir": str(tmp_path),
                          "secret_key": TEST_SECRET, **extra})
        assert app.test_client().get("/readyz").status_code == ready, extra
    assert release(url, tmp_path).returncode == 1
    released = release(url, tmp_path, LOOM_REDIS_TLS_CA_CERTS=str(ca))
    assert released.returncode == 0, released.stderr
    assert "release: recall:" in released.stdout
