"""Every Redis key Loom writes is built here, and only here.

A user's data in one namespace shares the hash tag ``{org/namespace/user_id}``, so one
WATCH/MULTI or one Lua script can cover a user's blocks, facts and profile, and the same code
runs unchanged on Redis Cluster. Namespace-wide rows use user ``-``; namespace indexes use the
tag ``{org/namespace}``. Each component is escaped so that no id can close the tag early or
collide with another split of the same characters.
"""

from __future__ import annotations

PREFIX = "loom"

# '%' first so escapes never escape each other; '{' and '}' would end the hash tag; '/' and
# ':' separate components.
_ESCAPES = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D", "/": "%2F", ":": "%3A"})


def escape(component: str) -> str:
    return component.translate(_ESCAPES)


def user_tag(org: str, namespace: str, user_id: str = "-") -> str:
    return "{" + escape(org) + "/" + escape(namespace) + "/" + escape(user_id) + "}"


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


def working_memory_scopes(org: str, namespace: str, user_id: str) -> str:
    """Set of a user's working-memory scope keys, so erasure and packs need no SCAN."""
    return f"{PREFIX}:wm-scopes:{user_tag(org, namespace, user_id)}"


# --- tokens and request budgets ---------------------------------------------------------------


def token(token_id: str) -> str:
    """A token's row: claims and the keyed hash of the secret."""
    return f"{PREFIX}:token:{{{escape(token_id)}}}"


def org_tokens(org: str) -> str:
    return f"{PREFIX}:tokens:{org_tag(org)}"


def rate_window(caller: str, window: int) -> str:
    """Requests a caller (token id, or the single user) made in one fixed window."""
    return f"{PREFIX}:rate:{{{escape(caller)}}}:{window}"
