"""The console's pages: sign in, home, a namespace, a user, erasure, tokens.

Each view reads and writes only through ``app.console.blueprint.run`` (the API's op path). A refusal
from an op (role, reach, validation, a stale hash) is shown on the page in words, with the
HTTP status the API would have answered.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from flask import (
    Response,
    abort,
    current_app,
    g,
    make_response,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from werkzeug.datastructures import ImmutableMultiDict

from app.auth import ANY, Principal
from app.console import credential
from app.console.blueprint import (
    ID_FIELDS,
    bp,
    csrf_matches,
    csrf_token,
    end_session,
    id_reference,
    resolve_reference,
    run,
)
from app.console.display import CHART_BUCKETS, budget_chart
from app.console.explain import structured_reason
from app.errors import (
    AuthInvalid,
    AuthRequired,
    ErasureRunning,
    HashMismatch,
    LoomError,
    SchemaRuleViolation,
)
from app.ops.profile_schema import SEED_EXAMPLE_SCHEMA

# How many pages of 100 rows a listing reads before it says the rest is not shown.
LIST_PAGES = 10
PAGE = 100
ERASURE_POLL_SECONDS = 1
STRUCTURED_KEY = "structured_profile"


class NotSignedIn(Exception):
    """No usable token in the session, with auth on: the person signs in first."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message


# --- session, CSRF, the signed-in principal -----------------------------------------------------


@bp.before_request
def _guard() -> Response | None:
    if request.method == "POST" and not csrf_matches(request.form.get("csrf_token")):
        return _page(
            "error.html", 400,
            title="Form refused",
            message="This form arrived without its security token (CSRF), so nothing was "
                    "changed. Reload the page and send the form again.",
        )
    return _resolve_id_references()


def _resolve_id_references() -> Response | None:
    """The page's query with each id reference (``r:...``) back to the id it stands for."""
    if not any(name in request.args for name in ID_FIELDS):
        return None
    resolved = []
    for name, value in request.args.items(multi=True):
        if name in ID_FIELDS:
            found = resolve_reference(value)
            if found is None:
                return _page("error.html", 404, title="Link expired",
                             message="This link was made for another sign-in. Open the user "
                                     "again from the namespace page.")
            value = found
        resolved.append((name, value))
    # werkzeug's Request.args is a settable cached property: the views read the ids.
    request.args = ImmutableMultiDict(resolved)  # type: ignore[misc]
    return None


@bp.url_defaults
def _ids_as_references(endpoint: str, values: dict[str, Any]) -> None:
    """``url_for`` for a console page writes user and session ids as references."""
    for name in ID_FIELDS:
        value = values.get(name)
        if isinstance(value, str):
            values[name] = id_reference(value)


@bp.after_request
def _headers(response: Response) -> Response:
    # Pages show personal data and one-time secrets: never cached, never framed, and no
    # script or style from anywhere but this app.
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Content-Security-Policy"] = (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )
    return response


@bp.app_context_processor
def _template_helpers() -> dict[str, Any]:
    return {"csrf_token": csrf_token, "principal": g.get("console_principal")}


def _services() -> Any:
    return current_app.extensions["loom"]


def current_principal() -> Principal:
    """The principal of the session's sign-in (``app.console.credential``: the session keeps
    no token); with auth off and no sign-in, the single user."""
    services = _services()
    if "token" in session:
        # A session from before sessions kept no token holds one raw: it ends here.
        end_session()
        raise NotSignedIn("Sign in again.")
    signed_in = session.get("credential")
    if not isinstance(signed_in, dict):
        if services.settings.auth != "off":
            raise NotSignedIn()
        signed_in = {"kind": credential.NONE}
    try:
        return credential.principal_of(services, signed_in)
    except (AuthInvalid, AuthRequired) as error:
        end_session()  # a revoked token ends every session signed in with it
        raise NotSignedIn(f"Your token no longer works: {error.message}") from None


