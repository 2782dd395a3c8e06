"""Every Redis key Loom writes is built here, and only here.

A user's data in one namespace shares the hash tag ``{org/namespace/user_id}``, so one
WATCH/MULTI or one Lua script can cover a user's blocks, facts and profile, and the same code
runs unchanged on Redis Cluster. Namespace-wide rows use user ``-``; namespace indexes use the
tag ``{org/namespace}``. Each component is escaped so that no id can close the tag early or
collide with another split of the same characters.
"""

from __future__ import annotations

from functools import lru_cache
from urllib.parse import unquote

PREFIX = "loom"

# '%' first so escapes never escape each other; '{' and '}' would end the hash tag; '/' and
# ':' separate components.
_ESCAPES = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D", "/": "%2F", ":": "%3A"})


def escape(component: str) -> str:
    return component.translate(_ESCAPES)


# A write builds some twenty keys of one user: the tag is escaped once, not per key.
@lru_cache(maxsize=4096)
def user_tag(org: str, namespace: str, user_id: str = "-") -> str:
    return "{" + escape(org) + "/" + escape(namespace) + "/" + escape(user_id) + "}"


def user_tag_parts(key: str) -> tuple[str, str, str]:
    """(org, namespace, user_id) of a key that ends with ``user_tag``."""
    # escape() writes only %XX escapes, which unquote undoes; the tag holds no ':'.
    org, namespace, user_id = key.rsplit(":", 1)[1].strip("{}").split("/")
    return unquote(org), unquote(namespace), unquote(user_id)


@lru_cache(maxsize=1024)
def namespace_tag(org: str, namespace: str) -> str:
    return "{" + escape(org) + "/" + escape(namespace) + "}"


def org_tag(org: str) -> str:
    return "{" + escape(org) + "}"


# --- working memory ---------------------------------------------------------------------------


def working_memory_scope(
    org: str, namespace: str, user_id: str, agent: str, session_id: str, run_id: str
) -> str:
    """One hash per (agent, user, session, run) scope; a field per block_key."""
    return (
        f"{PREFIX}:wm:{user_tag(org, namespace, user_id)}:"
        f"{escape(agent)}:{escape(session_id)}:{escape(run_id)}"
    )


def working_memory_scope_parts(scope_key: str) -> tuple[str, str, str]:
    """(agent, session_id, run_id) of a key ``working_memory_scope`` built."""
    # escape() writes only %XX escapes, which unquote undoes.
    agent, session_id, run_id = scope_key.split("}:", 1)[1].split(":")
    return unquote(agent), unquote(session_id), unquote(run_id)


def working_memory_scopes(org: str, namespace: str, user_id: str) -> str:
    """Set of a user's working-memory scope keys, so erasure and packs need no SCAN."""
    return f"{PREFIX}:wm-scopes:{user_tag(org, namespace, user_id)}"


# --- tokens and request budgets ---------------------------------------------------------------


def token_tag(token_id: str) -> str:
    """One token's hash tag: its row, and an Idempotency-Key record of a write to it."""
    return "{" + escape(token_id) + "}"


def token(token_id: str) -> str:
    """A token's row: claims and the keyed hash of the secret."""
    return f"{PREFIX}:token:{token_tag(token_id)}"


def org_tokens(org: str) -> str:
    return f"{PREFIX}:tokens:{org_tag(org)}"


def console_session(sid_digest: str) -> str:
    """One signed-in console session, under the keyed hash of the id its cookie holds."""
    return f"{PREFIX}:console:{{{escape(sid_digest)}}}"


def bad_credentials(address: str) -> str:
    """Requests from one client address that sent a token the server refused, in the window
    that began with the first of them."""
    return f"{PREFIX}:badauth:{{{escape(address)}}}"


def rate_window(caller: str, window: int) -> str:
    """Requests a caller (token id, or the single user) made in one fixed window."""
    return f"{PREFIX}:rate:{{{escape(caller)}}}:{window}"


def idempotency(tag: str, caller: str, op: str, key: str) -> str:
    """One write's Idempotency-Key record: its reservation, then its first answer, for a day.

    Under the hash tag of the subject the write touches (a user's ``user_tag``, an agent-state
    scope's, a namespace's), so it lives in the slot of the write's keys and an erasure's sweep
    of the user takes it with the rest of the user."""
    return f"{PREFIX}:idem:{tag}:{escape(caller)}:{escape(op)}:{escape(key)}"


