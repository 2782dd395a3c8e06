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


SPELLINGS = (
    "//v1//profiles/{id}/agent-state",
    "/v1/profiles//{id}//agent-state",
    "/v1/%70rofiles/{id}/agent-state",
    "/v1/profiles/{id}/agent%2Dstate",
    "/%2576%31/profiles/{id}/agent-state",
)


def test_every_spelling_of_the_profile_path_is_scrubbed_in_gunicorns_own_lines(
        redis_url, tmp_path):
    """The Procfile's web line writes its access log to stdout (``--access-logfile -``): the
    spellings a client can send are all scrubbed there, and no line carries a Basic user."""
    env = {"REDIS_URL": redis_url, "LOOM_SECRET_KEY": TEST_SECRET, "LOOM_DATA_DIR": str(tmp_path)}
    with LiveServer(env, workers=1, extra_args=("--access-logfile", "-")) as server:
        for spelling in SPELLINGS:
            for handle in HANDLES:
                raw = spelling.format(id=quote(handle, safe="@+"))
                requests.get(f"{server.url}{raw}", params={"namespace": "shop"}, timeout=10)
        # Not a probe: the probes write no access line at all (gunicorn.conf.py).
        requests.get(f"{server.url}/openapi.json",
                     auth=("loom_0123456789abcdef_secretpart", "x"), timeout=10)
        requests.get(f"{server.url}/rq/", auth=("admin", "not-the-token"), timeout=10)
        output = server.output
    text = output.read_text()
    lines = [line for line in text.splitlines() if "agent-state" in line]
    assert len(lines) >= len(SPELLINGS) * len(HANDLES), text[-2000:]
    for handle in HANDLES:
        assert handle not in text and quote(handle, safe="") not in text
        assert handle.split("@")[0] not in text
    assert '"GET /openapi.json HTTP/1.1' in text  # its line was written, without the user
    assert "secretpart" not in text and " admin [" not in text
    log_ids.install(TEST_SECRET)
    for handle in HANDLES:
        assert sum(log_ids.hashed_id(handle) in line for line in lines) >= len(SPELLINGS), handle


def test_scrub_catches_doubled_slashes_and_encoded_letters():
    log_ids.install(TEST_SECRET)
    for spelling in SPELLINGS:
        line = f'127.0.0.1 - - "GET {spelling.format(id="carol%40example.com")} HTTP/1.1" 200'
        scrubbed = log_ids.scrub(line)
        assert "carol" not in scrubbed, scrubbed
        assert f"/v1/profiles/{log_ids.hashed_id('carol@example.com')}/agent-state" in scrubbed
    assert log_ids.scrub("GET /v1/working_memory.render 200") == (
        "GET /v1/working_memory.render 200")
