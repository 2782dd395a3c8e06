"""The probes write no access line: the Procfile's web line (gunicorn's access log to its
output, as a platform collects it) answers ``/healthz`` and ``/readyz`` and logs neither, while
every other request keeps its line, gunicorn's and Loom's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from app.local import free_port
from tests.conftest import TEST_SECRET
from tests.support.processes import wait_for

ROOT = Path(__file__).resolve().parents[1]
PROCFILE = dict(
    line.split(": ", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line.strip()
)


def _answers(url: str) -> bool:
    try:
        return requests.get(url + "/healthz", timeout=2).ok
    except requests.ConnectionError:
        return False


@pytest.mark.slow
def test_the_web_line_logs_every_request_but_the_probes(redis_url, tmp_path):
    port = free_port()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("LOOM_", "HOST", "DYNO"))}
    env.update(PORT=str(port), REDIS_URL=redis_url, LOOM_SECRET_KEY=TEST_SECRET,
               LOOM_DATA_DIR=str(tmp_path), LOOM_LOG_FORMAT="json", WEB_CONCURRENCY="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "sdk"), str(ROOT)]),
               PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))
    output = tmp_path / "web.log"
    process = subprocess.Popen(PROCFILE["web"], shell=True, cwd=ROOT, env=env,
                               stdout=output.open("wb"), stderr=subprocess.STDOUT,
                               start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(url), 60, "the web answering")
        for _ in range(3):
            assert requests.get(url + "/healthz", timeout=5).status_code == 200
            assert requests.get(url + "/readyz", timeout=5).status_code == 200
        assert requests.get(url + "/openapi.json", timeout=5).status_code == 200
        rendered = requests.post(url + "/v1/working_memory.render", timeout=5,
                                 json={"namespace": "support", "agent": "triage-bot"})
        assert rendered.status_code == 200
        wait_for(lambda: "working_memory.render" in output.read_text(), 10, "the access lines")
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    text = output.read_text()
    assert f"Listening at: http://127.0.0.1:{port} (" in text
    # gunicorn's access lines: the two requests that are not probes, and no probe.
    assert '"GET /openapi.json HTTP/1.1\\" 200' in text
    assert '"POST /v1/working_memory.render HTTP/1.1\\" 200' in text
    # Loom's own access line for the op, and none for a probe either.
    assert "POST working_memory.render 200" in text
    assert "/healthz" not in text and "/readyz" not in text
    assert "healthz" not in text and "readyz" not in text
