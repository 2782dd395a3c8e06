"""The vector leg of recall: each fact's embedding in its user's slot, scored by the server's
vector engine where it has one, by exact cosine here where it has not.

Per user (the user's slot, beside the lexical index): ``keys.recall_vectors`` (memory_id ->
fingerprint, and on a server without vector sets the vector after it), ``keys.recall_vectors_due``
(the memory_ids whose text changed since their vector was stored) and, on a server with Redis 8's
vector sets (``detect_engine`` answers ``vectorset``), ``keys.recall_vector_set``: element
memory_id, the vector quantised by the server (Q8, docs/decisions.md). Every key carries the
user's hash tag, so one script keeps them with the row on Redis Cluster. The memory write scripts
keep them atomically with the row (``index_recall`` in app/store/lua/memory_write.lua): a write
that changes a fact's indexed text drops its vector (VREM where the set holds it) and lists it as
due; a delete, a redact, a ``forget`` tag or a profile type drops the vector and the listing. A
lock or pin leaves both as they were, so it costs no call.

The embeddings job (jobs/recall_embed.py) reads the due rows, embeds their text and stores each
vector with ``recall_vector_store.lua``, which checks the row's version first: a vector of a text
that a later write replaced, or of a row deleted or redacted meanwhile, never lands.

A vector is L2-normalised and quantised to int8 (127 steps a unit): on a server without the
engine stored base64 after its fingerprint, 384 bytes for a 384-dimension model instead of 1,536
as float32; on the engine the same int8 values go to VADD, so both rank the same vectors. The
fingerprint (sha1 of model, dimensions and text, 16 hex) tells the job a row whose text and model
are those of its vector, which costs no call.

In the namespace's slot, on the engine, ``keys.recall_namespace_vector_set`` holds every fact
vector of the namespace again (element user NUL memory_id, attribute the user), kept in the same
step as the user's set on one server and in a second step on Redis Cluster (docs/decisions.md).

Search on the engine is one VSIM a user in scope for ``own_user``/``own_session`` (pipelined),
and one VSIM over the namespace's set for a namespace search, as deep as the search asks.
Without the engine, the vectors of the users in scope are read in one pipeline (one HGETALL a
user, each in its own slot on Redis Cluster), kept decoded in this process while each user's
generation holds, and a namespace's are laid out as one contiguous matrix, so a search is one
product over it.
"""

from __future__ import annotations

import binascii
import hashlib
import json
import logging
import threading
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import redis

from app.store import keys
from app.store.intents import EmbedUserFacts
from app.store.lua import script
from app.store.replies import optional_texts
from app.store.script_interfaces import RECALL_VECTOR_QUEUE, RECALL_VECTOR_STORE

if TYPE_CHECKING:
    from app.store.services import StoreServices

log = logging.getLogger("loom.store.recall_vectors")

FINGERPRINT_CHARS = 16
QUANT_STEPS = 127
# A queued-job marker names its job and lapses after this long, after which the user's next write
# enqueues again; the sweep enqueues sooner for a marker whose job no longer waits in its queue.
QUEUED_MARKER_SECONDS = 600
# What recall_vector_store.lua answers: outcomes the job counts, never refusals of a caller.
STORE_OUTCOMES = ("OK", "MOVED", "GONE", "ERASING")
# Namespaces whose vectors one process keeps laid out as one matrix (views of the same memory
# as the users' kept vectors, so they add nothing but while one is rebuilt).
CACHE_SCOPES_MAX = 8
# The engine's search effort: VSIM explores at least this many candidates (its EF), or as many
# as the search asks for (bench/recall_vectors.py prints the share of the exact top 40 found).
ENGINE_EF_MIN = 200
# The deepest one VSIM goes, its COUNT and its EF alike: a search's deeper rounds (a filter that
# keeps few hits reads on to CANDIDATES_MAX, 4,000) asked VSIM for 4,000 at EF 4,000. One VSIM
# over a namespace set of 100,000 vectors (bench/recall_vectors.py, Redis 8.2, a loaded 2-core
# machine) took 18.5 ms at depth 310, 28.8 at 1,000 and 92.5 at 4,000 by the server's clock, so
# 500 keeps it near 22 ms, under the 25 ms a call may hold the server; a normal search's depth
# (limit 100: 310) is under it, so its hits are unchanged. A deeper round gets the vector leg's
# best ENGINE_DEPTH_MAX and the lexical leg's to its full depth.
ENGINE_DEPTH_MAX = 500
VECTORSET = "vectorset"
# Due lists whose lengths one pipeline of the backlog's count reads.
BACKLOG_BATCH = 500
# The most vectors one call reads of a user's (an HSCAN's COUNT): a user of 10,000 facts read
# in one HGETALL held the server 3 ms, and 35 ms on a loaded machine (bench/recall.py).
VECTORS_PER_CALL = 1000


