"""The vectors of profile sections: what loom_search's profile leg scores by meaning.

Per user (the user's slot): ``keys.profile_vectors`` (memory_id -> ``fingerprint:vector``) and
``keys.profile_vectors_queued`` (a marker that a refresh is queued). Every write of a profile
row (``MemoryStore._after_write``) asks for a refresh of the user's section vectors: with an
embeddings endpoint configured, a refresh is asked of the job dispatcher
(``intents.RefreshProfileVectors``), once for a burst of writes, and a job computes the
vectors off the request path. A redact drops the vectors of the rows it scrubbed at once,
beside the write.

A vector is stored with its fingerprint: the model, the asked length and the section's
``content_sha256``. The search uses a vector only when its fingerprint is the one the section
holds now, so a vector of text a later write replaced is never scored, whether or not its
refresh has run yet. ``profile_vector_store.lua`` stores a vector only while the row still
holds the content it was made from, is live, unredacted and a profile row, and the user is not
being erased, so a job that raced a redact, a delete or an erasure lands nothing.

Vectors are unit length, float32: a few sections a user, so their size is small and the scoring
exact (a dot product in Python). On a server with Redis 8's vector sets they live in the user's
``keys.profile_vector_set`` unquantised (NOQUANT: the export carries them as they were made) and
the hash holds each one's fingerprint alone; elsewhere the hash holds ``fingerprint:base64``.
Every key sits under the user's hash tag, so the erasure's sweep takes them with the user's rows
and its census looks for them; a redact and the job's drop take an element out of the set with
its fingerprint.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import math
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

import redis

from app.store import keys
from app.store.intents import RefreshProfileVectors
from app.store.lua import script
from app.store.recall_vectors import VECTORSET, engine_of
from app.store.replies import text_map
from app.store.script_interfaces import PROFILE_VECTOR_STORE

if TYPE_CHECKING:
    from app.store.memory_row import Location
    from app.store.services import StoreServices

log = logging.getLogger("loom.store.profile_vectors")

FINGERPRINT_CHARS = 16
# A queued marker outlives a job that never started (the queue was down) by this long; the
# user's next write after it enqueues again.
QUEUED_MARKER_SECONDS = 600


def fingerprint(model: str, dimensions: int | None, content_sha256: str) -> str:
    """What a stored vector was made from: the model, the asked length, the section's content."""
    made_from = f"{model}\x00{dimensions or 0}\x00{content_sha256}".encode()
    return hashlib.sha1(made_from, usedforsecurity=False).hexdigest()[:FINGERPRINT_CHARS]


def unit(vector: Sequence[float]) -> list[float]:
    norm = math.sqrt(sum(value * value for value in vector))
    return [value / norm for value in vector] if norm > 0 else [0.0 for _ in vector]


def encode_vector(vector: Sequence[float], made_from: str) -> str:
    packed = array("f", unit(vector)).tobytes()
    return made_from + ":" + base64.b64encode(packed).decode("ascii")