def page(view: Callable[..., Any]) -> Callable[..., Any]:
    """A page that needs a principal: sign-in first when there is none."""

    @functools.wraps(view)
    def wrapped(**kwargs: Any) -> Any:
        try:
            g.console_principal = current_principal()
        except NotSignedIn as missing:
            if missing.message:
                session["notice"] = missing.message
            return redirect(url_for("console.sign_in", next=request.full_path.rstrip("?")))
        return view(g.console_principal, **kwargs)

    return wrapped


def _page(template: str, status: int = 200, **context: Any) -> Response:
    response = make_response(render_template(template, **context), status)
    return response


def _error_page(error: LoomError, title: str = "Refused") -> Response:
    return _page("error.html", error.status, title=title, message=describe(error),
                 code=error.code)


def describe(error: LoomError) -> str:
    """An op's refusal as a sentence, with the fields it names."""
    fields = error.details.get("fields")
    if isinstance(fields, dict) and fields:
        parts = [f"{name}: {'; '.join(map(str, _flat(messages)))}"
                 for name, messages in fields.items()]
        return f"{error.message} ({', '.join(parts)})"
    return error.message


def _flat(messages: Any) -> list[Any]:
    if isinstance(messages, dict):
        return [f"{key}: {value}" for key, inner in messages.items() for value in _flat(inner)]
    if isinstance(messages, list):
        return [value for inner in messages for value in _flat(inner)]
    return [messages]


def _any_agent(principal: Principal) -> str:
    """The agent a namespace-wide read names: the token's own, else any agent."""
    return principal.agent or "*"


def _safe_next(target: str | None) -> str:
    if target and target.startswith("/console") and not target.startswith("//"):
        return target
    return url_for("console.home")


# --- sign in and out ----------------------------------------------------------------------------


@bp.route("/sign-in", methods=["GET", "POST"])
def sign_in() -> Any:
    services = _services()
    next_page = _safe_next(request.values.get("next"))
    auth_off = services.settings.auth == "off"
    if request.method == "GET":
        notice = session.pop("notice", "")
        return _page("sign_in.html", next_page=next_page, auth_off=auth_off, notice=notice)
    token = request.form.get("token", "").strip()
    if not token and not auth_off:
        return _page("sign_in.html", 422, next_page=next_page, auth_off=auth_off,
                     error="Paste a Loom token to sign in.")
    try:
        _principal, signed_in = credential.sign_in(services, token)
    except LoomError as error:
        return _page("sign_in.html", 401, next_page=next_page, auth_off=auth_off,
                     error=f"That token was refused: {error.message}")
    # A new session id and CSRF token with the new identity, so neither an id nor a token
    # planted before sign-in is worth anything after it.
    session.clear()
    session.renew()  # type: ignore[attr-defined]
    session.permanent = True
    session["credential"] = signed_in  # never the token (app.console.credential)
    csrf_token()
    return redirect(next_page)


@bp.route("/sign-out", methods=["POST"])
def sign_out() -> Any:
    end_session()
    response = redirect(url_for("console.sign_in"))
    return response


# --- home ---------------------------------------------------------------------------------------


@bp.route("/")
@page
def home(principal: Principal) -> Any:
    namespace = request.args.get("namespace", "").strip()
    if namespace:
        return redirect(url_for("console.namespace", namespace=namespace))
    fixed_namespace = None if principal.namespace == ANY else principal.namespace
    return _page("home.html", fixed_namespace=fixed_namespace,
                 auth_off=_services().settings.auth == "off")


@bp.route("/find-user", methods=["GET", "POST"])
@page
def find_user(principal: Principal) -> Any:
    # By POST from the forms, so the typed id is in no address; the page opened is addressed
    # by the id's reference.
    namespace = request.values.get("namespace", "").strip()
    user_id = request.values.get("user_id", "").strip()
    if not namespace or not user_id:
        return _page("error.html", 422, title="Not opened",
                     message="Give both the namespace and the user id.")
    return redirect(url_for("console.user", namespace=namespace, user_id=user_id))


# --- a namespace --------------------------------------------------------------------------------


