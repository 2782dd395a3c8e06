"""The namespace profile schemas in Redis, and the set of namespaces that have one.

A schema is stored with its ``schema_sha256`` computed once at set, so a structured read
compares hashes without hashing. The set ``structured-namespaces`` lists (org, namespace)
pairs as JSON so any id round-trips; the pass job rotates over it. A set or clear replaces the
schema and appends its audit entry in one MULTI, which keeps an Idempotency-Key's answer too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.clock import iso_from_ns
from app.profile_schema import schema_sha256
from app.store import keys
from app.store.idempotency import HeldKey, transact
from app.store.namespace_config import AuditLog
from app.store.replies import text_map, texts

if TYPE_CHECKING:
    from app.store.services import StoreServices


@dataclass(frozen=True)
class StoredSchema:
    doc: dict[str, Any] | None
    sha: str
    set_by: str
    set_at: int

    def as_answer(self) -> dict[str, Any]:
        return {
            "json_schema": self.doc,
            "schema_sha256": self.sha,
            "set_by": self.set_by,
            "set_at": iso_from_ns(self.set_at) if self.set_at else None,
        }


def namespace_member(org: str, namespace: str) -> str:
    """(org, namespace) as one string any id round-trips through: a set member, a planner id."""
    return json.dumps([org, namespace], separators=(",", ":"))


def split_namespace_member(member: str) -> tuple[str, str]:
    org, namespace = json.loads(member)
    return org, namespace


# The field of ``keys.structured_wakes`` counting every namespace's wakes (a namespace's own
# field is a JSON array, never this).
WAKES_TOTAL = "*"


def wake_passes(redis_client: Any, org: str, namespace: str) -> None:
    """Count a wake of the structured passes in the namespace (``keys.structured_wakes``):
    the next scheduler tick then runs a pass even during an idle wait, and scans the
    namespace again even when its last scan found nobody behind."""
    pipe = redis_client.pipeline(transaction=False)
    pipe.hincrby(keys.structured_wakes(), namespace_member(org, namespace), 1)
    pipe.hincrby(keys.structured_wakes(), WAKES_TOTAL, 1)
    pipe.execute()


def parse_stored(row: dict[str, str]) -> StoredSchema | None:
    """The stored schema; ``doc`` None when the stored text no longer parses (no_schema)."""
    if not row:
        return None
    try:
        doc = json.loads(row.get("doc", ""))
        if not isinstance(doc, dict):
            doc = None
    except ValueError:
        doc = None
    return StoredSchema(doc, row.get("sha", ""), row.get("set_by", ""), int(row.get("set_at", 0)))


class ProfileSchemaStore:
    def __init__(self, services: StoreServices) -> None:
        self.redis = services.redis
        self.clock = services.clock
        self.audit = AuditLog(services)

    def get(self, org: str, namespace: str) -> StoredSchema | None:
        return parse_stored(text_map(self.redis.hgetall(keys.profile_schema(org, namespace))))

    def set(
        self, org: str, namespace: str, doc: dict[str, Any], actor: str,
        held: HeldKey | None = None,
    ) -> tuple[str, StoredSchema]:
        """Replace the schema, audited; answers (the old one's sha256, '' none, and the new).
        With ``held`` the reply is kept as the Idempotency-Key's answer in the same MULTI."""
        key = keys.profile_schema(org, namespace)
        new = StoredSchema(doc, schema_sha256(doc), actor, self.clock.now_ns())
        # The namespaces index lives in another slot than the schema, so it cannot share the
        # transaction on Redis Cluster: listed first, a crash leaves a listed namespace with
        # no schema, which a pass skips, never a schema the passes cannot find.
        self.redis.sadd(keys.structured_namespaces(), namespace_member(org, namespace))
        # Kept in the admin's order, not canonical: profile.structured answers the properties
        # in the schema's order (the sha ignores the order, so a reorder rebuilds nobody).
        ordered = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))

        def write(pipe: Any) -> list[Any]:
            old = parse_stored(text_map(pipe.hgetall(key)))
            old_sha = old.sha if old else ""
            pipe.multi()
            pipe.delete(key)
            pipe.hset(key, mapping={"doc": ordered, "sha": new.sha, "set_by": actor,
                                    "set_at": new.set_at})
            self.audit.record(org, namespace, actor, "profile_schema.set", pipeline=pipe,
                              old_schema_sha256=old_sha, new_schema_sha256=new.sha)
            return [old_sha, new.set_at]

        old_sha, _set_at = transact(self.redis, held, [key], write)
        # After the schema is stored, so the pass it wakes reads it (seed 000: a schema change
        # is rebuilt from the next pass on, an idle wait or not).
        wake_passes(self.redis, org, namespace)
        return old_sha, new

    def clear(self, org: str, namespace: str, actor: str,
              held: HeldKey | None = None) -> str | None:
        """Remove the schema, audited; the sha256 of the one removed (None: there was none).
        With ``held`` the reply is kept as the Idempotency-Key's answer in the same MULTI."""
        key = keys.profile_schema(org, namespace)

        def write(pipe: Any) -> str | None:
            old = parse_stored(text_map(pipe.hgetall(key)))
            pipe.multi()
            if old is not None:
                pipe.delete(key)
                self.audit.record(org, namespace, actor, "profile_schema.clear", pipeline=pipe,
                                  old_schema_sha256=old.sha, new_schema_sha256="")
            return None if old is None else old.sha

        old_sha: str | None = transact(self.redis, held, [key], write)
        # Unlisted after the schema is gone, for the same reason as in ``set``.
        self.redis.srem(keys.structured_namespaces(), namespace_member(org, namespace))
        return old_sha

    def namespaces(self) -> list[tuple[str, str]]:
        members = texts(self.redis.smembers(keys.structured_namespaces()))
        return sorted(split_namespace_member(member) for member in members)

    def all_schemas(self) -> list[tuple[str, str, StoredSchema]]:
        """Every namespace with a schema, and the schema: two round trips however many."""
        namespaces = self.namespaces()
        pipe = self.redis.pipeline(transaction=False)
        for org, namespace in namespaces:
            pipe.hgetall(keys.profile_schema(org, namespace))
        found = []
        for (org, namespace), row in zip(namespaces, pipe.execute(), strict=True):
            stored = parse_stored(row)
            if stored is not None:
                found.append((org, namespace, stored))
        return found