# --- worker lease, cost ledger, org switches ---------------------------------------------------


def worker_lease(name: str) -> str:
    """Who holds a worker's lease, and its fencing token."""
    return f"{PREFIX}:lease:{{{escape(name)}}}"


def worker_lease_generation(name: str) -> str:
    """The fencing counter: each acquisition takes the next number."""
    return f"{PREFIX}:lease-gen:{{{escape(name)}}}"


def worker_state(name: str) -> str:
    """What a worker keeps between passes (waits, scan lists), tagged with the lease generation."""
    return f"{PREFIX}:worker-state:{{{escape(name)}}}"


def worker_lease_acquired(name: str) -> str:
    """When the lease's current token was taken (the holder's age on /metrics)."""
    return f"{PREFIX}:lease-at:{{{escape(name)}}}"


def worker_lease_fence(name: str, org: str, namespace: str, user_id: str) -> str:
    """The lease's fence on one user: the token of the pass building them, in the user's slot,
    so the script that writes the user's rows can check it (on Redis Cluster too)."""
    return f"{PREFIX}:lease-fence:{escape(name)}:{user_tag(org, namespace, user_id)}"


def job_metrics() -> str:
    """The counters and histograms the worker and scheduler processes add to, for /metrics."""
    return f"{PREFIX}:metrics:{{metrics}}"


def job_metrics_orgs() -> str:
    """The orgs given their own label in the job metrics (at most LOOM_METRICS_MAX_ORGS)."""
    return f"{PREFIX}:metrics-orgs:{{metrics}}"


def usage(org: str, namespace: str) -> str:
    """The namespace's cost ledger: model calls, tokens, builds, skips, refusals, failures."""
    return f"{PREFIX}:usage:{namespace_tag(org, namespace)}"


def org_settings(org: str) -> str:
    return f"{PREFIX}:org:{org_tag(org)}"


# --- memory rows, profile sections and the structured-profile inputs -------------------------
# A row lives under its user's tag and is named by (agent, session_id, key), so every key a
# write touches is known before the write and one Lua script covers them all. The memory_id
# pointer and the namespace indexes live under the namespace tag, in another slot.


def memory_row(
    org: str, namespace: str, user_id: str, agent: str, session_id: str, key: str
) -> str:
    """Hash of a row's current fields."""
    return (
        f"{PREFIX}:mem:{user_tag(org, namespace, user_id)}:"
        f"{escape(agent)}:{escape(session_id)}:{escape(key)}"
    )


def memory_versions(
    org: str, namespace: str, user_id: str, agent: str, session_id: str, key: str
) -> str:
    """Hash of a row's earlier versions: zero-padded version -> the JSON snapshot of that
    version. The row's current version lives once, in the row (an earlier layout kept it here
    too; readers take it from either)."""
    return (
        f"{PREFIX}:mem-v:{user_tag(org, namespace, user_id)}:"
        f"{escape(agent)}:{escape(session_id)}:{escape(key)}"
    )


def memory_version_order(
    org: str, namespace: str, user_id: str, agent: str, session_id: str, key: str
) -> str:
    """Sorted set (all scores 0) of a row's zero-padded versions, the current one included, so
    lex order is age order."""
    return (
        f"{PREFIX}:mem-vo:{user_tag(org, namespace, user_id)}:"
        f"{escape(agent)}:{escape(session_id)}:{escape(key)}"
    )


def memory_keys(org: str, namespace: str, user_id: str) -> str:
    """Sorted set (all scores 0) of a user's rows as ``key NUL agent NUL session_id``."""
    return f"{PREFIX}:mem-keys:{user_tag(org, namespace, user_id)}"


def memory_keys_pattern() -> str:
    """SCAN pattern of every user's ``memory_keys``: the users with rows."""
    return f"{PREFIX}:mem-keys:*"


def memory_ids(org: str, namespace: str, user_id: str) -> str:
    """Hash memory_id -> row key of a user's rows, for scripts that start from an id."""
    return f"{PREFIX}:mem-ids:{user_tag(org, namespace, user_id)}"


