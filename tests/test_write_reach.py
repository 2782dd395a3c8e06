"""A write reaches the same rows by memory_id as by key (issue 46, point 1).

With auth on, through the Flask app: every op that writes a memory row by ``memory_id`` or by
key (its label, for a profile section) is sent by each kind of token (a namespace writer, one
pinned to a user, one pinned to a user and bound to a session, one fixed to an agent, a
viewer) at a row of each owner (the token's own, another user's, the namespace's ``-``,
another agent's, another session's). Each call lands on a row planted for it alone. A write
the token may make answers 200; any other leaves the row as it was (read back from the store,
its current version and its history), and a refusal by memory_id reads exactly as a memory_id
that names no row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from app.store.memory import Content, Location, MemoryStore
from tests.auth_support import auth_app, bearer, mint

ORG, NS = "reach-org", "reach-ns"
ALICE, BOB = "alice", "bob"
UNKNOWN_ID = "mem_00000000000000000000000000000000"


@dataclass(frozen=True)
class Owner:
    user_id: str
    session_id: str
    agent: str


# Every token but the viewer acts for alice, in session s-1, as agent bot-a where it is
# pinned, bound or fixed at all: "own" is every token's own row.
OWNERS = {
    "own": Owner(ALICE, "s-1", "bot-a"),
    "another user": Owner(BOB, "-", "bot-a"),
    "namespace": Owner("-", "-", "-"),
    "another agent": Owner(ALICE, "s-1", "bot-b"),
    "another session": Owner(ALICE, "s-2", "bot-a"),
}

TOKENS: dict[str, dict[str, Any]] = {
    # Admin role, so the ops that rewrite history (delete_version, redact) are walked too.
    "namespace writer": {"role": "admin"},
    "user-pinned": {"role": "admin", "read_user_id": ALICE},
    "user-pinned + session-bound": {"role": "admin", "read_user_id": ALICE,
                                    "session_id": "s-1"},
    "agent-bound": {"role": "admin", "agent": "bot-a"},
    "viewer": {"role": "viewer"},
}

# Which owners' rows each token may write: the reach a key gives it.
WRITES = {
    "namespace writer": set(OWNERS),
    "user-pinned": {"own", "another agent", "another session"},
    "user-pinned + session-bound": {"own", "another agent"},
    "agent-bound": {"own", "another user", "another session"},
    "viewer": set(),
}

# op -> (how its planted row starts, extra body fields). A row "twice" has two versions (the
# call names the first); "deleted" is a tombstone; "locked"/"pinned" carry the flag.
MEMORY_ID_OPS: dict[str, tuple[str, dict[str, Any]]] = {
    "memory.delete": ("plain", {}),
    "memory.delete_version": ("twice", {}),
    "memory.revert": ("twice", {}),
    "memory.restore": ("deleted", {}),
    "memory.lock": ("plain", {}),
    "memory.unlock": ("locked", {}),
    "memory.pin": ("plain", {}),
    "memory.unpin": ("pinned", {}),
    "memory.restate": ("plain", {}),
    "memory.reinforce": ("plain", {"confidence": 0.9}),
    "memory.recall": ("plain", {}),
    "memory.redact": ("plain", {}),
    # Idempotent: on a current row an allowed backfill writes nothing, so its refusals are
    # told by status alone.
    "memory.backfill": ("plain", {}),
}
KEY_OPS: dict[str, tuple[str, dict[str, Any]]] = {
    **MEMORY_ID_OPS,
    "memory.set": ("plain", {"value": "rewritten"}),
    "profile.set": ("section", {"value": "rewritten"}),
    "profile.append": ("section", {"addition": "appended"}),
    "profile.replace": ("section", {"old": "planted", "new": "rewritten"}),
}


@pytest.fixture
def world(app_factory):
    app = auth_app(app_factory)
    client = app.test_client()
    tokens = {name: mint(client, org=ORG, namespace=NS, **claims)
              for name, claims in TOKENS.items()}
    return client, app.extensions["loom"].store(MemoryStore), tokens


def plant(store: MemoryStore, owner: Owner, key: str, start: str) -> Location:
    where = Location(ORG, NS, owner.user_id, owner.agent, owner.session_id, key)
    kind = "profile" if start == "section" else "semantic"
    value = "planted text" if start == "section" else {"planted": key}
    store.set(where, Content(memory_type=kind, value=value, confidence=0.5, tags=["t"]),
              written_by="planter")
    if start == "twice":
        store.set(where, Content(value={"planted": key, "again": True}, confidence=0.5),
                  written_by="planter")
    elif start == "deleted":
        store.delete(where, written_by="planter")
    elif start in ("locked", "pinned"):
        store.set_flag(where, start, True, written_by="planter")
    return where


def snapshot(store: MemoryStore, where: Location) -> tuple[Any, Any]:
    return store.read(where), store.history(where, limit=100)


def names_outside(claims: dict[str, Any], owner: Owner) -> bool:
    """Whether a body naming ``owner`` names a user, session or agent the token fixes to
    another (403 before any row is read). '-' for a user or session is the token's own."""
    user, session, agent = (claims.get(name) for name in ("read_user_id", "session_id",
                                                          "agent"))
    return bool(user and owner.user_id not in ("-", user)
                or session and owner.session_id not in ("-", session)
                or agent and owner.agent != agent)