def new_job_id() -> str:
    """The id of an embeddings job, set in the user's queued marker before it is enqueued."""
    return str(uuid.uuid4())


@dataclass(frozen=True, slots=True)
class VectorHit:
    """One fact the vector leg found: where, and its cosine to the query."""

    user_id: str
    memory_id: str
    score: float


@dataclass(frozen=True, slots=True)
class DueUser:
    """A user with rows waiting for a vector, and its place in the sweep's turn order."""

    position: str
    org: str
    namespace: str
    user_id: str


@dataclass(frozen=True, slots=True)
class Backlog:
    """Facts waiting for a vector (listed due: written or changed since their vector was
    stored, or never embedded), and how many users they belong to."""

    facts: int = 0
    users: int = 0

    def __add__(self, other: Backlog) -> Backlog:
        return Backlog(self.facts + other.facts, self.users + other.users)


@dataclass(frozen=True, slots=True)
class DueRow:
    """A row listed as due for a vector: its memory_id and its row key (None: gone)."""

    memory_id: str
    row_key: str | None


def fingerprint(model: str, dimensions: int | None, text: str) -> str:
    """What a stored vector was made from: the model, the asked length and the text."""
    digest = hashlib.sha1(f"{model}\x00{dimensions or 0}\x00{text}".encode(), usedforsecurity=False)
    return digest.hexdigest()[:FINGERPRINT_CHARS]


def encode_vector(vector: Sequence[float], made_from: str) -> str:
    """The stored form: ``fingerprint:`` then the unit vector as int8, base64."""
    values = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(values))
    if norm > 0:
        values = values / norm
    quantised = np.clip(np.rint(values * QUANT_STEPS), -QUANT_STEPS, QUANT_STEPS).astype(np.int8)
    return made_from + ":" + binascii.b2a_base64(quantised.tobytes(), newline=False).decode()


def decode_vector(stored: str) -> np.ndarray:
    """The int8 vector of a stored value (as float32, not normalised back)."""
    raw = binascii.a2b_base64(stored[FINGERPRINT_CHARS + 1:])
    return np.frombuffer(raw, dtype=np.int8).astype(np.float32)


def detect_engine(client: redis.Redis) -> str:
    """The vector engine the server offers: ``vectorset`` (Redis 8's VADD/VSIM), ``search``
    (RediSearch or valkey-search's FT.*) or ``none``."""
    # Each command is sent without arguments: a server that has it answers "wrong number of
    # arguments", one that has not "unknown command" (COMMAND INFO's reply for an unknown
    # name is not one redis-py parses).
    # A cluster sends a command without a key to one node of its choosing: every node runs
    # the same server.
    where: dict[str, Any] = ({"target_nodes": redis.RedisCluster.RANDOM}
                             if isinstance(client, redis.RedisCluster) else {})
    for command, engine in (("VSIM", VECTORSET), ("FT.SEARCH", "search")):
        try:
            cast(Any, client).execute_command(command, **where)
        except redis.ResponseError as error:
            if "unknown command" in str(error).lower():
                continue
            return engine
        except (redis.RedisError, redis.exceptions.RedisClusterException):
            continue
        return engine
    return "none"


_engines: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_engines_lock = threading.Lock()


def engine_of(client: redis.Redis) -> str:
    """``detect_engine`` once per client: every store on it asks the server once."""
    with _engines_lock:
        found = _engines.get(client)
    if found is None:
        found = detect_engine(client)
        with _engines_lock:
            _engines[client] = found
    return found


def vector_bytes(stored: str) -> bytes:
    """The FP32 bytes VADD takes of a stored value's int8 vector (the same values either way)."""
    return decode_vector(stored).tobytes()


@dataclass(frozen=True, slots=True)
class VectorsSeen:
    """What ``has_vectors`` read: whether any user in scope has a vector (truthy if so) and,
    on exact cosine, each user's generation, read in the same round trip; ``nearest`` takes
    them rather than reading them again, so the search answers from the vectors as they stood
    when it began."""

    found: bool
    users: tuple[str, ...] = ()
    generations: tuple[str, ...] | None = None

    def __bool__(self) -> bool:
        return self.found