def memory_pointers(org: str, namespace: str) -> str:
    """Hash memory_id -> where it lives (JSON ``[user_id, agent, session_id, key]``); the
    namespace's slot. One hash per namespace, declared to the write scripts, so no script
    builds a key name from an id."""
    return f"{PREFIX}:mem-ptr:{namespace_tag(org, namespace)}"


def memory_pointer(org: str, namespace: str, memory_id: str) -> str:
    """The earlier layout's pointer, one string key per memory_id (same value as a field of
    ``memory_pointers``): read while a store holds it, moved by the release step."""
    return f"{PREFIX}:mem-at:{namespace_tag(org, namespace)}:{escape(memory_id)}"


def memory_pointer_parts(key: str) -> tuple[str, str, str]:
    """(org, namespace, memory_id) of an earlier layout's pointer key (``memory_pointer``)."""
    # escape() writes only %XX escapes, which unquote undoes; the tag and the id hold no ':'.
    tag, memory_id = key.split(":", 2)[2].rsplit(":", 1)
    org, namespace = tag.strip("{}").split("/")
    return unquote(org), unquote(namespace), unquote(memory_id)


def user_erasing(org: str, namespace: str, user_id: str) -> str:
    """Present while the user's erasure runs: memory writes for the user are refused."""
    return f"{PREFIX}:erasing:{user_tag(org, namespace, user_id)}"


def memory_live(org: str, namespace: str, user_id: str) -> str:
    """Sorted set (all scores 0) of a user's live rows, each twice: ``memory_type NUL key NUL
    agent NUL session_id`` and ``NUL key NUL agent NUL session_id``, so a ``memory.list`` page
    with or without a type reads the rows of its page and no other."""
    return f"{PREFIX}:mem-live:{user_tag(org, namespace, user_id)}"


def profile_sections(org: str, namespace: str, user_id: str) -> str:
    """Sorted set (all scores 0) of a user's renderable profile sections (live, not redacted),
    each three times so that a render finds its rows by a range: ``l NUL label NUL agent NUL
    session_id``, ``a NUL agent NUL label NUL session_id``, ``s NUL session_id NUL label NUL
    agent``."""
    return f"{PREFIX}:profile-sections:{user_tag(org, namespace, user_id)}"


def profile_users(org: str, namespace: str) -> str:
    """Set of the users of a namespace that have (or had) profile sections."""
    return f"{PREFIX}:profile-users:{namespace_tag(org, namespace)}"


def profile_label_users(org: str, namespace: str, label: str) -> str:
    """Set of the users of a namespace that have (or had) a section with this label."""
    return f"{PREFIX}:profile-label-users:{namespace_tag(org, namespace)}:{escape(label)}"


def profile_agent_users(org: str, namespace: str, agent: str) -> str:
    """Set of the users of a namespace that have (or had) a section written by this agent."""
    return f"{PREFIX}:profile-agent-users:{namespace_tag(org, namespace)}:{escape(agent)}"


def profile_sources(org: str, namespace: str, user_id: str) -> str:
    """Hash memory_id -> ``content_sha256:confidence:date_ns`` of the user's source facts."""
    return f"{PREFIX}:profile-src:{user_tag(org, namespace, user_id)}"


def profile_source_digest(org: str, namespace: str, user_id: str) -> str:
    """Hash: digest, count, changed_at, removed_at, next_expiry of the user's sources."""
    return f"{PREFIX}:profile-digest:{user_tag(org, namespace, user_id)}"


def profile_source_expiry(org: str, namespace: str, user_id: str) -> str:
    """Sorted set memory_id -> valid_to (ns) of the sources that carry a valid_to."""
    return f"{PREFIX}:profile-src-exp:{user_tag(org, namespace, user_id)}"


def profile_changed_users(org: str, namespace: str) -> str:
    """Sorted set user_id -> changed_at (ns) of users whose sources moved since their build."""
    return f"{PREFIX}:profile-changed:{namespace_tag(org, namespace)}"


def profile_reads(org: str, namespace: str, user_id: str) -> str:
    """Sorted set of ``[agent, client]`` readers of the user's profile, scored by last read."""
    return f"{PREFIX}:profile-reads:{user_tag(org, namespace, user_id)}"