def decode_vector(stored: str) -> tuple[str, list[float]]:
    """The fingerprint and the unit vector of a stored value."""
    made_from, _, packed = stored.partition(":")
    values = array("f")
    values.frombytes(base64.b64decode(packed))
    return made_from, values.tolist()


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Of two unit vectors (0 when their lengths differ: another model made one of them)."""
    if len(a) != len(b):
        return 0.0
    return sum(x * y for x, y in zip(a, b, strict=True))


class ProfileVectorStore:
    def __init__(self, services: StoreServices) -> None:
        self.services = services
        self.redis = services.redis
        self._store = script(self.redis, "profile_vector_store")
        self._clustered = isinstance(self.redis, redis.RedisCluster)
        self.on_engine = engine_of(self.redis) == VECTORSET

    # --- the search's side -------------------------------------------------------------------

    def vectors(self, org: str, namespace: str,
                user_ids: Iterable[str]) -> dict[str, tuple[str, list[float]]]:
        """memory_id -> (fingerprint, unit vector) of these users' sections (on the engine,
        each one the set holds, read back with VEMB)."""
        users = list(dict.fromkeys(user_ids))
        if not users:
            return {}
        replies = self._each_user(users, lambda pipe, user_id: pipe.hgetall(
            keys.profile_vectors(org, namespace, user_id)))
        found: dict[str, tuple[str, list[float]]] = {}
        if not self.on_engine:
            for reply in replies:
                for memory_id, stored in text_map(reply).items():
                    if ":" in stored:
                        found[memory_id] = decode_vector(stored)
            return found
        wanted = [(user_id, memory_id, made_from.partition(":")[0])
                  for user_id, reply in zip(users, replies, strict=True)
                  for memory_id, made_from in text_map(reply).items()]
        pipe = self.redis.pipeline(transaction=False)
        for user_id, memory_id, _ in wanted:
            cast(Any, pipe).execute_command(
                "VEMB", keys.profile_vector_set(org, namespace, user_id), memory_id)
        for (_, memory_id, made_from), vector in zip(
                wanted, pipe.execute(raise_on_error=False), strict=True):
            if vector and not isinstance(vector, Exception):
                found[memory_id] = (made_from, [float(value) for value in vector])
        return found

    def _each_user(self, users: Sequence[str],
                   command: Callable[[Any, str], object]) -> list[Any]:
        """One command a user: pipelined on one server, one by one on a cluster (each user's
        keys in their own slot)."""
        if self._clustered:
            return [command(self.redis, user_id) for user_id in users]
        pipe = self.redis.pipeline(transaction=False)
        for user_id in users:
            command(pipe, user_id)
        return list(pipe.execute())

    # --- the job's side ----------------------------------------------------------------------

    def fingerprints(self, org: str, namespace: str, user_id: str) -> dict[str, str]:
        """memory_id -> fingerprint of every vector the user has where a search reads it (on
        the engine, in the set; elsewhere, after its fingerprint): the job embeds the rest."""
        stored = text_map(self.redis.hgetall(keys.profile_vectors(org, namespace, user_id)))
        if not self.on_engine:
            # A fingerprint without its vector (written on a server with the engine) is none.
            return {memory_id: value.partition(":")[0] for memory_id, value in stored.items()
                    if ":" in value}
        ids = list(stored)
        pipe = self.redis.pipeline(transaction=False)
        vector_set = keys.profile_vector_set(org, namespace, user_id)
        for memory_id in ids:
            cast(Any, pipe).execute_command("VISMEMBER", vector_set, memory_id)
        return {memory_id: stored[memory_id].partition(":")[0]
                for memory_id, member in zip(ids, pipe.execute(), strict=True) if member}

    def store(self, location: Location, memory_id: str, content_sha256: str,
              vector: Sequence[float], made_from: str) -> bool:
        """Store a section's vector unless its row moved on since it was read (see module)."""
        org, namespace, user_id = location.org, location.namespace, location.user_id
        if self.on_engine:
            value, packed = made_from, array("f", unit(vector)).tobytes()
        else:
            value, packed = encode_vector(vector, made_from), b""
        stored = self._store(*PROFILE_VECTOR_STORE.ordered(
            keys={"row": location.row_key(),
                  "profile_vectors": keys.profile_vectors(org, namespace, user_id),
                  "erasing": keys.user_erasing(org, namespace, user_id),
                  "section_vector_set": keys.profile_vector_set(org, namespace, user_id)},
            args={"memory_id": memory_id, "content_sha256": content_sha256, "stored": value,
                  "vector": packed}))
        return bool(int(stored))

    def drop(self, org: str, namespace: str, user_id: str, memory_ids: Iterable[str]) -> int:
        ids = list(memory_ids)
        if not ids:
            return 0
        if not self.on_engine:
            return int(self.redis.hdel(keys.profile_vectors(org, namespace, user_id), *ids))
        # Both keys are in the user's slot: on one server one transaction takes the
        # fingerprint and the vector together.
        pipe = self.redis.pipeline(transaction=not self._clustered)
        pipe.hdel(keys.profile_vectors(org, namespace, user_id), *ids)
        vector_set = keys.profile_vector_set(org, namespace, user_id)
        for memory_id in ids:
            cast(Any, pipe).execute_command("VREM", vector_set, memory_id)
        return int(pipe.execute()[0])

    def claim_queued(self, org: str, namespace: str, user_id: str) -> None:
        """Take the queued marker down as a job starts: a write from now on enqueues again."""
        self.redis.delete(keys.profile_vectors_queued(org, namespace, user_id))

    # --- the writes' side --------------------------------------------------------------------

    def embeddings_on(self) -> bool:
        return self.services.settings.embeddings_configured

    def section_written(self, org: str, namespace: str, user_id: str) -> None:
        """A profile row of the user was written: enqueue a refresh of the user's section
        vectors, unless one is queued already or no embeddings endpoint is configured. A queue
        that cannot be reached costs the write nothing: the marker goes, and the next write
        enqueues again (until then the search scores the sections lexically)."""
        if not self.embeddings_on():
            return
        marker = keys.profile_vectors_queued(org, namespace, user_id)
        if not self.redis.set(marker, "1", nx=True, ex=QUEUED_MARKER_SECONDS):
            return
        try:
            self.services.jobs.dispatch(RefreshProfileVectors(org, namespace, user_id))
        except redis.RedisError as error:
            self.redis.delete(marker)
            log.warning("profile vectors: could not enqueue a refresh for %s/%s: %s",
                        org, namespace, error)
