"""The identity tuple every row is keyed by."""

from __future__ import annotations

from dataclasses import dataclass

from app.store import keys


@dataclass(frozen=True, slots=True)
class Identity:
    org: str
    namespace: str
    agent: str = "-"
    user_id: str = "-"
    session_id: str = "-"
    run_id: str = "-"

    @property
    def user_tag(self) -> str:
        return keys.user_tag(self.org, self.namespace, self.user_id)

    def with_(self, **changes: str) -> Identity:
        values = {
            "org": self.org,
            "namespace": self.namespace,
            "agent": self.agent,
            "user_id": self.user_id,
            "session_id": self.session_id,
            "run_id": self.run_id,
        }
        values.update(changes)
        return Identity(**values)
