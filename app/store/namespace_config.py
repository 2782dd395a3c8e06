"""A namespace's governance documents in Redis: the features document, the object-types
registry, and the audit log of changes to them.

Seed 002 calls a Loom (org, namespace) a "space". Its features document (``agent_state`` on or
off, the namespace's own ``pii_rules``) and its object-types registry are set whole by an admin
and read on every agent-state call. Both live in one hash under the namespace's hash tag, next to
the audit list, so a document change and its audit entry commit in one MULTI. Documents are kept
normalized (every default filled) and parsed once per distinct text per process.

``AuditLog`` is the namespace's capped, newest-first list of who changed which document when,
with the sha256 of the old and new documents (never the documents themselves). Other planes
record their own governance changes through ``AuditLog.record``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from app.clock import iso_from_ns
from app.errors import SchemaRuleViolation
from app.object_types import ObjectType, validate_object_types
from app.pii import CompiledRule, validate_pii_rules
from app.store import keys
from app.store.idempotency import HeldKey, transact
from app.store.replies import optional_texts

if TYPE_CHECKING:
    from redis.client import Pipeline

    from app.store.services import StoreServices

# Hash fields of the namespace's config row.
FEATURES = "features"
FEATURES_AT = "features_at"
OBJECT_TYPES = "object_types"
OBJECT_TYPES_AT = "object_types_at"
_FIELDS = (FEATURES, FEATURES_AT, OBJECT_TYPES, OBJECT_TYPES_AT)

_FEATURE_KEYS = frozenset({"agent_state", "pii_rules"})

AUDIT_MAX_ENTRIES = 1000
AUDIT_DEFAULT_LIMIT = 50
AUDIT_MAX_LIMIT = 200


def canonical_json(document: Any) -> str:
    """Compact, key-sorted, non-ASCII kept: the one text a document is stored and hashed as."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def document_sha256(document: Any) -> str:
    return hashlib.sha256(canonical_json(document).encode("utf-8")).hexdigest()


# --- the features document ----------------------------------------------------------------------


@dataclass(frozen=True)
class Features:
    """A namespace's features: agent state is off until an admin turns it on."""

    agent_state: bool = False
    pii_rules: tuple[CompiledRule, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "agent_state": self.agent_state,
            "pii_rules": [rule.to_dict() for rule in self.pii_rules],
        }


def validate_features(raw: Any, path: str = "features") -> Features:
    """Validate a features document; raises ``SchemaRuleViolation`` naming the rule and path.

    Unknown keys are refused: a typo such as ``"agent_sate"`` would otherwise leave the feature
    silently off, or a misspelt ``"pii_rule"`` leave text unmasked.
    """
    if not isinstance(raw, Mapping):
        raise SchemaRuleViolation("features_not_object", "features must be an object", field=path)
    unknown = sorted(str(k) for k in raw if k not in _FEATURE_KEYS)
    if unknown:
        raise SchemaRuleViolation(
            "features_unknown_key",
            f"unknown feature(s): {', '.join(unknown)}; known: agent_state, pii_rules",
            field=f"{path}.{unknown[0]}",
        )
    agent_state = raw.get("agent_state", False)
    if not isinstance(agent_state, bool):
        raise SchemaRuleViolation(
            "features_agent_state_invalid",
            "agent_state must be true or false",
            field=f"{path}.agent_state",
        )
    rules = validate_pii_rules(raw.get("pii_rules"), path=f"{path}.pii_rules")
    return Features(agent_state=agent_state, pii_rules=tuple(rules))


# Stored documents were validated when set; parsing them again per distinct text (not per
# request) keeps the PUT path free of regex compilation and schema walks.
@lru_cache(maxsize=512)
def _features_from_text(text: str) -> Features:
    return validate_features(json.loads(text))


@lru_cache(maxsize=512)
def _types_from_text(text: str) -> tuple[ObjectType, ...]:
    return validate_object_types(json.loads(text))


@dataclass(frozen=True)
class NamespaceConfig:
    features: Features
    types: tuple[ObjectType, ...]
    features_doc: dict[str, Any] | None
    types_doc: list[dict[str, Any]] | None
    features_at: int | None
    types_at: int | None

    def type_named(self, name: str | None) -> ObjectType | None:
        if not name:
            return None
        return next((t for t in self.types if t.name == name), None)


def _int_or_none(raw: str | None) -> int | None:
    return None if raw is None else int(raw)


# --- the audit log ------------------------------------------------------------------------------


