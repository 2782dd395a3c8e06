"""Raw ids never reach a log line: the profile agent-state path logs the id's keyed hash.

A real gunicorn writes its access log (the Procfile's ``--access-logfile``) and its error log
to files; every line is checked for the raw handles the test used.
"""

from __future__ import annotations

import logging
from urllib.parse import quote

import requests

from app import log_ids
from tests.conftest import TEST_SECRET
from tests.support.live_server import LiveServer

HANDLES = ("ana.lopez@example.com", "+33711223344", "cust-9f3e1c77")


def test_gunicorn_access_log_carries_the_keyed_hash_not_the_id(redis_url, tmp_path):
    access = tmp_path / "access.log"
    errors = tmp_path / "error.log"
    env = {"REDIS_URL": redis_url, "LOOM_SECRET_KEY": TEST_SECRET,
           "LOOM_DATA_DIR": str(tmp_path)}
    args = ("--access-logfile", str(access), "--error-logfile", str(errors))
    with LiveServer(env, workers=1, extra_args=args) as server:
        for handle in HANDLES:
            for spelling in (handle, quote(handle, safe="")):
                response = requests.get(
                    f"{server.url}/v1/profiles/{spelling}/agent-state",
                    params={"namespace": "shop"}, timeout=10)
                assert response.status_code == 200, response.text
    lines = access.read_text().splitlines()
    assert len(lines) >= 2 * len(HANDLES)
    text = access.read_text() + errors.read_text()
    for handle in HANDLES:
        assert handle not in text
        assert quote(handle, safe="") not in text
        assert handle.split("@")[0] not in text
    log_ids.install(TEST_SECRET)
    for handle in HANDLES:
        hashed = log_ids.hashed_id(handle)
        # Both spellings of one id log the same hash, so lines still correlate.
        assert sum(hashed in line for line in lines) == 2, (hashed, lines)
        assert f"/v1/profiles/{hashed}/agent-state" in text


def test_records_of_any_logger_are_scrubbed(app, caplog):
    caplog.set_level(logging.INFO)
    logging.getLogger("loom.anything").info("on %s", "/v1/profiles/ana%40example.com/agent-state")
    logging.getLogger("werkzeug").info('"GET /v1/profiles/+33711223344/agent-state HTTP/1.1" 200')
    logging.getLogger("gunicorn.access").info(
        "%(r)s", {"r": "GET /v1/profiles/cust-9f3e1c77/agent-state?namespace=x HTTP/1.1"})
    text = "\n".join(record.getMessage() for record in caplog.records)
    for raw in ("ana%40example.com", "+33711223344", "cust-9f3e1c77"):
        assert raw not in text
    assert log_ids.hashed_id("ana@example.com") in text
