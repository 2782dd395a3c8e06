"""The user's data package (seed 002: "the subject's data package").

``SubjectExportStore.export`` gathers every row with its versions, the working-memory blocks,
the profile sections, the structured profile, the profile's readers and the agent states by
declared field, as one JSON-ready document. Every read names a key of the user's slot or of
the agent-state subject, so it runs unchanged on a Redis Cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from app.clock import iso_from_ns
from app.store import keys
from app.store.activity import RETENTION_DAYS, ActivityStore
from app.store.agent_state import AgentStateStore
from app.store.erasure.run import PROGRESS, Progress
from app.store.erasure.scanning import text
from app.store.identity import Identity
from app.store.memory_row import PROFILE_TYPE, MemoryRow, version_snapshots
from app.store.profile_vectors import ProfileVectorStore
from app.store.structured import PROFILE_KEY
from app.store.working_memory import decode_block

if TYPE_CHECKING:
    from app.store.services import StoreServices

EXPORT_FORMAT = "loom.subject_export.v1"
BATCH = 200


class SubjectExportStore:
    def __init__(self, services: StoreServices) -> None:
        self.services = services
        self.redis = services.redis
        self.clock = services.clock
        self.agent_states = AgentStateStore(services)

    def export(
        self,
        org: str,
        namespace: str,
        user_id: str,
        *,
        subjects: Iterable[str] = (),
        progress: Progress | None = None,
    ) -> dict[str, Any]:
        """The package; ``subjects``: the handles (the user id first) whose states are theirs."""
        progress = progress if progress is not None else PROGRESS.get()
        user = (org, namespace, user_id)
        facts: list[dict[str, Any]] = []
        sections: list[dict[str, Any]] = []
        structured: dict[str, Any] | None = None
        for row, versions in self._rows_with_versions(*user):
            entry = {**row.as_answer(), "versions": [v.as_answer() for v in versions]}
            if row.memory_type == PROFILE_TYPE and row.key == PROFILE_KEY and (
                row.agent == "-" and row.session_id == "-"
            ):
                structured = entry
            elif row.memory_type == PROFILE_TYPE:
                sections.append(entry)
            else:
                facts.append(entry)
        if progress is not None:
            progress("memory", {"memory_rows": len(facts), "profile_sections": len(sections),
                                "structured_profiles": int(structured is not None)})
        working = self._working_memory(*user)
        if progress is not None:
            progress("working_memory", {"working_memory_blocks": sum(
                len(scope["blocks"]) for scope in working)})
        states: list[dict[str, Any]] = []
        for handle in subjects:
            states += self.agent_states.export_subject(org, namespace, handle)
        if progress is not None:
            progress("agent_state", {"agent_states": len(states)})
        section_vectors = [
            {"memory_id": memory_id, "fingerprint": made_from, "vector": vector}
            for memory_id, (made_from, vector) in sorted(
                self.services.store(ProfileVectorStore).vectors(org, namespace, [user_id]).items())
        ]
        readers = self.services.store(ActivityStore).readers(
            Identity(org, namespace, "-", user_id), RETENTION_DAYS, limit=1000
        )
        return {
            "format": EXPORT_FORMAT,
            "org": org,
            "namespace": namespace,
            "user_id": user_id,
            "exported_at": iso_from_ns(self.clock.now_ns()),
            "memory_rows": facts,
            "profile_sections": sections,
            "profile_section_vectors": section_vectors,
            "structured_profile": structured,
            "working_memory": working,
            "agent_states": states,
            "profile_reads": [reader.as_answer() for reader in readers],
            "counts": {
                "memory_rows": len(facts),
                "memory_versions": sum(len(e["versions"]) for e in
                                       [*facts, *sections, *([structured] if structured else [])]),
                "profile_sections": len(sections),
                "structured_profiles": int(structured is not None),
                "working_memory_blocks": sum(len(scope["blocks"]) for scope in working),
                "agent_states": len(states),
                "activity_entries": len(readers),
            },
        }

    def _rows_with_versions(
        self, org: str, namespace: str, user_id: str
    ) -> Iterator[tuple[MemoryRow, list[MemoryRow]]]:
        """Every stored row of the user (tombstones too), each with its versions oldest first."""
        user = (org, namespace, user_id)
        after = "-"
        while True:
            members = [text(m) for m in self.redis.zrangebylex(
                keys.memory_keys(*user), after, "+", start=0, num=BATCH)]
            if not members:
                return
            pipe = self.redis.pipeline(transaction=False)
            for member in members:
                key, agent, session_id = member.split("\x00")
                pipe.hgetall(keys.memory_row(*user, agent, session_id, key))
                pipe.hgetall(keys.memory_versions(*user, agent, session_id, key))
            replies = pipe.execute()
            for i in range(len(members)):
                row, versions = replies[2 * i], replies[2 * i + 1]
                if not row:
                    continue
                # The earlier versions' snapshots, and the current one, which the row holds.
                snapshots = version_snapshots(row, versions)
                yield MemoryRow.from_fields(row), [
                    MemoryRow.from_fields(snapshots[padded]) for padded in sorted(snapshots)
                ]
            after = "(" + members[-1]

    def _working_memory(self, org: str, namespace: str, user_id: str) -> list[dict[str, Any]]:
        scope_keys = sorted(text(k) for k in self.redis.smembers(
            keys.working_memory_scopes(org, namespace, user_id)))
        if not scope_keys:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for key in scope_keys:
            pipe.hgetall(key)
        scopes = []
        for key, raw in zip(scope_keys, pipe.execute(), strict=True):
            if not raw:
                continue
            agent, session_id, run_id = _scope_parts(key)
            blocks = sorted((decode_block(k, v) for k, v in raw.items()),
                            key=lambda block: block.block_key)
            scopes.append({"agent": agent, "session_id": session_id, "run_id": run_id,
                           "blocks": [block.as_answer() for block in blocks]})
        return scopes


def _scope_parts(scope_key: str) -> tuple[str, str, str]:
    """(agent, session_id, run_id) of a working-memory scope key (``keys.working_memory_scope``:
    the tag, then the three escaped components)."""
    tail = scope_key.split("}:", 1)[1]
    agent, session_id, run_id = tail.split(":")
    # keys.escape turns only '%', '{', '}', '/' and ':' into %XX, '%' included: unquote undoes it.
    return unquote(agent), unquote(session_id), unquote(run_id)