@dataclass(frozen=True, slots=True)
class _Block:
    """One user's vectors of one length, decoded: ids and the int8 rows as float32 unit rows
    (divided by their norms once, here, so a search's cosine is one product)."""

    generation: str
    ids: list[str]
    matrix: np.ndarray


@dataclass(frozen=True, slots=True)
class _Scope:
    """A namespace's kept vectors as one matrix: the users and generations it was laid out
    from, each row's owner (an index into ``users``) and memory_id."""

    users: tuple[str, ...]
    generations: tuple[str, ...]
    owners: np.ndarray
    ids: list[str]
    matrix: np.ndarray


def _ask_generation(pipe: Any, org: str, namespace: str, user_id: str) -> None:
    """Queue the read of a user's vectors generation on ``pipe``; ``_generation`` reads it."""
    pipe.hmget(keys.recall_vectors_generation(org, namespace, user_id), ["born", "n"])


def _generation(reply: Sequence[object]) -> str:
    born, count = reply
    return f"{born or ''}:{count or 0}"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _decode_block(generation: str, stored: dict[str, str], width: int) -> _Block:
    # One decode and one array for every vector: per-vector numpy calls would cost more than
    # the scoring. A value without a payload (its vector is in a vector set) is skipped.
    ids: list[str] = []
    payloads: list[bytes] = []
    for memory_id, value in stored.items():
        raw = binascii.a2b_base64(value[FINGERPRINT_CHARS + 1:])
        if len(raw) == width:
            ids.append(memory_id)
            payloads.append(raw)
    quantised = np.frombuffer(b"".join(payloads), dtype=np.int8).reshape(-1, width)
    matrix = quantised.astype(np.float32)
    norms = np.sqrt(np.einsum("ij,ij->i", matrix, matrix))
    norms[norms == 0] = 1.0
    return _Block(generation, ids, matrix / norms[:, None])


def _best(scores: np.ndarray, top: int) -> np.ndarray:
    """The rows scoring at least the top-th best and above 0, ties kept whole (the caller
    orders them by (-score, memory_id): the same answer as sorting every row)."""
    if len(scores) > top:
        floor = np.partition(scores, len(scores) - top)[len(scores) - top]
        return np.flatnonzero((scores >= floor) & (scores > 0))
    return np.flatnonzero(scores > 0)