def profile_reads_meta(org: str, namespace: str, user_id: str) -> str:
    """Hash ``[agent, client]`` -> the op of that reader's last read."""
    return f"{PREFIX}:profile-reads-meta:{user_tag(org, namespace, user_id)}"


# --- recall: the lexical index of a user's facts ------------------------------------------------
# Kept by the memory write scripts (app/store/lua/memory_write.lua) in the user's slot, so the
# index moves with the row in the same script. Profile rows are never indexed.


def recall_docs(org: str, namespace: str, user_id: str) -> str:
    """Hash memory_id -> the row's indexed terms (``term:tf term:tf ...``) of its current
    version: what a later write of the row takes out of the postings."""
    return f"{PREFIX}:recall-docs:{user_tag(org, namespace, user_id)}"


def recall_postings(org: str, namespace: str, user_id: str) -> str:
    """Sorted set (all scores 0) of postings (app/store/lua/recall_posting.lua): one lex range
    per term holds its postings, best first, and their count is its document frequency."""
    return f"{PREFIX}:recall-post:{user_tag(org, namespace, user_id)}"


def recall_stats(org: str, namespace: str, user_id: str) -> str:
    """Hash: ``docs`` (indexed rows) and ``length`` (their summed term counts), for BM25, and
    ``layout``, the postings' layout (absent: the first)."""
    return f"{PREFIX}:recall-stats:{user_tag(org, namespace, user_id)}"


def recall_stats_pattern() -> str:
    """SCAN pattern of every user's ``recall_stats``: the users with a lexical index."""
    return f"{PREFIX}:recall-stats:*"


def recall_stats_parts(key: str) -> tuple[str, str, str]:
    """(org, namespace, user_id) of a key ``recall_stats`` built."""
    return user_tag_parts(key)


def recall_users(org: str, namespace: str) -> str:
    """Set of the users of a namespace that have (or had) indexed facts: what a namespace
    search fans out over."""
    return f"{PREFIX}:recall-users:{namespace_tag(org, namespace)}"


# --- recall: the vector leg of a user's facts ---------------------------------------------------
# In the user's slot beside the lexical index: the memory write scripts drop a row's vector and
# list it as due whenever its indexed text changes or it leaves the index (app/store/lua/
# memory_write.lua); the embeddings job (jobs/recall_embed.py) stores vectors back.


def recall_vectors(org: str, namespace: str, user_id: str) -> str:
    """Hash memory_id -> ``fingerprint:base64 of the int8 vector`` of the row's current text, or
    the ``fingerprint`` alone where the vector is in ``recall_vector_set``
    (app/store/recall_vectors.py)."""
    return f"{PREFIX}:recall-vec:{user_tag(org, namespace, user_id)}"


def recall_vector_set(org: str, namespace: str, user_id: str) -> str:
    """Vector set (Redis 8's VADD/VSIM) of the user's fact vectors, element = memory_id: where
    the vectors live when the server has the engine; ``recall_vectors`` then holds only each
    vector's fingerprint (app/store/recall_vectors.py)."""
    return f"{PREFIX}:recall-vset:{user_tag(org, namespace, user_id)}"


def recall_namespace_vector_set(org: str, namespace: str) -> str:
    """Vector set of every fact vector of the namespace, in the namespace's slot, element
    ``recall_namespace_element`` (user and memory_id), attribute ``{"user": user_id}``: what a
    namespace-scope search asks with one VSIM, beside each user's ``recall_vector_set``."""
    return f"{PREFIX}:recall-ns-vset:{namespace_tag(org, namespace)}"


def recall_namespace_element(user_id: str, memory_id: str) -> str:
    """A fact's element name in ``recall_namespace_vector_set``: the user, NUL, the memory_id
    (a memory_id holds none, so the name splits back at its last NUL)."""
    return f"{user_id}\x00{memory_id}"


def recall_vectors_due(org: str, namespace: str, user_id: str) -> str:
    """Sorted set (all scores 0) of the memory_ids whose text changed since their vector was
    stored: what the next embeddings job of the user embeds."""
    return f"{PREFIX}:recall-vec-due:{user_tag(org, namespace, user_id)}"


def recall_vectors_due_pattern() -> str:
    """SCAN pattern of every user's ``recall_vectors_due``: the users with rows waiting for a
    vector (the embeddings sweep, jobs/recall_embed.py)."""
    return f"{PREFIX}:recall-vec-due:*"


