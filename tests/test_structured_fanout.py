"""More RQ workers, more model throughput: a pass fans its builds out as per-user jobs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rq import Queue, Worker

from app.local import die_with_parent
from app.services import Services
from app.settings import load_settings
from jobs.queues import BUILDS
from jobs.structured_profile import run_pass
from tests.conftest import TEST_SECRET, make_app
from tests.support.model_server import ScriptedModelServer
from tests.test_structured_worker import SCHEMA

ROOT = Path(__file__).resolve().parents[1]
NS = {"namespace": "support", "agent": "chat"}


@pytest.mark.slow
def test_builds_fan_out_to_other_workers(redis_url, tmp_path):
    with ScriptedModelServer(default=lambda request: {"preferred_name": "Sam"}) as model:
        env = {**os.environ, "REDIS_URL": redis_url, "LOOM_SECRET_KEY": TEST_SECRET,
               "LOOM_DATA_DIR": str(tmp_path), "LOOM_LLM_BASE_URL": model.base_url,
               "LOOM_LLM_MODEL": "scripted-model", "PYTHONPATH": str(ROOT)}
        workers = [
            subprocess.Popen([sys.executable, "-m", "jobs.worker", BUILDS], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             preexec_fn=die_with_parent)
            for _ in range(2)
        ]
        try:
            overrides = {"llm_base_url": model.base_url, "llm_model": "scripted-model"}
            client = make_app(redis_url, tmp_path, **overrides).test_client()
            client.post("/v1/profile_schema.set", json={**NS, "json_schema": SCHEMA})
            users = [f"u-{i}" for i in range(6)]
            for user in users:
                client.post("/v1/memory.set", json={**NS, "user_id": user, "key": "name",
                                                    "value": f"I am {user}"})
            services = Services(load_settings(overrides={
                "redis_url": redis_url, "secret_key": TEST_SECRET, "data_dir": str(tmp_path),
                **overrides}))
            queue = Queue(BUILDS, connection=services.queue_redis)
            deadline = time.monotonic() + 30
            while Worker.count(queue=queue) < 2:
                assert time.monotonic() < deadline, "the RQ workers did not start"
                time.sleep(0.1)
            result = run_pass(services, holder="planner", force=True)
            assert sorted(user for _, user, outcome in result["built"]
                          if outcome == "built") == users
            assert len(queue.finished_job_registry.get_job_ids()) == len(users)
            for user in users:
                out = client.post("/v1/profile.structured",
                                  json={**NS, "user_id": user}).get_json()
                assert out["status"] == "ready" and out["profile"]["preferred_name"] == "Sam"
        finally:
            for worker in workers:
                worker.terminate()
            for worker in workers:
                worker.wait(timeout=20)
