"""What each Lua script takes: its KEYS and ARGV, declared once, by name.

A script with a declaration here gets a preamble (app/store/lua ``source``) that names each of
its keys ``K_<name>`` and each argument ``A_<name>``, so its Lua reads ``K_row`` and
``A_written_by``, never ``KEYS[1]`` or ``ARGV[8]``; the store passes keyword arguments and
``ScriptInterface.ordered`` puts them in the declared order. Python and Lua so agree on a name,
not on a position kept in a comment, and a call that misses or misspells one fails in Python
before it reaches Redis.

A script whose tail varies in length (the derived rows of a redact, the field/value pairs of a
write) declares it as ``more_keys``/``more_args``: the preamble names where it starts
(``K_<name>_from``, ``A_<name>_from``), and the caller passes it as one sequence.

An optional key (a worker's fence, an Idempotency-Key's record) is declared like any other: a
call without one passes ``None``, and the script's first key goes in its place, so the key count
and positions never move and the stand-in is in the script's slot by construction; the script
reads that key only when an argument says it is there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ScriptInterface:
    """One script's keys and arguments, in the order Redis gets them."""

    name: str
    keys: tuple[str, ...]
    args: tuple[str, ...]
    more_keys: str = ""
    more_args: str = ""
    _key_set: frozenset[str] = field(init=False, repr=False, compare=False)
    _arg_set: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for names, what in ((self.keys, "key"), (self.args, "argument")):
            if len(set(names)) != len(names):
                raise ValueError(f"script {self.name}: a {what} name is declared twice")
            for name in names:
                if not name.isidentifier():
                    raise ValueError(f"script {self.name}: {what} {name!r} is no Lua name")
        object.__setattr__(self, "_key_set", frozenset(self.keys))
        object.__setattr__(self, "_arg_set", frozenset(self.args))

    def preamble(self) -> str:
        """The Lua lines naming every key and argument; prepended to the script's text."""
        lines = [f"-- {self.name}: keys and arguments as app/store/script_interfaces.py declares"]
        lines += [f"local K_{name} = KEYS[{i}]" for i, name in enumerate(self.keys, 1)]
        if self.more_keys:
            lines.append(f"local K_{self.more_keys}_from = {len(self.keys) + 1}")
        lines += [f"local A_{name} = ARGV[{i}]" for i, name in enumerate(self.args, 1)]
        if self.more_args:
            lines.append(f"local A_{self.more_args}_from = {len(self.args) + 1}")
        return "\n".join(lines) + "\n"

    def ordered(
        self,
        keys: Mapping[str, str | None],
        args: Mapping[str, Any],
        more_keys: Iterable[str] = (),
        more_args: Iterable[Any] = (),
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV in the declared order from named ``keys`` and ``args`` (every declared
        name, no other); a ``None`` key stands for an absent optional key."""
        _check(self.name, "key", self._key_set, keys)
        _check(self.name, "argument", self._arg_set, args)
        if (more_keys or more_args) and not (self.more_keys or self.more_args):
            raise TypeError(f"script {self.name} declares no variable tail")
        ordered_keys: list[str] = []
        # A script whose keys are all its tail (one set per user it reads) has no first key.
        if self.keys:
            first = keys[self.keys[0]]
            if first is None:
                raise TypeError(f"script {self.name}: its first key {self.keys[0]!r} is required")
            ordered_keys = [first if (found := keys[name]) is None else found
                            for name in self.keys]
        ordered_args = [args[name] for name in self.args]
        ordered_keys.extend(more_keys)
        ordered_args.extend(more_args)
        return ordered_keys, ordered_args


def _check(script: str, what: str, declared: frozenset[str], given: Mapping[str, Any]) -> None:
    if given.keys() == declared:
        return
    missing = sorted(declared - given.keys())
    unknown = sorted(given.keys() - declared)
    raise TypeError(f"script {script}: {what}s missing {missing}, not declared {unknown}")


# Every memory write script (app/store/lua/memory_write.lua, which each of them includes)
# takes these keys first: the user's slot's (app/store/memory_row.py Location.write_keys), then
# the namespace's (MEMORY_WRITE_NAMESPACE_KEYS, below).
MEMORY_WRITE_KEYS: tuple[str, ...] = (
    "row",  # the row's current fields
    "versions",  # padded version -> JSON snapshot, of the versions before the current one
    "version_order",
    "rows",  # the user's rows (key NUL agent NUL session_id)
    "memory_ids",  # memory_id -> row key
    "sections",  # renderable profile sections
    "sources",  # profile-src
    "digest",  # profile-digest
    "source_expiry",
    "erasing",  # the user's erasure marker
    "live",  # live rows by type
    "recall_docs",
    "recall_postings",
    "recall_stats",
    "recall_vectors",
    "recall_vectors_due",
    "recall_vectors_generation",
    "recall_vector_set",  # only ever present on a server with Redis 8's vector sets
    "recall_vectors_queued",
    # The Idempotency-Key record the write answers (None: no key; the tail's holder says which).
    "outcome",
)

# The namespace-slot keys a memory write asserts (memory_write.lua namespace_commands). On one
# server they follow MEMORY_WRITE_KEYS and the script writes them; on Redis Cluster they are in
# another slot than the user's, so they are passed as None and the script answers its commands
# by these names for the caller to resolve and send (app/store/memory.py _after_write).
MEMORY_WRITE_NAMESPACE_KEYS: tuple[str, ...] = (
    "pointers",  # memory_id -> where the row lives (keys.memory_pointers)
    "recall_users",
    "namespace_vector_set",
    "profile_users",
    "label_users",  # the users with a section of the row's label
    "agent_users",  # the users with a section of the row's agent
    "changed_users",
    "fold_changed",
    "fact_namespaces",
    "structured_wakes",
)
MEMORY_WRITE_KEYS += MEMORY_WRITE_NAMESPACE_KEYS

MEMORY_SET = ScriptInterface(
    "memory_set",
    keys=(
        *MEMORY_WRITE_KEYS,
        "fence",  # a worker lease's fence on the user (None: no lease; fence_token says)
        "record",  # a hash written with the row (None: none; record_pairs says)
    ),
    args=(
        "now",
        "memory_id",  # for a new row
        "member",  # in the user's rows
        "expected_version",  # '' none, '-' no live row
        "if_match",  # content sha ('' none)
        "default_char_limit",  # '' none
        "char_limit",  # '' keeps the row's
        "written_by",
        "required_type",  # of a live row ('' any)
        "refuse_pinned",  # '1': refuse a pinned or high row
        "fence_token",  # '' none
        "record_pairs",  # how many field/value pairs of the record lead the tail
        "tail",  # JSON (app/store/memory.py _tail)
    ),
    # The record's field/value pairs, then the new content's.
    more_args="pairs",
)

# The arguments most memory writes share: now (ns), written_by, the row's member in the
# user's rows, the memory_id the caller addressed ('' any: addressed by key), the tail.
MEMORY_FLAG = ScriptInterface(
    "memory_flag", keys=MEMORY_WRITE_KEYS,
    # flag: locked | pinned; on: '0' | '1'
    args=("now", "flag", "on", "written_by", "member", "memory_id", "tail"),
)

MEMORY_DELETE = ScriptInterface(
    "memory_delete", keys=MEMORY_WRITE_KEYS,
    args=("now", "written_by", "member", "memory_id", "source_trace", "tail"),
)

MEMORY_DELETE_VERSION = ScriptInterface(
    "memory_delete_version", keys=MEMORY_WRITE_KEYS,
    # version: the padded version to remove; source_trace: the marker the removal is traced with
    args=("now", "version", "written_by", "member", "memory_id", "source_trace", "tail"),
)

MEMORY_REVERT = ScriptInterface(
    "memory_revert", keys=MEMORY_WRITE_KEYS,
    # change: revert | restore; version: padded, to bring back ('' for a restore)
    args=("now", "change", "version", "written_by", "member", "memory_id", "tail"),
)

MEMORY_TOUCH = ScriptInterface(
    "memory_touch", keys=MEMORY_WRITE_KEYS,
    # change: restate | reinforce | recall | backfill. confidence (reinforce): to raise the
    # row's to ('' keeps it). Backfill: expected_version, the version the terms were computed
    # from; recall_terms, as this release computes them; vector_engine, '1' when the server's
    # vectors live in vector sets (K_recall_vector_set), so a vector counts only where the set
    # holds it (a database moved onto the engine keeps int8 payloads in K_recall_vectors that no
    # search reads).
    args=("now", "change", "written_by", "member", "memory_id", "confidence",
          "expected_version", "recall_terms", "vector_engine", "tail"),
)

MEMORY_REDACT = ScriptInterface(
    "memory_redact", keys=MEMORY_WRITE_KEYS,
    # derived_count: how many derived rows follow the declared keys
    args=("now", "written_by", "memory_id", "derived_count", "tail"),
    # Per derived row: its row key, then its versions.
    more_keys="derived",
)

# Sources whose valid_to passed (by now) leave the user's digest.
MEMORY_EXPIRE_SOURCES = ScriptInterface(
    "memory_expire_sources", keys=("sources", "digest", "source_expiry"), args=("now",),
)

# A user leaves a sorted set of users scored by change time, only when no change came after
# read_at (a score).
CLEAR_UNLESS_CHANGED_SINCE = ScriptInterface(
    "clear_unless_changed_since", keys=("changed_users",), args=("user_id", "read_at"),
)

# Every working-memory write script: the scope"s hash, the user"s index of scopes, the user"s
# erasure marker (app/store/working_memory.py WorkingMemoryStore._keys). The scripts run as
# KeyedScripts: the keyed wrapper takes the Idempotency-Key"s record and holder off the end of
# KEYS and ARGV before this preamble names the rest.
WORKING_MEMORY_KEYS: tuple[str, ...] = ("scope", "index", "erasing")
# char_limit: '' keeps the block's cap (default_char_limit for a new block); length: the
# content's, in characters.
WORKING_MEMORY_SET = ScriptInterface(
    "working_memory_set", keys=WORKING_MEMORY_KEYS,
    args=("block_key", "now", "char_limit", "content", "length", "default_char_limit"),
)
WORKING_MEMORY_APPEND = ScriptInterface(
    "working_memory_append", keys=WORKING_MEMORY_KEYS,
    args=("block_key", "now", "addition", "addition_length", "separator", "separator_length",
          "default_char_limit"),
)
WORKING_MEMORY_REPLACE = ScriptInterface(
    "working_memory_replace", keys=WORKING_MEMORY_KEYS,
    args=("block_key", "now", "old", "old_length", "new", "new_length"),
)
WORKING_MEMORY_DELETE = ScriptInterface(
    "working_memory_delete", keys=WORKING_MEMORY_KEYS,
    args=("block_key",),
)

# --- typed agent state (app/store/agent_state.py) ------------------------------------------------

# The compare-and-set write of one state. erasing: the subject's erasure marker, for a subject
# scope (None otherwise; erasing_checked '1' says it is there). expected_etag: '' nothing stored;
# expires_ms: a decimal string. The tail: the state hash's field/value pairs.
AGENT_STATE_WRITE = ScriptInterface(
    "agent_state_write", keys=("state", "scope_agents", "erasing"),
    args=("erasing_checked", "expected_etag", "expires_ms", "agent"),
    more_args="fields",
)
# The sweep's delete: only the state it judged expired (by its etag), never one rewritten since.
AGENT_STATE_DELETE_IF = ScriptInterface(
    "agent_state_delete_if", keys=("state", "scope_agents"), args=("expected_etag", "agent"),
)
# Deletes states of one scope (the tail of keys) and their agents (the tail of arguments, one
# per state). audit: the namespace's audit list, which gets the entry in the same step when
# audit_head is not '' (the entry's JSON is audit_head .. the count erased .. audit_tail), and
# keeps audit_max entries; None where it is in another slot (Redis Cluster).
AGENT_STATE_ERASE = ScriptInterface(
    "agent_state_erase", keys=("scope_agents", "audit"),
    args=("audit_head", "audit_tail", "audit_max"),
    more_keys="states", more_args="state_agents",
)
# Drops index entries of erased states. The key tail: one subject index per entry (the expiry
# set again when the entry names none); the argument tail, per entry: state key, the expiry (ms)
# its erased state carried, the subject digest ('' none), '1' to drop it from the expiry set.
AGENT_STATE_UNINDEX = ScriptInterface(
    "agent_state_unindex", keys=("expiry", "subjects"), args=(),
    more_keys="subject_indexes", more_args="entries",
)

# --- model-call budgets (app/store/budget.py): every key in the org's slot ----------------------

BUDGET_WINDOW_KEYS: tuple[str, ...] = ("window", "reservations", "spent")
# namespace: '' for the org's own sums.
BUDGET_READ = ScriptInterface(
    "budget_read", keys=(*BUDGET_WINDOW_KEYS, "limits"),
    args=("now_ms", "window_ms", "namespace"),
)
BUDGET_RESERVE = ScriptInterface(
    "budget_reserve",
    keys=("org_limits", "namespace_limits", *BUDGET_WINDOW_KEYS, "deferral_logged"),
    args=("now_ms", "window_ms", "reservation_id", "namespace", "estimated_tokens"),
)
# mode: settle | release; real_tokens: '' unknown (the estimate stands).
BUDGET_SETTLE = ScriptInterface(
    "budget_settle", keys=BUDGET_WINDOW_KEYS,
    args=("now_ms", "window_ms", "reservation_id", "mode", "real_tokens"),
)
# namespace: '' for the whole org; buckets: how many slices of the window.
BUDGET_TIMELINE = ScriptInterface(
    "budget_timeline", keys=("window", "reservations"),
    args=("now_ms", "window_ms", "namespace", "buckets"),
)
# Replaces a budget's caps ('' none). audit: the namespace's audit list, which gets the entry in
# the same step when audit_head is not '': audit_head .. old calls cap .. audit_middle .. old
# tokens cap .. audit_tail (each a JSON number or null), keeping audit_max entries; None where
# it is in another slot than the org's (Redis Cluster).
BUDGET_SET = ScriptInterface(
    "budget_set", keys=("limits", "audit"),
    args=("calls", "tokens", "set_by", "set_at", "audit_head", "audit_middle", "audit_tail",
          "audit_max"),
)

# --- the erasure saga (app/store/erasure/saga.py) ------------------------------------------------

# Deletes keys of the user's slot (the key tail; one kind per key in the argument tail: row,
# versions, blocks, activity, index) and counts them on the marker. structured_key: the
# structured profile's row key, counted apart.
ERASURE_DROP = ScriptInterface(
    "erasure_drop", keys=("marker",), args=("structured_key",),
    more_keys="dropped", more_args="kinds",
)
# Counts removals made outside the user's slot on the marker: (kind, n) pairs.
ERASURE_ADD_COUNTS = ScriptInterface(
    "erasure_add_counts", keys=("marker",), args=(), more_args="counts",
)

# --- Idempotency-Key records (app/store/idempotency.py) ------------------------------------------

# recorded: '1' when the op's write keeps its answer in the record in the same step.
IDEMPOTENCY_BEGIN = ScriptInterface(
    "idempotency_begin", keys=("record",),
    args=("fingerprint", "holder", "now_ms", "lease_ms", "life_ms", "recorded"),
)
IDEMPOTENCY_RENEW = ScriptInterface(
    "idempotency_renew", keys=("record",), args=("holder", "lease_until_ms"),
)
# outcome: done (with answer) | unknown | release (answer '').
IDEMPOTENCY_SETTLE = ScriptInterface(
    "idempotency_settle", keys=("record",), args=("holder", "outcome", "answer"),
)

# --- leases and locks (app/store/lease.py, the erasure saga's lock) ------------------------------

# now_s: seconds, when the lease was taken.
LEASE_ACQUIRE = ScriptInterface(
    "lease_acquire", keys=("lease", "generation", "acquired"),
    args=("holder", "ttl_ms", "now_s"),
)
LEASE_FENCE_CLAIM = ScriptInterface(
    "lease_fence_claim", keys=("fence", "erasing"), args=("token", "ttl_ms"),
)
RENEW_IF_HELD = ScriptInterface("renew_if_held", keys=("lock",), args=("holder", "ttl_ms"))
RELEASE_IF_HELD = ScriptInterface("release_if_held", keys=("lock",), args=("holder",))

# --- structured profiles (app/store/structured.py): the namespace's slot ------------------------

# on: '1' blacklist | '0' lift it; audit_entry: JSON; audit_max: how many entries the list keeps.
STRUCTURED_BLACKLIST = ScriptInterface(
    "structured_blacklist", keys=("blacklist", "audit", "parked", "changed_users"),
    args=("user", "on", "now", "audit_entry", "audit_max"),
)
# parked_until and read_at: ns.
STRUCTURED_PARK = ScriptInterface(
    "structured_park", keys=("changed_users", "parked"),
    args=("user", "parked_until", "read_at"),
)
STRUCTURED_UNPARK_DUE = ScriptInterface(
    "structured_unpark_due", keys=("parked", "changed_users"), args=("now",),
)

# --- reads and counters (app/store/activity.py, app/store/metrics.py) ----------------------------

# now_us and cutoff_us: microseconds; most_readers: the cap.
ACTIVITY_RECORD = ScriptInterface(
    "activity_record", keys=("readers", "last_op"),
    args=("now_us", "member", "op", "cutoff_us", "most_readers"),
)
# cap: how many orgs keep a label of their own. The tail: (field for a labelled org, field for
# any other, amount) per counter.
METRICS_ADD_BY_ORG = ScriptInterface(
    "metrics_add_by_org", keys=("metrics", "orgs"), args=("cap", "org"),
    more_args="counters",
)

# The release step's move of one row written by the earlier layout (app/release.py): the row
# and its snapshots without the fields at their default, the current version out of the
# versions hash (the row holds it).
MEMORY_RELAYOUT = ScriptInterface(
    "memory_relayout", keys=("row", "versions", "version_order"), args=(),
)

# The release step's move of one earlier layout's pointer key into the namespace's hash.
MEMORY_POINTER_MOVE = ScriptInterface(
    "memory_pointer_move", keys=("legacy_pointer", "pointers"), args=("memory_id",),
)

# --- vectors (jobs/recall_embed.py, app/store/recall_vectors.py, app/store/profile_vectors.py) ---

# A fact's vector, stored by the embeddings job: every key in the user's slot but the
# namespace's set, which on one server the script keeps in the same step (namespace_set_given
# '1') and on Redis Cluster, in another slot, is passed as None: the script then answers the
# change ('add' | 'remove') for the caller to send.
RECALL_VECTOR_STORE = ScriptInterface(
    "recall_vector_store",
    keys=(
        "row",  # the fact's row
        "recall_vectors",  # memory_id -> fingerprint (and, without vector sets, the vector)
        "recall_vectors_due",  # the rows waiting for a vector
        "erasing",  # the user's erasure marker
        "recall_vectors_generation",  # bumped by every change to the user's vectors
        "recall_vector_set",  # the user's vector set (only on a server with vector sets)
        "namespace_vector_set",  # every user's vectors again (keys.recall_namespace_vector_set)
    ),
    # version: the row's, the text was read at; stored: the value for recall_vectors ('' keeps
    # the one there); vector: FP32 bytes for the sets on a server with vector sets, else '';
    # namespace_element: user NUL memory_id in the namespace's set; namespace_attributes: its
    # JSON attributes.
    args=("memory_id", "version", "stored", "vector", "namespace_set_given",
          "namespace_element", "namespace_attributes"),
)
# The user's queued-embeddings marker and erasure marker; lost_job_id: a job found no longer
# waiting whose marker may be taken over ('' none).
RECALL_VECTOR_QUEUE = ScriptInterface(
    "recall_vector_queue", keys=("queued", "erasing"),
    args=("ttl_seconds", "job_id", "lost_job_id"),
)
# A profile section's vector, every key in the user's slot. content_sha256: of the content
# embedded; stored: the value for profile_vectors; vector: FP32 bytes for the section set on a
# server with vector sets, else ''.
PROFILE_VECTOR_STORE = ScriptInterface(
    "profile_vector_store", keys=("row", "profile_vectors", "erasing", "section_vector_set"),
    args=("memory_id", "content_sha256", "stored", "vector"),
)

# The lexical recall index's scripts (app/store/recall.py). recall_posting.lua is an include
# of theirs and of memory_write_lexical.lua: functions only, it reads no key or argument.
# Each user a search reads brings its three index keys (app/store/recall.py _index_keys).
RECALL_USER_INDEX_KEYS: tuple[str, ...] = ("postings", "docs", "stats")
RECALL_SEARCH = ScriptInterface(
    "recall_search", keys=(),
    # top: hits to answer; k1, b: BM25's; avgdl: the average length ('' the script sums the
    # figures itself); mode: pruned | exhaustive; budget: the call's work; floor: the merged
    # top's worst ('' none); users: how many users' keys follow; term_count: how many terms.
    args=("top", "k1", "b", "avgdl", "mode", "budget", "floor", "users", "term_count"),
    # Per user in scope, RECALL_USER_INDEX_KEYS in turn.
    more_keys="user_indexes",
    # The terms (each with its idf once the weights are summed), then the continuation a
    # call answered, passed back as it came.
    more_args="terms",
)
RECALL_RELAYOUT = ScriptInterface(
    "recall_relayout", keys=RECALL_USER_INDEX_KEYS,
    # cursor: the HSCAN cursor over the docs ('0' to start); step: docs a step takes
    args=("cursor", "step"),
)

INTERFACES: dict[str, ScriptInterface] = {
    interface.name: interface
    for interface in (MEMORY_SET, MEMORY_FLAG, MEMORY_DELETE, MEMORY_DELETE_VERSION,
                      MEMORY_REVERT, MEMORY_TOUCH, MEMORY_REDACT, MEMORY_EXPIRE_SOURCES,
                      CLEAR_UNLESS_CHANGED_SINCE, WORKING_MEMORY_SET, WORKING_MEMORY_APPEND,
                      WORKING_MEMORY_REPLACE, WORKING_MEMORY_DELETE,
                      AGENT_STATE_WRITE, AGENT_STATE_DELETE_IF, AGENT_STATE_ERASE,
                      AGENT_STATE_UNINDEX,
                      BUDGET_READ, BUDGET_RESERVE, BUDGET_SETTLE, BUDGET_TIMELINE, BUDGET_SET,
                      ERASURE_DROP, ERASURE_ADD_COUNTS,
                      IDEMPOTENCY_BEGIN, IDEMPOTENCY_RENEW, IDEMPOTENCY_SETTLE,
                      LEASE_ACQUIRE, LEASE_FENCE_CLAIM, RENEW_IF_HELD, RELEASE_IF_HELD,
                      STRUCTURED_BLACKLIST, STRUCTURED_PARK, STRUCTURED_UNPARK_DUE,
                      ACTIVITY_RECORD, METRICS_ADD_BY_ORG,
                      MEMORY_RELAYOUT, MEMORY_POINTER_MOVE,
                      RECALL_VECTOR_STORE, RECALL_VECTOR_QUEUE, PROFILE_VECTOR_STORE,
                      RECALL_SEARCH, RECALL_RELAYOUT)
}


def interface_of(name: str) -> ScriptInterface | None:
    return INTERFACES.get(name)

