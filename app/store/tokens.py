"""API tokens in Redis: claims and a keyed hash, never the secret.

A token reads ``loom_<token_id>_<secret>``. The id finds the row in one HGETALL; the row keeps
an HMAC-SHA256 of the whole token under ``LOOM_SECRET_KEY``, compared in constant time. A
revoked or expired row fails on its next use: nothing is cached between requests.

A token created under an Idempotency-Key has a secret derived from ``LOOM_SECRET_KEY``, its id
and a random nonce (``_derived_secret``): the key's record keeps the id and the nonce, never the
secret, so a retry answers the same token and a copy of the data without the key yields none.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.principal import ANY, Principal
from app.store import keys
from app.store.idempotency import HeldKey, transact
from app.store.replies import text_map, text_set

if TYPE_CHECKING:
    from app.store.services import StoreServices

TOKEN_PREFIX = "loom_"


@dataclass(frozen=True)
class TokenRow:
    token_id: str
    claims: dict[str, Any]
    created_at: int
    created_by: str
    revoked_at: int | None

    def as_answer(self) -> dict[str, Any]:
        return {
            "token_id": self.token_id,
            **self.claims,
            "created_at": self.created_at,
            "created_by": self.created_by,
            "revoked": self.revoked_at is not None,
            "revoked_at": self.revoked_at,
        }


def principal_from_claims(claims: dict[str, Any], token_id: str, default_org: str) -> Principal:
    return Principal(
        org=claims["org"],
        namespace=claims.get("namespace") or ANY,
        role=claims["role"],
        read_scope=claims.get("read_scope") or "namespace",
        read_user_id=claims.get("read_user_id"),
        session_id=claims.get("session_id"),
        agent=claims.get("agent"),
        scopes=frozenset(claims.get("scopes") or ()),
        token_id=token_id,
        default_org=default_org,
        expires_at=claims.get("expires_at"),
    )


class TokenStore:
    def __init__(self, services: StoreServices) -> None:
        self.redis = services.redis
        self.clock = services.clock
        self._key = services.settings.secret_key.encode()

    def _digest(self, token: str) -> str:
        return hmac.new(self._key, token.encode(), hashlib.sha256).hexdigest()

    def create(self, claims: dict[str, Any], created_by: str,
               held: HeldKey | None = None) -> tuple[str, TokenRow]:
        """Mint a token: (the token, its row). With ``held`` (an Idempotency-Key in the org's
        slot) the org's list takes the id in the same MULTI as the key keeps ``[id, nonce,
        created_at]``, then ``recreate`` writes the row from them, as a retry does."""
        token_id = secrets.token_hex(8)
        now = self.clock.now_ns()
        if held is not None:
            kept = [token_id, secrets.token_hex(16), now]

            def write(pipe: Any) -> list[Any]:
                pipe.multi()
                pipe.sadd(keys.org_tokens(claims["org"]), token_id)
                return kept

            transact(self.redis, held, [], write)
            return self.recreate(claims, created_by, kept)
        token = f"{TOKEN_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(keys.token(token_id), mapping={
            "hash": self._digest(token),
            "claims": json.dumps(claims, sort_keys=True),
            "created_at": now,
            "created_by": created_by,
        })
        pipe.sadd(keys.org_tokens(claims["org"]), token_id)
        pipe.execute()
        return token, TokenRow(token_id, claims, now, created_by, None)

    def recreate(self, claims: dict[str, Any], created_by: str,
                 kept: list[Any]) -> tuple[str, TokenRow]:
        """The token a keyed ``create`` kept ``[id, nonce, created_at]`` for, its row written
        when missing (a try cut after the org's list took the id): the same token every time."""
        token_id, nonce, created_at = str(kept[0]), str(kept[1]), int(kept[2])
        token = f"{TOKEN_PREFIX}{token_id}_{self._derived_secret(token_id, nonce)}"
        key = keys.token(token_id)
        if not self.redis.exists(key):
            self.redis.hset(key, mapping={
                "hash": self._digest(token),
                "claims": json.dumps(claims, sort_keys=True),
                "created_at": created_at,
                "created_by": created_by,
            })
        return token, TokenRow(token_id, claims, created_at, created_by, None)

    def _derived_secret(self, token_id: str, nonce: str) -> str:
        mac = hmac.new(self._key, f"token-secret\0{token_id}\0{nonce}".encode(),
                       hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def principal_for(self, token: str, default_org: str) -> Principal | None:
        """The token's principal, or None when unknown, revoked or expired."""
        if not token.startswith(TOKEN_PREFIX):
            return None
        token_id, _, secret = token[len(TOKEN_PREFIX):].partition("_")
        if not token_id or not secret:
            return None
        row = text_map(self.redis.hgetall(keys.token(token_id)))
        # Compare even when the row is missing, so timing does not tell which ids exist.
        stored = row.get("hash", "0" * 64)
        if not hmac.compare_digest(stored, self._digest(token)) or not row:
            return None
        return self._principal_of_row(token_id, row, default_org)

    def principal_by_id(self, token_id: str, default_org: str) -> Principal | None:
        """The principal of the token with this id, or None when unknown, revoked or expired:
        for a holder that proved the whole token once (a console session) and keeps only its
        id, which works as no token."""
        row = text_map(self.redis.hgetall(keys.token(token_id))) if token_id else {}
        return self._principal_of_row(token_id, row, default_org) if row else None

    @staticmethod
    def token_id_of(token: str) -> str:
        """The id part of ``loom_<token_id>_<secret>`` ('' for anything else)."""
        if not token.startswith(TOKEN_PREFIX):
            return ""
        token_id, _, secret = token[len(TOKEN_PREFIX):].partition("_")
        return token_id if secret else ""

    def _principal_of_row(
        self, token_id: str, row: dict[str, str], default_org: str
    ) -> Principal | None:
        if row.get("revoked_at"):
            return None
        claims = json.loads(row["claims"])
        expires_at = claims.get("expires_at")
        if expires_at is not None and self.clock.now_ns() >= expires_at:
            return None
        return principal_from_claims(claims, token_id, default_org)

    def get(self, token_id: str) -> TokenRow | None:
        row = text_map(self.redis.hgetall(keys.token(token_id)))
        return _row(token_id, row) if row else None

    def revoke(self, token_id: str, held: HeldKey | None = None) -> bool:
        """Mark the row revoked; the hash stays so a revoked token is told apart from a typo.
        With ``held`` (an Idempotency-Key in the token's slot) the key keeps the reply in the
        same MULTI."""
        key = keys.token(token_id)

        def write(pipe: Any) -> bool:
            revoked = not pipe.hexists(key, "revoked_at")
            pipe.multi()
            pipe.hsetnx(key, "revoked_at", self.clock.now_ns())
            return revoked

        return bool(transact(self.redis, held, [key], write))

    def revoke_pinned_to(self, org: str, namespace: str, user_id: str, user_digest: str) -> int:
        """Revoke every token of the org pinned to the user (in this namespace or all of them),
        keeping ``user_digest`` in their claims in place of the user id; how many there were.

        Idempotent: a row revoked and rewritten by an earlier attempt names the digest, so a
        retry finds nothing left to do."""
        done = 0
        for row in self.pinned_to(org, namespace, user_id):
            key = keys.token(row.token_id)

            def rewrite(pipe: Any, key: str = key) -> None:
                stored = pipe.hgetall(key)
                current = json.loads(stored.get("claims") or "{}")
                if current.get("read_user_id") != user_id:
                    return
                current["read_user_id"] = user_digest
                pipe.multi()
                pipe.hset(key, "claims", json.dumps(current, sort_keys=True))
                pipe.hsetnx(key, "revoked_at", self.clock.now_ns())

            self.redis.transaction(rewrite, key)
            done += 1
        return done

    def pinned_to(self, org: str, namespace: str, user_id: str) -> list[TokenRow]:
        """The org's tokens whose claims pin the user of this namespace (a token pinned in
        every namespace reaches them too)."""
        return [row for row in self.list(org)
                if row.claims.get("read_user_id") == user_id
                and row.claims.get("namespace") in (namespace, ANY, None)]

    def list(self, org: str) -> list[TokenRow]:
        token_ids = sorted(text_set(self.redis.smembers(keys.org_tokens(org))))
        pipe = self.redis.pipeline(transaction=False)
        for token_id in token_ids:
            pipe.hgetall(keys.token(token_id))
        rows = pipe.execute()
        return [_row(tid, row) for tid, row in zip(token_ids, rows, strict=True) if row]


def _row(token_id: str, row: dict[str, str]) -> TokenRow:
    revoked = row.get("revoked_at")
    return TokenRow(
        token_id=token_id,
        claims=json.loads(row["claims"]),
        created_at=int(row["created_at"]),
        created_by=row.get("created_by", ""),
        revoked_at=int(revoked) if revoked else None,
    )