def recall_vectors_due_parts(key: str) -> tuple[str, str, str]:
    """(org, namespace, user_id) of a key ``recall_vectors_due`` built."""
    return user_tag_parts(key)


def recall_vectors_sweep() -> str:
    """String: where the last embeddings sweep stopped, as the sha1 of the last due key it
    reached (never a user id), so the next one starts after it and every user gets a turn."""
    return f"{PREFIX}:recall-vec-sweep"


def recall_vectors_generation(org: str, namespace: str, user_id: str) -> str:
    """Hash: ``born`` (server time of the first change) and ``n`` (changes since), bumped by
    every change to the user's stored vectors: a search process keeps the decoded vectors of a
    user while it reads the same pair."""
    return f"{PREFIX}:recall-vec-gen:{user_tag(org, namespace, user_id)}"


def recall_vectors_queued(org: str, namespace: str, user_id: str) -> str:
    """Marker (with a TTL) that an embeddings job of the user is queued: writes enqueue at most
    one job a user until it starts."""
    return f"{PREFIX}:recall-vec-queued:{user_tag(org, namespace, user_id)}"


# --- recall: the vectors of a user's profile sections (loom_search's profile leg) ---------------
# Written by the section-vector job (jobs/profile_vectors.py) in the user's slot, so erasure's
# sweep of the slot takes them with the rows.


def profile_vectors(org: str, namespace: str, user_id: str) -> str:
    """Hash memory_id -> ``fingerprint:vector`` of each profile section of the user, the
    fingerprint naming the model, the length and the section's content_sha256 it was made
    from."""
    return f"{PREFIX}:profile-vec:{user_tag(org, namespace, user_id)}"


def profile_vector_set(org: str, namespace: str, user_id: str) -> str:
    """Vector set of the user's section vectors (element = memory_id) when the server has the
    engine; ``profile_vectors`` then holds only each vector's fingerprint."""
    return f"{PREFIX}:profile-vset:{user_tag(org, namespace, user_id)}"


def profile_vectors_queued(org: str, namespace: str, user_id: str) -> str:
    """Marker (with a lifetime) that a section-vector job for the user is queued: the writes
    meanwhile enqueue no other."""
    return f"{PREFIX}:profile-vec-queued:{user_tag(org, namespace, user_id)}"


# --- structured profiles ------------------------------------------------------------------------


def profile_schema(org: str, namespace: str) -> str:
    """The namespace's profile schema: the document, its sha256, who set it and when."""
    return f"{PREFIX}:profile-schema:{namespace_tag(org, namespace)}"


def structured_namespaces() -> str:
    """Every (org, namespace) with a profile schema: what the passes rotate over."""
    return f"{PREFIX}:structured-namespaces"


# --- typed agent state (seed 002) and namespace config -----------------------------------------
# No raw scope id ever reaches a key: scopes and subjects appear only as their keyed digests
# (hex, so they need no escaping).


def agent_state_tag(org: str, namespace: str, scope_digest: str) -> str:
    """One scope's hash tag: its states (one per agent) and its agents hash share a slot."""
    return "{" + escape(org) + "/" + escape(namespace) + "/" + scope_digest + "}"


def agent_state(org: str, namespace: str, scope_digest: str, agent: str) -> str:
    """The state of one (scope, agent): a hash (body, per-field write times, version, ...)."""
    return f"{PREFIX}:as:{agent_state_tag(org, namespace, scope_digest)}:{escape(agent)}"


def agent_state_agents(org: str, namespace: str, scope_digest: str) -> str:
    """Hash agent -> expiry (ms) of the scope's states, so erasing a scope needs no SCAN."""
    return f"{PREFIX}:as-agents:{agent_state_tag(org, namespace, scope_digest)}"


def agent_state_subject_erasing(org: str, namespace: str, subject_digest: str) -> str:
    """Present while an erasure of the subject runs: writes naming the subject are refused.
    In the slot of the subject's own scope, so a subject-scope write checks it atomically."""
    return f"{PREFIX}:as-erasing:{agent_state_tag(org, namespace, subject_digest)}"


def agent_state_subject(org: str, namespace: str, subject_digest: str) -> str:
    """Set of the state keys naming one subject (console view, erasure, data package)."""
    return f"{PREFIX}:as-subject:{namespace_tag(org, namespace)}:{subject_digest}"


