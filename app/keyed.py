"""Keyed hashes of identifiers: what Loom stores in place of an id it must not keep raw.

``keyed_digest`` is HMAC-SHA256 under the install's secret over a purpose tag and the parts,
each preceded by its length (4 bytes, big-endian), so the encoding is injective: no two
tuples of parts, and no two purposes, share a digest.
"""

from __future__ import annotations

import hashlib
import hmac


def keyed_digest(secret: bytes, purpose: bytes, *parts: str) -> str:
    if not isinstance(secret, bytes | bytearray) or not secret:
        # A programming or deployment error, not bad input: never digest under an empty key.
        raise ValueError("keyed digests need a non-empty secret (bytes)")
    encoded = (purpose, *(part.encode("utf-8") for part in parts))
    message = b"".join(len(p).to_bytes(4, "big") + p for p in encoded)
    return hmac.new(bytes(secret), message, hashlib.sha256).hexdigest()
