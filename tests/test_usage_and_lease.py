"""The cost ledger, the org switch for model calls, and the worker lease with fencing."""

from __future__ import annotations

import pytest

from app.ops.usage import Usage
from app.services import Services
from app.store.lease import LeaseLost, LeaseStore
from app.store.usage import COUNTERS, UsageStore


def test_usage_answer_lists_every_counter():
    assert set(COUNTERS) <= set(Usage().fields)


def test_usage_get_reads_what_workers_added(app, client):
    store = app.extensions["loom"].store(UsageStore)
    store.add("default", "support", model_calls=2, prompt_tokens=300, completion_tokens=40,
              builds=2, skipped_unchanged=5)
    store.add("default", "other", model_calls=9)
    out = client.post("/v1/usage.get", json={"namespace": "support"}).get_json()
    assert out["model_calls"] == 2 and out["prompt_tokens"] == 300
    assert out["skipped_unchanged"] == 5 and out["failures"] == 0
    assert out["model_calls_enabled"] is True


def test_org_switch_for_model_calls(app, client):
    out = client.post("/v1/org.set_model_calls", json={"enabled": False}).get_json()
    assert out == {"org": "default", "model_calls_enabled": False, "ignored_args": []}
    assert app.extensions["loom"].store(UsageStore).model_calls_enabled("default") is False
    assert client.post("/v1/usage.get", json={"namespace": "x"}).get_json()[
        "model_calls_enabled"] is False
    client.post("/v1/org.set_model_calls", json={"enabled": True})
    assert app.extensions["loom"].store(UsageStore).model_calls_enabled("default") is True
    bad = client.post("/v1/org.set_model_calls", json={"enabled": "maybe"})
    assert bad.status_code == 422 and "enabled" in bad.get_json()["error"]["fields"]


def test_lease_is_held_by_one_and_fenced(app, redis_client):
    services: Services = app.extensions["loom"]
    store = services.store(LeaseStore)
    first = store.acquire("structured_profile", "worker-a", ttl_seconds=30)
    assert first is not None and first.holds()
    assert store.acquire("structured_profile", "worker-b", ttl_seconds=30) is None
    store.save_state(first, '{"cursor": "ns-1"}')
    assert store.load_state("structured_profile") == ("worker-a", '{"cursor": "ns-1"}')
    # The lease runs out (a paused holder); another takes it with a higher token.
    redis_client.delete("loom:lease:{structured_profile}")
    second = store.acquire("structured_profile", "worker-b", ttl_seconds=30)
    assert second is not None and second.token > first.token
    assert not first.holds()
    with pytest.raises(LeaseLost):  # a lost lease must not write
        store.save_state(first, '{"cursor": "stale"}')
    with pytest.raises(LeaseLost):  # nor renew
        first.renew()
    assert store.load_state("structured_profile")[1] == '{"cursor": "ns-1"}'
    second.release()
    assert store.acquire("structured_profile", "worker-c", ttl_seconds=30) is not None


def test_lease_expires_by_itself(app):
    import time

    store = app.extensions["loom"].store(LeaseStore)
    lease = store.acquire("sweep", "a", ttl_seconds=0.05)
    time.sleep(0.1)
    assert not lease.holds()
    assert store.acquire("sweep", "b", ttl_seconds=5) is not None