def send(client, token: str, op_name: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    response = client.post(f"/v1/{op_name}", json=body, headers=bearer(token))
    return response.status_code, response.get_json()


def first_version(store: MemoryStore, where: Location) -> str:
    versions, _ = store.history(where, limit=100)
    return str(versions[-1].version)


def test_every_write_by_memory_id_and_by_key_stays_in_the_tokens_reach(world):
    client, store, tokens = world
    counts = {"calls": 0, "allowed": 0, "refusals": 0, "unchanged": 0}
    wrong: list[str] = []
    for mode, ops in (("memory_id", MEMORY_ID_OPS), ("key", KEY_OPS)):
        for token_name, token in tokens.items():
            for op_name, (start, extra) in ops.items():
                for owner_name, owner in OWNERS.items():
                    key = f"{mode}.{token_name}.{op_name}.{owner_name}".replace(" ", "_")
                    where = plant(store, owner, key, start)
                    row = store.read(where)
                    assert row is not None
                    body: dict[str, Any] = {"namespace": NS, **extra}
                    if start == "twice":
                        body["version_text"] = first_version(store, where)
                    if mode == "memory_id":
                        body.update(memory_id=row.memory_id, agent="bot-a")
                    else:
                        body.update(agent=owner.agent, user_id=owner.user_id,
                                    session_id=owner.session_id)
                        body["label" if op_name.startswith("profile.") else "key"] = key
                    before = snapshot(store, where)
                    status, answer = send(client, token, op_name, body)
                    counts["calls"] += 1
                    cell = f"{mode} {token_name} {op_name} {owner_name}: {status} {answer}"
                    if owner_name in WRITES[token_name]:
                        counts["allowed"] += 1
                        moved = snapshot(store, where) != before
                        if status != 200 or not (moved or op_name == "memory.backfill"):
                            wrong.append("allowed " + cell)
                        continue
                    counts["refusals"] += 1
                    if snapshot(store, where) == before:
                        counts["unchanged"] += 1
                    else:
                        wrong.append("changed " + cell)
                    if status == 200 and answer.get("memory_id") == row.memory_id:
                        wrong.append("answered for the row " + cell)
                    if token_name == "viewer":
                        if status != 403 or answer["error"]["code"] != "AUTH_INSUFFICIENT":
                            wrong.append("viewer " + cell)
                    elif mode == "key":
                        # Naming what the token fixes otherwise is refused; naming '-' for a
                        # fixed user or session writes the token's own row of that key.
                        refused = status == 403 and answer["error"]["code"] == (
                            "AUTH_INSUFFICIENT")
                        if refused != names_outside(TOKENS[token_name], owner):
                            wrong.append("by key " + cell)
                    else:
                        # Out of reach reads exactly as no such row.
                        unknown_status, unknown = send(
                            client, token, op_name, {**body, "memory_id": UNKNOWN_ID})
                        shown = json.dumps(answer).replace(row.memory_id, UNKNOWN_ID)
                        if (status, shown) != (unknown_status, json.dumps(unknown)) or (
                                status != 404):
                            wrong.append(f"tells {cell} vs {unknown_status} {unknown}")
    print(f"\nwrite reach matrix: {counts['calls']} calls, {counts['allowed']} allowed, "
          f"{counts['refusals']} refusals, {counts['unchanged']} refused rows unchanged")
    assert wrong == []
    assert counts["refusals"] == counts["unchanged"]
    # 13 memory_id ops and 17 key ops, 5 tokens, 5 owners.
    assert counts["calls"] == (13 + 17) * 5 * 5