class RecallVectorStore:
    def __init__(self, services: StoreServices) -> None:
        self.redis = services.redis
        self.jobs = services.jobs
        self._store = script(self.redis, "recall_vector_store")
        self._clustered = isinstance(self.redis, redis.RedisCluster)
        self._queue = script(self.redis, "recall_vector_queue")
        # Users' decoded vectors, least recently searched first, at most ``cache_max``
        # (LOOM_RECALL_VECTOR_CACHE_MAX; float32, 1.5 KiB each at 384 dimensions).
        self._cache: OrderedDict[tuple[str, str, str, int], _Block] = OrderedDict()
        self._cached_vectors = 0
        self._scopes: OrderedDict[tuple[str, str, int], _Scope] = OrderedDict()
        self._cache_lock = threading.Lock()
        self.cache_max = services.settings.recall_vector_cache_max
        self.enabled = services.settings.embeddings_configured
        self.engine = engine_of(self.redis)
        # The vectors live in vector sets and the server scores them (module docstring).
        self.on_engine = self.engine == VECTORSET
        if self.enabled:
            log.info("recall: vector leg on; the server's vector engine: %s (%s)", self.engine,
                     "VSIM over each user's vector set" if self.on_engine
                     else "exact cosine over the vectors in scope")

    # --- the job's side ------------------------------------------------------------------

    def claim_queued(self, org: str, namespace: str, user_id: str) -> None:
        """Take down the queued marker as a job starts: a write from now on enqueues again."""
        self.redis.delete(keys.recall_vectors_queued(org, namespace, user_id))

    def _mark_queued(self, org: str, namespace: str, user_id: str, job_id: str,
                     lost: str = "") -> tuple[bool, str]:
        """Set the queued marker to ``job_id`` (or take it over from the ``lost`` job it still
        names): (True, '') when set, the caller enqueuing that job; else (False, the id the
        marker holds). Never while the user is being erased: no job, and no marker, is left
        behind for the census."""
        took, held = self._queue(*RECALL_VECTOR_QUEUE.ordered(
            keys={"queued": keys.recall_vectors_queued(org, namespace, user_id),
                  "erasing": keys.user_erasing(org, namespace, user_id)},
            args={"ttl_seconds": QUEUED_MARKER_SECONDS, "job_id": job_id, "lost_job_id": lost}))
        return int(took) == 1, str(held)

    def _job_waiting(self, job_id: str) -> bool:
        """Whether the job a marker names still waits in its queue. A job that started took the
        marker down itself, so one that started, ended, failed or is gone (its enqueue never
        reached the queue, or the queue's server came back without it) holds it no longer."""
        job = self.jobs.job(job_id)
        return job is not None and job.in_queue

    def request(self, org: str, namespace: str, user_id: str, *, recover: bool = False) -> bool:
        """Enqueue the user's embeddings job unless one is queued already or embeddings are
        off (the sweep's and the backfill's way; a memory write sets the marker in its own
        script and calls ``ask_embedding``); True when a job was enqueued. Computes nothing.

        ``recover`` (the sweep's) also looks up the job the marker names, and enqueues anew when
        that job no longer waits in its queue: a lost job holds the marker for no longer than
        the sweep's interval, where a write alone waits out its TTL."""
        if not self.enabled:
            return False
        job_id = new_job_id()
        took, held = self._mark_queued(org, namespace, user_id, job_id)
        if not took and recover and held and not self._job_waiting(held):
            took, _ = self._mark_queued(org, namespace, user_id, job_id, lost=held)
        if not took:
            return False
        return self.ask_embedding(org, namespace, user_id, job_id)

    def ask_embedding(self, org: str, namespace: str, user_id: str, job_id: str) -> bool:
        """Ask the dispatcher for the user's embeddings job as ``job_id``, the id its queued
        marker already holds (set by ``request``, or by a memory write script in the write's own
        step); True when it reached the queue (which may be another server: ``LOOM_QUEUE_URL``)."""
        try:
            self.jobs.dispatch(EmbedUserFacts(org, namespace, user_id, job_id))
        except redis.RedisError:
            # The row is written and listed as due; the marker names a job no queue holds, so
            # the sweep's next pass enqueues again (as does a write once the marker lapses). A
            # write does not fail for want of its vector.
            log.warning("recall_embeddings: could not enqueue a job; the rows stay due")
            try:
                self.redis.delete(keys.recall_vectors_queued(org, namespace, user_id))
            except redis.RedisError:
                pass
            return False
        return True

    def users_due(self) -> list[DueUser]:
        """Every user with rows due for a vector, on every node, in the sweep's turn order
        (the sha1 of the due key: stable, and unrelated to when or what was written)."""
        found = []
        for raw in self.redis.scan_iter(match=keys.recall_vectors_due_pattern(), count=1000):
            key = raw.decode() if isinstance(raw, bytes) else str(raw)
            found.append(DueUser(hashlib.sha1(key.encode()).hexdigest(),
                                 *keys.recall_vectors_due_parts(key)))
        return sorted(found, key=lambda user: user.position)

    def sweep_position(self) -> str:
        """Where the last sweep stopped ('' before the first)."""
        found = self.redis.get(keys.recall_vectors_sweep())
        return found.decode() if isinstance(found, bytes) else (found or "")

    def set_sweep_position(self, position: str) -> None:
        self.redis.set(keys.recall_vectors_sweep(), position)

    def due(self, org: str, namespace: str, user_id: str, limit: int) -> list[DueRow]:
        """Up to ``limit`` rows due for a vector, each with its row key."""
        ids = [str(m) for m in self.redis.zrange(
            keys.recall_vectors_due(org, namespace, user_id), 0, limit - 1)]
        if not ids:
            return []
        row_keys = optional_texts(self.redis.hmget(keys.memory_ids(org, namespace, user_id), ids))
        return [DueRow(mid, row_key) for mid, row_key in zip(ids, row_keys, strict=True)]

    def due_count(self, org: str, namespace: str, user_id: str) -> int:
        return int(self.redis.zcard(keys.recall_vectors_due(org, namespace, user_id)))

    def fingerprints(self, org: str, namespace: str, user_id: str,
                     memory_ids: Sequence[str]) -> list[str | None]:
        """The fingerprint of each row's stored vector (None where it has none a search can
        score: on the engine, none unless the set holds it; without, none unless the payload
        is there), so a database moved between the two is embedded again, not trusted."""
        if not memory_ids:
            return []
        ids = list(memory_ids)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(keys.recall_vectors(org, namespace, user_id), ids)
        if self.on_engine:
            vector_set = keys.recall_vector_set(org, namespace, user_id)
            namespace_set = keys.recall_namespace_vector_set(org, namespace)
            for memory_id in ids:
                cast(Any, pipe).execute_command("VISMEMBER", vector_set, memory_id)
                cast(Any, pipe).execute_command(
                    "VISMEMBER", namespace_set, keys.recall_namespace_element(user_id, memory_id))
        replies = pipe.execute()
        stored = optional_texts(replies[0])
        if self.on_engine:
            # A vector counts only where both sets hold it: one the namespace's set lacks (a
            # database from before it, a step lost on Redis Cluster) is stored again.
            members = replies[1:]
            return [value[:FINGERPRINT_CHARS]
                    if value is not None and bool(members[2 * i]) and bool(members[2 * i + 1])
                    else None for i, value in enumerate(stored)]
        return [value[:FINGERPRINT_CHARS] if value is not None and len(value) > FINGERPRINT_CHARS
                else None for value in stored]

    def store(self, org: str, namespace: str, user_id: str, row_key: str, memory_id: str,
              version: int, stored: str) -> str:
        """Store one row's vector (``stored``, what ``encode_vector`` made; '' keeps the one
        there) if the row is still at ``version``; answers OK, MOVED, GONE or ERASING
        (recall_vector_store.lua). On the engine the hash gets the fingerprint and the set the
        vector."""
        value, vector = stored, b""
        if self.on_engine and stored:
            value, vector = stored[:FINGERPRINT_CHARS], vector_bytes(stored)
        namespace_set = keys.recall_namespace_vector_set(org, namespace)
        element = keys.recall_namespace_element(user_id, memory_id)
        attributes = json.dumps({"user": user_id})
        reply = self._store(*RECALL_VECTOR_STORE.ordered(
            keys={"row": row_key,
                  "recall_vectors": keys.recall_vectors(org, namespace, user_id),
                  "recall_vectors_due": keys.recall_vectors_due(org, namespace, user_id),
                  "erasing": keys.user_erasing(org, namespace, user_id),
                  "recall_vectors_generation": keys.recall_vectors_generation(
                      org, namespace, user_id),
                  "recall_vector_set": keys.recall_vector_set(org, namespace, user_id),
                  "namespace_vector_set": None if self._clustered else namespace_set},
            args={"memory_id": memory_id, "version": str(version), "stored": value,
                  "vector": vector, "namespace_set_given": "" if self._clustered else "1",
                  "namespace_element": element, "namespace_attributes": attributes}))
        # On Redis Cluster the namespace's set is in another slot: its step follows. A process
        # that dies between the two leaves the namespace set behind the user's until the row's
        # next vector (the job's fingerprints check both, so the next job stores it again).
        left = _text(reply[1]) if len(reply) > 1 else ""
        if left == "add":
            cast(Any, self.redis).execute_command(
                "VADD", namespace_set, "FP32", vector, element, "Q8", "SETATTR", attributes)
        elif left == "remove":
            cast(Any, self.redis).execute_command("VREM", namespace_set, element)
        return _text(reply[0])

    def drop_due(self, org: str, namespace: str, user_id: str, memory_id: str) -> None:
        """Take a row whose key is gone off the due list."""
        self.redis.zrem(keys.recall_vectors_due(org, namespace, user_id), memory_id)

    def backlog(self) -> Backlog:
        """The facts waiting for a vector, and their users, on every node (/metrics): one SCAN
        for the users' due lists, their lengths read a pipeline at a time."""
        found = Backlog()
        pending: list[str] = []
        for raw in self.redis.scan_iter(match=keys.recall_vectors_due_pattern(), count=1000):
            pending.append(raw.decode() if isinstance(raw, bytes) else str(raw))
            if len(pending) >= BACKLOG_BATCH:
                found = found + self._due_lengths(pending)
                pending = []
        return found + self._due_lengths(pending)

    def namespace_backlog(self, org: str, namespace: str) -> Backlog:
        """The facts of a namespace waiting for a vector, and their users: the due list of each
        user who has (or had) facts in it."""
        users = sorted(str(u) for u in self.redis.smembers(keys.recall_users(org, namespace)))
        return self._due_lengths([keys.recall_vectors_due(org, namespace, u) for u in users])

    def pending_in(self, org: str, namespace: str, user_ids: Sequence[str]) -> int:
        """The facts of these users waiting for a vector (listed due: written or changed since
        their last embedding), in one pipeline; 0 with no embeddings endpoint, where no fact
        ever gets one."""
        if not self.enabled:
            return 0
        return self._due_lengths(
            [keys.recall_vectors_due(org, namespace, u) for u in dict.fromkeys(user_ids)]).facts

    def _due_lengths(self, due_keys: Sequence[str]) -> Backlog:
        if not due_keys:
            return Backlog()
        pipe = self.redis.pipeline(transaction=False)
        for key in due_keys:
            pipe.zcard(key)
        lengths = [int(n) for n in pipe.execute()]
        return Backlog(facts=sum(lengths), users=sum(1 for n in lengths if n))

    # --- the search's side -------------------------------------------------------------------

    def _generations(self, org: str, namespace: str, users: Sequence[str]) -> list[str]:
        pipe = self.redis.pipeline(transaction=False)
        for user_id in users:
            _ask_generation(pipe, org, namespace, user_id)
        return [_generation(g) for g in pipe.execute()]

    def _vectors_of(self, org: str, namespace: str, users: Sequence[str], width: int,
                    generations: Sequence[str]) -> list[tuple[str, _Block]]:
        """Each user's vectors of this length, decoded: from this process's cache while the
        user's generation is the one read (``generations``, before this), else read again
        (generation first, so a change made between the two reads only makes the cached copy
        look older than it is)."""
        found: dict[str, _Block] = {}
        stale: list[tuple[str, str]] = []
        with self._cache_lock:
            for user_id, generation in zip(users, generations, strict=True):
                cached = self._cache.get((org, namespace, user_id, width))
                if cached is not None and cached.generation == generation:
                    self._cache.move_to_end((org, namespace, user_id, width))
                    found[user_id] = cached
                else:
                    stale.append((user_id, generation))
        if stale:
            generations_read, stored = self._read_vectors(org, namespace,
                                                          [user_id for user_id, _ in stale])
            for user_id, _seen in stale:
                generation = generations_read[user_id]
                block = _decode_block(generation, stored[user_id], width)
                found[user_id] = block
                self._remember((org, namespace, user_id, width), block)
        return [(user_id, found[user_id]) for user_id in users
                if user_id in found and found[user_id].ids]

    def _read_vectors(self, org: str, namespace: str, users: Sequence[str],
                      ) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
        """Each user's generation and stored vectors, the generation read first; the vectors
        a bounded number a call (HSCAN), every user's next part in one pipeline, so a user of
        many facts never holds the server for one long read. A write between two parts
        changes the generation, and the next search reads the user again."""
        generations: dict[str, str] = {}
        stored: dict[str, dict[str, str]] = {user_id: {} for user_id in users}
        pipe = self.redis.pipeline(transaction=False)
        for user_id in users:
            _ask_generation(pipe, org, namespace, user_id)
            pipe.hscan(keys.recall_vectors(org, namespace, user_id), 0, count=VECTORS_PER_CALL)
        replies = pipe.execute()
        going: list[tuple[str, int]] = []
        for i, user_id in enumerate(users):
            generations[user_id] = _generation(replies[2 * i])
            cursor, part = replies[2 * i + 1]
            stored[user_id].update(part)
            if int(cursor):
                going.append((user_id, int(cursor)))
        while going:
            pipe = self.redis.pipeline(transaction=False)
            for user_id, cursor in going:
                pipe.hscan(keys.recall_vectors(org, namespace, user_id), cursor,
                           count=VECTORS_PER_CALL)
            next_round: list[tuple[str, int]] = []
            for (user_id, _), (cursor, part) in zip(going, pipe.execute(), strict=True):
                stored[user_id].update(part)
                if int(cursor):
                    next_round.append((user_id, int(cursor)))
            going = next_round
        return generations, stored

    def _remember(self, where: tuple[str, str, str, int], block: _Block) -> None:
        with self._cache_lock:
            old = self._cache.pop(where, None)
            if old is not None:
                self._cached_vectors -= len(old.ids)
            if len(block.ids) > self.cache_max:
                return
            self._cache[where] = block
            self._cached_vectors += len(block.ids)
            while self._cached_vectors > self.cache_max:
                _, evicted = self._cache.popitem(last=False)
                self._cached_vectors -= len(evicted.ids)

    def counts(self, org: str, namespace: str, user_ids: Sequence[str]) -> dict[str, int]:
        """How many vectors each user has (to skip embedding a query nobody can match)."""
        pipe = self.redis.pipeline(transaction=False)
        for user_id in user_ids:
            if self.on_engine:
                cast(Any, pipe).execute_command(
                    "VCARD", keys.recall_vector_set(org, namespace, user_id))
            else:
                pipe.hlen(keys.recall_vectors(org, namespace, user_id))
        return {user_id: int(n or 0)
                for user_id, n in zip(user_ids, pipe.execute(), strict=True)}

    def has_vectors(self, org: str, namespace: str, user_ids: Sequence[str], *,
                    whole_namespace: bool = False) -> VectorsSeen:
        """Whether any of these users has a vector (no query is embedded for nothing to
        match); ``whole_namespace`` as in ``nearest``: on the engine one VCARD of the
        namespace's set. On exact cosine each user's generation is read in the same round
        trip, for ``nearest`` (``seen``)."""
        if self.on_engine and whole_namespace:
            return VectorsSeen(bool(cast(Any, self.redis).execute_command(
                "VCARD", keys.recall_namespace_vector_set(org, namespace))))
        if self.on_engine:
            return VectorsSeen(any(self.counts(org, namespace, user_ids).values()))
        users = tuple(dict.fromkeys(user_ids))
        pipe = self.redis.pipeline(transaction=False)
        for user_id in users:
            pipe.hlen(keys.recall_vectors(org, namespace, user_id))
            _ask_generation(pipe, org, namespace, user_id)
        replies = pipe.execute()
        return VectorsSeen(any(int(n or 0) for n in replies[0::2]), users,
                           tuple(_generation(g) for g in replies[1::2]))

    def nearest(self, org: str, namespace: str, user_ids: Sequence[str],
                query: Sequence[float], top: int, *,
                whole_namespace: bool = False,
                meanwhile: Callable[[], None] | None = None,
                seen: VectorsSeen | None = None) -> list[VectorHit]:
        """The ``top`` facts of these users closest to ``query`` by cosine, best first; only
        vectors of the query's length count (a model change leaves old ones until re-embedded),
        and only those pointing the query's way (cosine above 0). Exact without the engine;
        on it, what VSIM finds (approximate past a few hundred vectors a user), at most
        ENGINE_DEPTH_MAX of them.
        ``whole_namespace`` says ``user_ids`` are every user of the namespace: on the engine
        that is one VSIM over the namespace's set, not one a user. ``meanwhile`` is called
        once this leg needs Redis no more (on exact cosine, before the product; on the engine,
        before its VSIM, the leg being Redis's own work): a caller sends its other Redis work
        there, and the server does it while this process computes. ``seen``: what
        ``has_vectors`` read of these users, whose generations are then not read again."""
        users = [u for u in dict.fromkeys(user_ids)]
        if not users or top <= 0:
            return []
        wanted = np.asarray(query, dtype=np.float32)
        norm = float(np.linalg.norm(wanted))
        if norm == 0:
            return []
        wanted = wanted / norm
        if self.on_engine and meanwhile is not None:
            meanwhile()
        if self.on_engine and whole_namespace:
            return self._nearest_in_namespace(org, namespace, users, wanted, top)
        if self.on_engine:
            return self._nearest_on_engine(org, namespace, users, wanted, top)
        width = wanted.shape[0]
        generations = (seen.generations if seen is not None and seen.generations is not None
                       and seen.users == tuple(users)
                       else self._generations(org, namespace, users))
        blocks = self._vectors_of(org, namespace, users, width, generations)
        if meanwhile is not None:
            meanwhile()
        if not blocks:
            return []
        if len(blocks) == 1 or sum(len(block.ids) for _, block in blocks) > self.cache_max:
            # One user; or more vectors than a process keeps, whose one matrix would be laid
            # out again each search: each user's product, then one selection over their best.
            hits = []
            for user_id, block in blocks:
                scores = block.matrix @ wanted
                chosen = _best(scores, top)
                hits += [VectorHit(user_id, block.ids[i], score)
                         for i, score in zip(chosen.tolist(), scores[chosen].tolist(),
                                             strict=True)]
        else:
            # One product over the scope's one matrix, then one selection: Python objects
            # (and Python numbers) only for the winners.
            scope = self._scope_of(org, namespace, width, blocks)
            scores = scope.matrix @ wanted
            chosen = _best(scores, top)
            hits = [VectorHit(scope.users[owner], scope.ids[i], score)
                    for i, owner, score in zip(chosen.tolist(), scope.owners[chosen].tolist(),
                                               scores[chosen].tolist(), strict=True)]
        hits.sort(key=lambda hit: (-hit.score, hit.memory_id))
        return hits[:top]

    def _scope_of(self, org: str, namespace: str, width: int,
                  blocks: list[tuple[str, _Block]]) -> _Scope:
        """The kept matrix of these users' vectors while every generation holds; else laid
        out again, the users' kept blocks becoming views of it (no second copy is kept)."""
        users = tuple(user_id for user_id, _ in blocks)
        generations = tuple(block.generation for _, block in blocks)
        where = (org, namespace, width)
        with self._cache_lock:
            kept = self._scopes.get(where)
            if kept is not None and kept.users == users and kept.generations == generations:
                self._scopes.move_to_end(where)
                return kept
        matrix = np.concatenate([block.matrix for _, block in blocks])
        sizes = [len(block.ids) for _, block in blocks]
        ids = [memory_id for _, block in blocks for memory_id in block.ids]
        scope = _Scope(users, generations, np.repeat(np.arange(len(blocks)), sizes), ids,
                       matrix)
        if len(ids) > self.cache_max:
            return scope
        with self._cache_lock:
            offset = 0
            for (user_id, block), size in zip(blocks, sizes, strict=True):
                user_key = (org, namespace, user_id, width)
                if self._cache.get(user_key) is block:
                    self._cache[user_key] = _Block(block.generation, block.ids,
                                                   matrix[offset:offset + size])
                offset += size
            self._scopes[where] = scope
            self._scopes.move_to_end(where)
            while len(self._scopes) > CACHE_SCOPES_MAX:
                self._scopes.popitem(last=False)
        return scope

    def _nearest_on_engine(self, org: str, namespace: str, users: Sequence[str],
                           wanted: np.ndarray, top: int) -> list[VectorHit]:
        """One VSIM a user (each set in its user's slot), merged. VSIM's score is
        (1 + cosine) / 2; a set of another length than the query's answers an error and is
        left out, as the exact path leaves such vectors out."""
        blob = wanted.astype(np.float32).tobytes()
        depth = min(top, ENGINE_DEPTH_MAX)
        effort = max(ENGINE_EF_MIN, depth)
        pipe = self.redis.pipeline(transaction=False)
        for user_id in users:
            cast(Any, pipe).execute_command("VSIM", keys.recall_vector_set(org, namespace, user_id),
                                 "FP32", blob, "WITHSCORES", "COUNT", depth, "EF", effort)
        hits: list[VectorHit] = []
        for user_id, reply in zip(users, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(reply, Exception) or not reply:
                continue
            pairs = (reply.items() if isinstance(reply, dict)
                     else zip(reply[::2], reply[1::2], strict=True))
            for member, similarity in pairs:
                cosine = 2.0 * float(similarity) - 1.0
                if cosine > 0:
                    hits.append(VectorHit(user_id, _text(member), cosine))
        hits.sort(key=lambda hit: (-hit.score, hit.memory_id))
        return hits[:top]

    def _nearest_in_namespace(self, org: str, namespace: str, users: Sequence[str],
                              wanted: np.ndarray, top: int) -> list[VectorHit]:
        """One VSIM over the namespace's set (its slot), each element naming its user: a
        user erased or left meanwhile (no longer in ``users``) is dropped here."""
        depth = min(top, ENGINE_DEPTH_MAX)
        reply = cast(Any, self.redis).execute_command(
            "VSIM", keys.recall_namespace_vector_set(org, namespace), "FP32",
            wanted.astype(np.float32).tobytes(), "WITHSCORES", "COUNT", depth,
            "EF", max(ENGINE_EF_MIN, depth))
        if not reply:
            return []
        wanted_users = set(users)
        pairs = (reply.items() if isinstance(reply, dict)
                 else zip(reply[::2], reply[1::2], strict=True))
        hits: list[VectorHit] = []
        for element, similarity in pairs:
            user_id, _, memory_id = _text(element).rpartition("\x00")
            cosine = 2.0 * float(similarity) - 1.0
            if cosine > 0 and user_id in wanted_users:
                hits.append(VectorHit(user_id, memory_id, cosine))
        hits.sort(key=lambda hit: (-hit.score, hit.memory_id))
        return hits[:top]