class AuditLog:
    """A namespace's audit entries: a capped Redis list, newest first.

    ``record(org, namespace, actor, action, **details)`` appends one entry
    ``{"at", "at_ns", "actor", "action", **details}``; pass ``pipeline=`` to fold it into the
    caller's MULTI (the key is under the namespace's hash tag). A write script appends the
    entry itself, in its own step, from ``parts``. Details must never hold content or raw ids:
    the convention is the sha256 of the old and new documents (``old_sha256``/``new_sha256``)
    and counts.
    """

    def __init__(self, services: StoreServices) -> None:
        self.redis = services.redis
        self.clock = services.clock

    def record(
        self,
        org: str,
        namespace: str,
        actor: str,
        action: str,
        *,
        pipeline: Pipeline | None = None,
        **details: Any,
    ) -> dict[str, Any]:
        entry = self._entry(actor, action, details)
        key = keys.namespace_audit(org, namespace)
        connection = pipeline if pipeline is not None else self.redis.pipeline(transaction=True)
        connection.lpush(key, canonical_json(entry))
        connection.ltrim(key, 0, AUDIT_MAX_ENTRIES - 1)
        if pipeline is None:
            connection.execute()
        return entry

    def _entry(self, actor: str, action: str, details: Mapping[str, Any]) -> dict[str, Any]:
        now = self.clock.now_ns()
        return {"at": iso_from_ns(now), "at_ns": now, "actor": actor, "action": action,
                **details}

    def parts(
        self, actor: str, action: str, filled: Sequence[str], **details: Any
    ) -> list[str]:
        """The entry's JSON cut where a write script puts the values named ``filled`` (each a
        JSON number or null, in the order of their names): a value only the script knows (a
        count it deleted, the caps it replaced) so goes into the entry in the write's step."""
        if list(filled) != sorted(filled):
            raise ValueError("filled values are named in the order canonical_json writes them")
        text = canonical_json(self._entry(actor, action, {**details, **dict.fromkeys(filled, 0)}))
        cut: list[str] = []
        for name in filled:
            # A name's text with its quotes is found only as the key: a quote inside a value
            # is escaped.
            head, found, text = text.partition(f'"{name}":0')
            assert found, name
            cut.append(f'{head}"{name}":')
        return [*cut, text]

    def entries(
        self, org: str, namespace: str, limit: int = AUDIT_DEFAULT_LIMIT
    ) -> list[dict[str, Any]]:
        raw = self.redis.lrange(keys.namespace_audit(org, namespace), 0, limit - 1)
        return [json.loads(item) for item in raw]


# --- the store ----------------------------------------------------------------------------------


class NamespaceConfigStore:
    def __init__(self, services: StoreServices) -> None:
        self.redis = services.redis
        self.clock = services.clock
        self.audit = AuditLog(services)

    # Reads. ``queue_read`` + ``decode`` let another store fold the config read into its own
    # round trip (the agent-state PUT reads the config and the state together).

    @staticmethod
    def queue_read(pipe: Pipeline, org: str, namespace: str) -> None:
        pipe.hmget(keys.namespace_config(org, namespace), _FIELDS)

    @staticmethod
    def decode(reply: list[str | None]) -> NamespaceConfig:
        features_text, features_at, types_text, types_at = reply
        return NamespaceConfig(
            features=_features_from_text(features_text) if features_text else Features(),
            types=_types_from_text(types_text) if types_text else (),
            features_doc=json.loads(features_text) if features_text else None,
            types_doc=json.loads(types_text) if types_text else None,
            features_at=_int_or_none(features_at),
            types_at=_int_or_none(types_at),
        )

    def get(self, org: str, namespace: str) -> NamespaceConfig:
        stored = self.redis.hmget(keys.namespace_config(org, namespace), _FIELDS)
        return self.decode(optional_texts(stored))

    # Writes: each replaces one whole document and audits it in the same transaction.

    def set_features(
        self, org: str, namespace: str, raw: Any, actor: str, held: HeldKey | None = None,
    ) -> tuple[Features, str, int]:
        features = validate_features(raw)
        document = features.to_dict()
        sha, at = self._replace(
            org, namespace, FEATURES, FEATURES_AT, document, actor, "features.set",
            lambda doc: {"agent_state": doc["agent_state"], "pii_rules": len(doc["pii_rules"])},
            held,
        )
        return features, sha, at

    def set_object_types(
        self, org: str, namespace: str, raw: Any, actor: str, held: HeldKey | None = None,
    ) -> tuple[tuple[ObjectType, ...], str, int]:
        types = validate_object_types(raw)
        document = [t.to_dict() for t in types]
        sha, at = self._replace(
            org, namespace, OBJECT_TYPES, OBJECT_TYPES_AT, document, actor, "object_types.set",
            lambda doc: {"types": [t["type"] for t in doc]},
            held,
        )
        return types, sha, at

    def _replace(
        self,
        org: str,
        namespace: str,
        field: str,
        at_field: str,
        document: Any,
        actor: str,
        action: str,
        summary: Callable[[Any], dict[str, Any]],
        held: HeldKey | None = None,
    ) -> tuple[str, int]:
        """Replace one document and audit it in one MULTI (with ``held``, the reply is kept
        as the Idempotency-Key's answer there too): (sha256, written at)."""
        key = keys.namespace_config(org, namespace)
        text = canonical_json(document)
        new_sha = document_sha256(document)

        def write(pipe: Pipeline) -> list[Any]:
            # WATCHed (transact), so the audit entry's old_sha256 is the document this write
            # replaced: another admin's write between the read and EXEC reads again.
            old = pipe.hget(key, field)
            old_sha = None if old is None else document_sha256(json.loads(old))
            now = self.clock.now_ns()
            pipe.multi()
            pipe.hset(key, mapping={field: text, at_field: now})
            self.audit.record(
                org, namespace, actor, action, pipeline=pipe,
                old_sha256=old_sha, new_sha256=new_sha, **summary(document),
            )
            return [new_sha, now]

        sha, at = transact(self.redis, held, [key], write)
        return str(sha), int(at)