def agent_state_subjects(org: str, namespace: str) -> str:
    """Set of the subject digests that have an index, for the sweep."""
    return f"{PREFIX}:as-subjects:{namespace_tag(org, namespace)}"


def agent_state_expiry(org: str, namespace: str) -> str:
    """Sorted set state key -> expiry (ms): what the sweep looks at."""
    return f"{PREFIX}:as-expiry:{namespace_tag(org, namespace)}"


def agent_state_namespaces() -> str:
    """Set of the namespaces that ever held agent state (JSON ``[org, namespace]``)."""
    return f"{PREFIX}:as-namespaces"


def namespace_config(org: str, namespace: str) -> str:
    """Hash of a namespace's documents: the features document and the object-types registry."""
    return f"{PREFIX}:ns-config:{namespace_tag(org, namespace)}"


def namespace_audit(org: str, namespace: str) -> str:
    """Capped list of a namespace's audit entries (JSON), newest first."""
    return f"{PREFIX}:ns-audit:{namespace_tag(org, namespace)}"


def structured_meta(org: str, namespace: str, user_id: str) -> str:
    """What the worker's last write of a user's structured profile was built from."""
    return f"{PREFIX}:sp-meta:{user_tag(org, namespace, user_id)}"


def structured_blacklist(org: str, namespace: str) -> str:
    """Sorted set user_id -> since when (ns) the user is blacklisted from structured-profile
    builds. Under the namespace's tag, beside the audit list, so a change and its audit entry
    commit together; an erasure removes the user from it like from every namespace index."""
    return f"{PREFIX}:sp-blacklist:{namespace_tag(org, namespace)}"


def structured_users(org: str, namespace: str) -> str:
    """Users of a namespace the worker has written a structured profile for."""
    return f"{PREFIX}:sp-users:{namespace_tag(org, namespace)}"


def structured_expiry(org: str, namespace: str) -> str:
    """Sorted set user_id -> the earliest valid_to (ns) among the sources a user's last build
    counted: the scan takes those users' expired facts out of their digests, so a fact that
    passes its valid_to is rebuilt with no write of its own."""
    return f"{PREFIX}:sp-expiry:{namespace_tag(org, namespace)}"


def structured_schema_swept(org: str, namespace: str) -> str:
    """The schema sha every built user has been listed for a rebuild under."""
    return f"{PREFIX}:sp-swept:{namespace_tag(org, namespace)}"


def worker_next_pass(name: str) -> str:
    """When a worker's next pass is due (seconds), after an idle pass asked for a longer wait,
    and the sum of the wake counts (``structured_wakes``) that pass started from."""
    return f"{PREFIX}:next-pass:{{{escape(name)}}}"


def structured_wakes() -> str:
    """Hash (org, namespace) member -> how many times a schema change or a user's first source
    fact woke the structured passes there: a count that moved since an idle pass ends its wait,
    and one that moved since a namespace's scan makes the next pass scan it again."""
    return f"{PREFIX}:sp-wakes"


# --- erasure and the data package --------------------------------------------------------------
# An erasure is named by a keyed digest of (org, namespace, user_id), never by the raw id: its
# record and receipt outlive the user's data. The glob helpers are for SCAN: the census looks for
# anything left under the user's hash tag, whatever plane wrote it.

_GLOB_SPECIALS = str.maketrans({c: "\\" + c for c in "\\*?[]^"})


def glob_escape(text: str) -> str:
    """``text`` matched literally inside a Redis SCAN/KEYS pattern."""
    return text.translate(_GLOB_SPECIALS)


def erasure(org: str, namespace: str, erasure_id: str) -> str:
    """Hash: an erasure's progress and receipt (status, step, times, counts, census)."""
    return f"{PREFIX}:erasure:{namespace_tag(org, namespace)}:{erasure_id}"


def erasure_lock(org: str, namespace: str, erasure_id: str) -> str:
    """Held (with a TTL) by the process running an erasure, so two runs never interleave."""
    return f"{PREFIX}:erasure-lock:{namespace_tag(org, namespace)}:{erasure_id}"


def erasures_due() -> str:
    """Set of the erasures whose run is due (JSON ``[org, namespace, erasure_id]``): what the
    resume pass reads to find a run whose worker died."""
    return f"{PREFIX}:erasures-due"


