"""The console's sessions, kept server-side: the cookie holds only a random session id.

Each session is one JSON string under the keyed hash of its id (so a copy of Redis does not
hold ids that work as cookies), expiring with the session. Signing out deletes it, so a copied
cookie stops working at once; the console deletes it too when its token stops working.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from app.keyed import keyed_digest
from app.store import keys

if TYPE_CHECKING:
    from app.store.services import StoreServices

_PURPOSE = b"loom.console.session.v1"


class ConsoleSessionStore:
    def __init__(self, services: StoreServices) -> None:
        self.redis = services.redis
        self.secret = services.settings.secret_key.encode("utf-8")

    def _key(self, sid: str) -> str:
        return keys.console_session(keyed_digest(self.secret, _PURPOSE, sid))

    def load(self, sid: str) -> dict[str, Any] | None:
        raw = self.redis.get(self._key(sid))
        if raw is None:
            return None
        data = json.loads(raw)
        return data if isinstance(data, dict) else None

    def save(self, sid: str, data: dict[str, Any], seconds: int) -> None:
        self.redis.set(self._key(sid), json.dumps(data, separators=(",", ":")), ex=seconds)

    def delete(self, sid: str) -> None:
        self.redis.delete(self._key(sid))