def _list_rows(principal: Principal, body: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """Every row memory.list answers for ``body``, up to LIST_PAGES pages; True when cut."""
    rows: list[dict[str, Any]] = []
    cursor = None
    for _ in range(LIST_PAGES):
        answer = run("memory.list", {**body, "limit": PAGE,
                                     **({"cursor": cursor} if cursor else {})}, principal)
        rows.extend(answer["memories"])
        cursor = answer["next_cursor"]
        if not cursor:
            return rows, False
    return rows, True


def _section_rows(principal: Principal, namespace: str, user_id: str) -> dict[str, Any]:
    try:
        rows, cut = _list_rows(principal, {
            "namespace": namespace, "agent": _any_agent(principal), "user_id": user_id,
            "memory_type": "profile",
        })
    except LoomError as error:
        return {"error": describe(error), "by_agent": {}, "cut": False}
    by_agent: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        row["text"] = _text_of(row["value"])
        by_agent.setdefault(row["agent"], []).append(row)
    return {"error": "", "by_agent": dict(sorted(by_agent.items())), "cut": cut}


def _text_of(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=2)


def _try(name: str, body: dict[str, Any], principal: Principal) -> tuple[dict[str, Any], str]:
    """An op's answer, or an empty answer and the refusal in words (a section of a page)."""
    try:
        return run(name, body, principal), ""
    except LoomError as error:
        return {}, describe(error)


def _schema_context(principal: Principal, namespace: str) -> dict[str, Any]:
    schema, schema_error = _try("profile_schema.get", {"namespace": namespace}, principal)
    doc = schema.get("json_schema")
    properties = (doc or {}).get("properties") or {}
    return {
        "schema": schema,
        "schema_error": schema_error,
        "schema_properties": properties,
        "schema_text": json.dumps(doc if doc is not None else SEED_EXAMPLE_SCHEMA, indent=2),
    }


@bp.route("/ns/<namespace>")
@page
def namespace(principal: Principal, namespace: str) -> Any:
    return _namespace_page(principal, namespace)


def _namespace_page(principal: Principal, namespace: str, status: int = 200,
                    **overrides: Any) -> Response:
    usage, usage_error = _try("usage.get", {"namespace": namespace}, principal)
    budget, budget_error = _try(
        "budget.get", {"namespace": namespace, "timeline_buckets": CHART_BUCKETS}, principal)
    context: dict[str, Any] = {
        "namespace": namespace,
        "budget": budget,
        "budget_error": budget_error,
        "budget_chart": budget_chart(budget),
        "saved": request.args.get("saved", ""),
        "sections": _section_rows(principal, namespace, "-"),
        "usage": usage,
        "usage_error": usage_error,
        "new_section": {"agent": principal.agent or "", "label": "", "value": ""},
        "new_section_error": "",
        "schema_field_error": "",
        **_schema_context(principal, namespace),
    }
    context.update(overrides)
    return _page("namespace.html", status, **context)


@bp.route("/ns/<namespace>/sections", methods=["POST"])
@page
def section_create(principal: Principal, namespace: str) -> Any:
    form = request.form
    agent = form.get("agent", "").strip() or (principal.agent or "")
    label, value = form.get("label", "").strip(), form.get("value", "")
    user_id = form.get("user_id", "-").strip() or "-"
    new_section = {"agent": agent, "label": label, "value": value}
    where = {"namespace": namespace, "agent": agent, "user_id": user_id}
    try:
        found = run("memory.get", {**where, "key": label, "memory_type": "profile"}, principal)
        if found["found"] and not found["memory"]["deleted"]:
            message = (f"A section labelled {label!r} already exists for agent {agent!r}: "
                       "open it to edit it.")
        else:
            run("profile.set", {**where, "label": label, "value": value}, principal)
            return redirect(_back(namespace, user_id, saved=label))
    except LoomError as error:
        message = describe(error)
    if user_id != "-":
        return _page("error.html", 422, title="Section not created", message=message)
    return _namespace_page(principal, namespace, 422, new_section=new_section,
                           new_section_error=message)


def _back(namespace: str, user_id: str, saved: str = "") -> str:
    """The page a section belongs to; ``saved`` names the section just saved, which that page
    confirms."""
    extra: dict[str, Any] = {"saved": saved} if saved else {}
    if user_id == "-":
        return url_for("console.namespace", namespace=namespace, **extra)
    return url_for("console.user", namespace=namespace, user_id=user_id, **extra)


def _where(namespace: str, values: Any) -> dict[str, Any]:
    return {
        "namespace": namespace,
        "agent": values.get("agent", ""),
        "user_id": values.get("user_id", "-") or "-",
        "session_id": values.get("session_id", "-") or "-",
    }


@bp.route("/ns/<namespace>/section", methods=["GET"])
@page
def section(principal: Principal, namespace: str) -> Any:
    where = _where(namespace, request.args)
    label = request.args.get("label", "")
    try:
        found = run("memory.get", {**where, "key": label, "memory_type": "profile"}, principal)
    except LoomError as error:
        return _error_page(error)
    if not found["found"]:
        return _page("error.html", 404, title="No such section",
                     message=f"There is no section {label!r} for agent {where['agent']!r}.")
    row = found["memory"]
    return _section_page(namespace, where, label, row, text=_text_of(row["value"]))


def _section_page(namespace: str, where: dict[str, Any], label: str, row: dict[str, Any],
                  *, text: str, status: int = 200, error: str = "",
                  conflict: bool = False) -> Response:
    return _page(
        "section.html", status, namespace=namespace, where=where, label=label, row=row,
        text=text, current_text=_text_of(row["value"]), error=error, conflict=conflict,
        editable=isinstance(row["value"], str) and label != STRUCTURED_KEY,
        back=_back(namespace, where["user_id"]),
    )


@bp.route("/ns/<namespace>/section", methods=["POST"])
@page
def section_save(principal: Principal, namespace: str) -> Any:
    where = _where(namespace, request.form)
    label = request.form.get("label", "")
    value = request.form.get("value", "")
    try:
        body = {**where, "label": label, "value": value,
                "if_match_sha256": request.form.get("if_match_sha256", "")}
        # A set without char_limit gives the section the default cap: keep the one it has.
        char_limit = request.form.get("char_limit", "")
        if char_limit.isdigit():
            body["char_limit"] = int(char_limit)
        run("profile.set", body, principal)
        return redirect(_back(namespace, where["user_id"], saved=label))
    except HashMismatch:
        current = run("memory.get", {**where, "key": label, "memory_type": "profile"},
                      principal)
        if not current["found"]:
            return _page("error.html", 409, title="Section gone",
                         message=f"Section {label!r} was removed while you edited it.")
        return _section_page(
            namespace, where, label, current["memory"], text=value, status=409, conflict=True,
            error="Not saved: this section changed since you opened it. Its current text is "
                  "shown below; your text is still in the box. Save again to replace the "
                  "current text with yours.",
        )
    except LoomError as error:
        try:
            found = run("memory.get", {**where, "key": label, "memory_type": "profile"},
                        principal)
        except LoomError:
            return _error_page(error, "Not saved")
        if not found["found"]:
            return _error_page(error, "Not saved")
        return _section_page(namespace, where, label, found["memory"], text=value,
                             status=error.status, error=f"Not saved: {describe(error)}")


@bp.route("/ns/<namespace>/section/delete", methods=["POST"])
@page
def section_delete(principal: Principal, namespace: str) -> Any:
    where = _where(namespace, request.form)
    label = request.form.get("label", "")
    try:
        run("memory.delete", {**where, "key": label, "memory_type": "profile"}, principal)
    except LoomError as error:
        return _error_page(error, "Not deleted")
    return redirect(_back(namespace, where["user_id"]))


@bp.route("/ns/<namespace>/schema", methods=["POST"])
@page
def schema_set(principal: Principal, namespace: str) -> Any:
    text = request.form.get("json_schema", "")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        return _schema_refused(principal, namespace, text, f"This is not JSON: {exc}.", 422)
    try:
        run("profile_schema.set", {"namespace": namespace, "json_schema": doc}, principal)
    except SchemaRuleViolation as error:
        where = ", ".join(error.details.get("fields") or {})
        message = f"{error.message} (rule {error.rule}" + (f", at {where})" if where else ")")
        return _schema_refused(principal, namespace, text, message, error.status)
    except LoomError as error:
        return _schema_refused(principal, namespace, text, describe(error), error.status)
    return redirect(url_for("console.namespace", namespace=namespace) + "#schema")


def _schema_refused(principal: Principal, namespace: str, text: str, message: str,
                    status: int) -> Response:
    return _namespace_page(principal, namespace, status, schema_text=text,
                           schema_field_error=message)


@bp.route("/ns/<namespace>/schema/clear", methods=["POST"])
@page
def schema_clear(principal: Principal, namespace: str) -> Any:
    try:
        run("profile_schema.clear", {"namespace": namespace}, principal)
    except LoomError as error:
        return _error_page(error, "Schema not cleared")
    return redirect(url_for("console.namespace", namespace=namespace) + "#schema")


# --- a user -------------------------------------------------------------------------------------


@bp.route("/ns/<namespace>/user")
@page
def user(principal: Principal, namespace: str) -> Any:
    user_id = request.args.get("user_id", "").strip()
    if not user_id or user_id == "-":
        return _page("error.html", 422, title="No user named",
                     message="Give the user id of the profile to open.")
    agent = _any_agent(principal)
    who = {"namespace": namespace, "agent": agent, "user_id": user_id}
    structured, structured_error = _try("profile.structured", who, principal)
    row_answer, _ = _try("memory.get", {**who, "agent": "-", "key": STRUCTURED_KEY,
                                        "memory_type": "profile"}, principal)
    structured_row = row_answer.get("memory") if row_answer.get("found") else None
    history: dict[str, Any] = {}
    history_error = ""
    why = ""
    if structured:
        if structured.get("memory_id"):
            history, history_error = _try("memory.history", {
                **who, "memory_id": structured["memory_id"], "limit": 20}, principal)
        schema, _ = _try("profile_schema.get", {"namespace": namespace}, principal)
        facts: list[dict[str, Any]] = []
        if structured.get("status") == "stale":
            try:
                facts, _cut = _list_rows(principal, {**who, "include_deleted": True})
            except LoomError:
                facts = []
        why = structured_reason(structured, structured_row, schema, facts,
                                model_off=_model_off(principal, namespace))
    activity, activity_error = _try("profile.activity", {**who, "lookback_days": 30}, principal)
    states, states_error = _try("agent_state.of_profile",
                                {"namespace": namespace, "profile_id": user_id}, principal)
    scope = {
        "agent": request.args.get("agent", "").strip(),
        "session_id": request.args.get("session_id", "").strip() or "-",
        "run_id": request.args.get("run_id", "").strip() or "-",
    }
    listed_scopes, scopes_error = _try("working_memory.scopes",
                                       {"namespace": namespace, "user_id": user_id}, principal)
    blocks: dict[str, Any] = {}
    blocks_error = ""
    if scope["agent"]:
        blocks, blocks_error = _try("working_memory.render", {**who, **scope, "limit": 100},
                                    principal)
    sections = _section_rows(principal, namespace, user_id)
    known_agents = sorted(
        {name for name in sections["by_agent"] if name not in ("-", "*")}
         | {entry["agent"] for entry in activity.get("entries", [])
            if entry["agent"] not in ("-", "*")}
    )
    return _page(
        "user.html", namespace=namespace, user_id=user_id,
        sections=sections, structured=structured, structured_error=structured_error,
        why=why, history=history, history_error=history_error,
        activity=activity, activity_error=activity_error,
        states=states, states_error=states_error,
        scope=scope, blocks=blocks, blocks_error=blocks_error, known_agents=known_agents,
        scopes=listed_scopes.get("scopes", []), scopes_error=scopes_error,
        new_section={"agent": principal.agent or "", "label": "", "value": ""},
        saved=request.args.get("saved", ""),
    )


def _model_off(principal: Principal, namespace: str) -> str:
    """Why the worker makes no model call, in words, or "" when it may make them: the worker
    reads the same settings as this process, and the org's switch is in usage.get."""
    settings = _services().settings
    if not settings.llm_base_url.strip() or not settings.llm_model.strip():
        return "no model is configured (LOOM_LLM_BASE_URL and LOOM_LLM_MODEL)"
    usage, _error = _try("usage.get", {"namespace": namespace}, principal)
    if usage and not usage.get("model_calls_enabled", True):
        return "model calls are switched off for the org"
    return ""


# --- erasure ------------------------------------------------------------------------------------


@bp.route("/ns/<namespace>/erase", methods=["GET", "POST"])
@page
def erase(principal: Principal, namespace: str) -> Any:
    user_id = request.values.get("user_id", "").strip()
    if request.method == "GET":
        return _page("erase.html", namespace=namespace, user_id=user_id, error="")
    confirmation = request.form.get("confirm", "")
    if not user_id or confirmation != user_id:
        return _page("erase.html", 422, namespace=namespace, user_id=user_id,
                     error="Nothing was erased: type the user id exactly as shown to confirm.")
    who = {"namespace": namespace, "user_id": user_id}
    try:
        receipt = run("user.erase", who, principal)
    except ErasureRunning:
        # Already under way (another tab, the CLI, a worker): follow that erasure instead.
        receipt = run("erasure.status", who, principal)
    except LoomError as error:
        return _page("erase.html", error.status, namespace=namespace, user_id=user_id,
                     error=f"Not erased: {describe(error)}")
    return redirect(url_for("console.erasure", namespace=namespace,
                            erasure_id=receipt["erasure_id"]))


@bp.route("/ns/<namespace>/erasures/<erasure_id>")
@page
def erasure(principal: Principal, namespace: str, erasure_id: str) -> Any:
    try:
        receipt = run("erasure.status", {"namespace": namespace, "erasure_id": erasure_id},
                      principal)
    except LoomError as error:
        return _error_page(error, "No receipt")
    running = receipt.get("status") == "running"
    response = _page("erasure.html", namespace=namespace, receipt=receipt, running=running,
                     poll_seconds=ERASURE_POLL_SECONDS)
    if running:
        # The page polls erasure.status by reloading itself until the saga has finished.
        response.headers["Refresh"] = str(ERASURE_POLL_SECONDS)
    return response


# --- tokens -------------------------------------------------------------------------------------


def _tokens_page(principal: Principal, status: int = 200, **overrides: Any) -> Response:
    listed, list_error = _try("token.list", {}, principal)
    context: dict[str, Any] = {"created": None, "mint_error": "", "form": {}, **overrides}
    return _page("tokens.html", status, tokens=listed.get("tokens", []),
                 list_error=list_error, **context)


@bp.route("/tokens")
@page
def tokens(principal: Principal) -> Any:
    return _tokens_page(principal)


@bp.route("/tokens", methods=["POST"])
@page
def token_mint(principal: Principal) -> Any:
    form = request.form
    body: dict[str, Any] = {"role": form.get("role", ""), "label": form.get("label", "")}
    for name in ("namespace", "read_scope", "read_user_id", "expires_at"):
        value = form.get(name, "").strip()
        if value:
            body[name] = value
    if form.get("agent_state"):
        body["scopes"] = ["agent_state"]
    try:
        created = run("token.create", body, principal)
    except LoomError as error:
        return _tokens_page(principal, error.status, mint_error=describe(error),
                            form=dict(form))
    return _tokens_page(principal, created=created)


@bp.route("/tokens/revoke", methods=["POST"])
@page
def token_revoke(principal: Principal) -> Any:
    try:
        run("token.revoke", {"token_id": request.form.get("token_id", "")}, principal)
    except LoomError as error:
        return _error_page(error, "Not revoked")
    return redirect(url_for("console.tokens"))


@bp.route("/<path:anything>")
def not_found(anything: str) -> Any:
    abort(404)


@bp.errorhandler(404)
def _no_page(error: Exception) -> Response:
    return _page("error.html", 404, title="No such page",
                 message="The console has no page at this address.")


@bp.errorhandler(LoomError)
def _refused(error: LoomError) -> Response:
    return _error_page(error)