def user_pattern(org: str, namespace: str, user_id: str) -> str:
    """Every key under the user's hash tag. Escaped components hold no brace, so the tag
    appears in a key only as that key's own tag."""
    return "*" + glob_escape(user_tag(org, namespace, user_id)) + "*"


def memory_pointer_pattern(org: str, namespace: str) -> str:
    """Every earlier layout's memory_id pointer of a namespace (``memory_pointer``)."""
    return f"{PREFIX}:mem-at:{glob_escape(namespace_tag(org, namespace))}:*"


def memory_pointers_everywhere_pattern() -> str:
    """Every earlier layout's memory_id pointer of every namespace (the release moves them)."""
    return f"{PREFIX}:mem-at:*"


def worker_state_pattern() -> str:
    """Every worker's kept state (its scan lists and waits name users)."""
    return f"{PREFIX}:worker-state:*"


def prefix_of(key: str) -> str:
    """A key's builder prefix: what precedes its hash tag (``loom:mem:`` ...)."""
    return key.split("{", 1)[0]


# --- profile consolidation (the consolidated_profile fold) -------------------------------------


def consolidation_changed(org: str, namespace: str) -> str:
    """Sorted set user_id -> changed_at (ns) of users whose sources moved since their last fold.

    Fed next to ``profile_changed_users`` on every write, but cleared only by the fold, so the
    two workers never consume each other's changes."""
    return f"{PREFIX}:fold-changed:{namespace_tag(org, namespace)}"


def fact_namespaces() -> str:
    """Every (org, namespace) a source fact was written in (JSON ``[org, namespace]``)."""
    return f"{PREFIX}:fact-namespaces"


def consolidation_meta(org: str, namespace: str, user_id: str) -> str:
    """What the last fold of a user read and wrote: fold digest, section hash, refusal mark."""
    return f"{PREFIX}:fold-meta:{user_tag(org, namespace, user_id)}"


def consolidation_expiry(org: str, namespace: str) -> str:
    """Sorted set user_id -> the earliest valid_to (ns) among the facts their last fold read."""
    return f"{PREFIX}:fold-expiry:{namespace_tag(org, namespace)}"


def consolidation_cursor() -> str:
    """The namespace (JSON ``[org, namespace]``) the last consolidation pass stopped at."""
    return f"{PREFIX}:fold-cursor"


def structured_parked(org: str, namespace: str) -> str:
    """Users whose build was refused or failed, scored by when they may be tried again; kept
    out of the changed-users index meanwhile, so they never crowd out users behind them."""
    return f"{PREFIX}:sp-parked:{namespace_tag(org, namespace)}"


# --- model-call budgets ------------------------------------------------------------------------
# Every key of an org's budgets shares the org's tag, so one script reserves against the org's
# budget and a namespace's budget at once, in one slot, on Redis Cluster too.


def budget_org_limits(org: str) -> str:
    """Hash: the org's caps (calls, tokens; absent = no cap), who set them and when."""
    return f"{PREFIX}:budget-org:{org_tag(org)}"


def budget_namespace_limits(org: str, namespace: str) -> str:
    """Hash: a namespace's caps (calls, tokens; absent = no cap), who set them and when."""
    return f"{PREFIX}:budget-ns:{org_tag(org)}:{escape(namespace)}"


def budget_window(org: str) -> str:
    """Sorted set of the org's reservations in the rolling window, scored by when (ms)."""
    return f"{PREFIX}:budget-window:{org_tag(org)}"


def budget_reservations(org: str) -> str:
    """Hash reservation id -> ``tokens TAB settled TAB namespace`` of the window's reservations."""
    return f"{PREFIX}:budget-res:{org_tag(org)}"


def budget_spent(org: str) -> str:
    """Hash of what the window holds: ``calls``/``tokens`` for the org and
    ``calls:<namespace>``/``tokens:<namespace>`` per namespace."""
    return f"{PREFIX}:budget-spent:{org_tag(org)}"


def budget_deferral_logged(org: str, namespace: str) -> str:
    """Present (for one window) once a deferral for budget in the namespace was logged."""
    return f"{PREFIX}:budget-logged:{org_tag(org)}:{escape(namespace)}"
