"""/metrics shows the structured backlog an ops team scales workers for (issue 47, point 5):
users waiting for a build per namespace (pending, stale, parked), the oldest wait, and the
passes that handed out as many users as their cap. Parsed with prometheus_client's parser."""

from __future__ import annotations

import pytest

from tests.test_operate import samples, value
from tests.test_structured_worker import SCHEMA, World, answer

SUPPORT, SALES = "support", "sales"
PASS = {"pass": "structured_profile"}


@pytest.fixture
def world(redis_url, tmp_path, model):
    return World(redis_url, tmp_path, model, structured_profile_max_users_per_pass=2)


def scrape(world: World) -> dict:
    response = world.client.get("/metrics")
    assert response.status_code == 200
    return samples(response.get_data(as_text=True))


def waiting(scraped: dict, namespace: str, state: str) -> float:
    return value(scraped, "loom_structured_users_waiting", org="default",
                 namespace=namespace, state=state)


def oldest(scraped: dict, namespace: str) -> float:
    return value(scraped, "loom_structured_oldest_wait_seconds", org="default",
                 namespace=namespace)


def test_the_backlog_per_namespace_the_oldest_wait_and_full_passes(world, model):
    for namespace in (SUPPORT, SALES):
        world.post("profile_schema.set", namespace=namespace, json_schema=SCHEMA)
    for user in ("u-1", "u-2", "u-3"):
        world.fact("name", f"Call me {user}", user=user)
    world.clock.advance(30)
    world.fact("name", "Call me Ann", user="u-4")
    scraped = scrape(world)
    assert waiting(scraped, SUPPORT, "pending") == 4
    assert waiting(scraped, SUPPORT, "stale") == 0
    assert oldest(scraped, SUPPORT) == pytest.approx(30)
    # A namespace with a schema and nobody behind shows its zeros, not nothing.
    assert ("loom_structured_users_waiting",
            (("namespace", SALES), ("org", "default"), ("state", "pending"))) in scraped
    assert oldest(scraped, SALES) == 0

    model.script(answer(preferred_name="A"))
    model.script(answer(preferred_name="B"))
    out = world.run_pass()  # the cap is 2: the pass is full
    assert len(out["built"]) == 2
    scraped = scrape(world)
    assert value(scraped, "loom_passes_full_total", **PASS) == 1
    assert waiting(scraped, SUPPORT, "pending") == 2
    built = {user for _ns, user, _outcome in out["built"]}
    world.clock.advance(5)
    world.fact("tz", "Lives in Berlin", user=sorted(built)[0])  # a built user changes: stale
    scraped = scrape(world)
    assert waiting(scraped, SUPPORT, "stale") == 1
    assert waiting(scraped, SUPPORT, "pending") == 2

    # One of the two left fails: it is parked on its backoff; the other is built. The stale
    # user waits for its cooldown, so this pass hands out two users of a cap of two again.
    model.script(status=500, body={"error": {"message": "overloaded"}})
    model.script(answer(preferred_name="D"))
    out = world.run_pass()
    assert sorted(outcome for _ns, _user, outcome in out["built"]) == ["built", "failed"]
    scraped = scrape(world)
    assert waiting(scraped, SUPPORT, "pending") == 0
    assert waiting(scraped, SUPPORT, "parked") == 1
    assert waiting(scraped, SUPPORT, "stale") == 1
    assert oldest(scraped, SUPPORT) == pytest.approx(0)  # the stale user changed just now
    assert value(scraped, "loom_passes_full_total", **PASS) == 2
    assert value(scraped, "loom_passes_total", **PASS) == 2

    world.run_pass()  # nobody due: not full
    assert value(scrape(world), "loom_passes_full_total", **PASS) == 2
