"""The web console at ``/console``: pages for the people who run Loom.

The console is server-rendered by the same Flask app (Jinja templates and one stylesheet, all
served from this package). It owns no data and no Redis access: every page runs ops through
``app.api.run_op``, the same path the HTTP API takes (role, input schema, identity, handler),
as the principal of the token the person signed in with, and as the client ``loom-console``;
its calls are marked as the console's in process (``by_console``), which keeps its reads out
of ``profile.activity`` (a client calling the API with that name is recorded like any other).

The signed-in token lives in Flask's session: a cookie signed with a key derived from the
install's secret, HttpOnly, SameSite=Strict, scoped to ``/console`` and good for
``SESSION_HOURS``. The token is checked again on every page, so a revoked token stops working
at once. Every form carries the session's CSRF token; a POST without it is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta
from typing import Any

from flask import Blueprint, Flask, Request, current_app, session
from flask.sessions import SecureCookieSession, SecureCookieSessionInterface

from app.auth import Principal
from app.registry import load_ops
from app.store.activity import CONSOLE_CLIENT

SESSION_HOURS = 8
SESSION_COOKIE = "loom_console"
CONSOLE_PATH = "/console"

bp = Blueprint(
    "console",
    __name__,
    url_prefix=CONSOLE_PATH,
    template_folder="templates",
    static_folder="static",
    static_url_path="/static",
)


class ConsoleSessions(SecureCookieSessionInterface):
    """Flask's signed-cookie session, opened only under ``/console``, the cookie's path: an API
    request has no session to read, and opening one would cost it a signer and a cookie parse
    (Flask gives it the null session instead)."""

    def open_session(self, app: Flask, request: Request) -> SecureCookieSession | None:
        if not request.path.startswith(CONSOLE_PATH):
            return None
        return super().open_session(app, request)


def session_key(secret_key: str) -> bytes:
    """The cookie signing key: derived from the install's secret, never the secret itself."""
    return hmac.new(secret_key.encode(), b"loom-console-session", hashlib.sha256).digest()


def register_console(app: Flask) -> None:
    """Mount the console on ``app``; the caller has built ``app.extensions["loom"]``."""
    services = app.extensions["loom"]
    app.secret_key = session_key(services.settings.secret_key)
    app.session_interface = ConsoleSessions()
    app.config.update(
        SESSION_COOKIE_NAME=SESSION_COOKIE,
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        SESSION_COOKIE_PATH=CONSOLE_PATH,
        PERMANENT_SESSION_LIFETIME=timedelta(hours=SESSION_HOURS),
    )
    from app.console import views  # noqa: F401 (importing declares the routes)

    app.register_blueprint(bp)


def csrf_token() -> str:
    """This browser session's CSRF token, made on first use."""
    token = session.get("csrf")
    if not token:
        token = secrets.token_urlsafe(32)
        session["csrf"] = token
        session.permanent = True
    return str(token)


def csrf_matches(sent: str | None) -> bool:
    expected = session.get("csrf")
    return bool(expected and sent) and hmac.compare_digest(str(expected), str(sent))


def run(name: str, body: dict[str, Any], principal: Principal) -> dict[str, Any]:
    """Run op ``name`` for the signed-in principal as the API would, as the console client."""
    from app.api import run_op

    services = current_app.extensions["loom"]
    declared = load_ops().get(name)
    if declared is None:
        raise KeyError(name)
    services.check_budget(principal)
    return run_op(declared, body, principal, services, client=CONSOLE_CLIENT, by_console=True)
