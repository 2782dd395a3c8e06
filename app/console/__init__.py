"""The web console at ``/console``: pages for the people who run Loom.

The console is server-rendered by the same Flask app (Jinja templates and one stylesheet, all
served from this package); this module mounts it and keeps its sessions,
``app.console.blueprint`` holds what every page shares and ``app.console.views`` the pages.
It owns no data and no Redis access: every page runs ops through ``app.api.run_op``, the same
path the HTTP API takes (role, input schema, identity, handler),
as the principal of the token the person signed in with, and as the client ``loom-console``;
its calls are marked as the console's in process (``by_console``), which keeps its reads out
of ``profile.activity`` (a client calling the API with that name is recorded like any other).

The session is kept server-side (``app.store.console_sessions``): the cookie holds only a
random session id, HttpOnly, SameSite=Strict, ``Secure`` when the request came over HTTPS
(behind proxies, ``LOOM_TRUSTED_PROXIES`` says so), scoped to ``/console`` and good for
``SESSION_HOURS``. Signing in issues a new id; signing out deletes the session, so a copied
cookie stops working. The session keeps no token, only what finds its principal again
(``app.console.credential``: a minted token's id, a keyed digest of the admin token), checked
on every page; a session whose token stops working is deleted. Every form carries the
session's CSRF token; a POST without it is refused.

No user or session id goes into a console address, where access logs and browser history
would keep it after the user is erased: ``url_for`` writes each as a keyed reference
(``r:<hash>``) that this session maps back (``id_reference`` / ``resolve_references``), and
the forms that name a user send it by POST.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta
from typing import Any

from flask import Flask, Request, request
from flask.sessions import SessionInterface, SessionMixin
from werkzeug.datastructures import CallbackDict
from werkzeug.wrappers import Response

from app.console import views  # noqa: F401 (importing declares the routes)
from app.console.blueprint import CONSOLE_PATH, bp
from app.store.console_sessions import ConsoleSessionStore

SESSION_HOURS = 8
SESSION_COOKIE = "loom_console"
SESSION_SECONDS = SESSION_HOURS * 3600


class ConsoleSession(CallbackDict[str, Any], SessionMixin):  # type: ignore[misc]
    """A session's values, its id (None until first saved) and an id it replaced."""

    def __init__(self, initial: dict[str, Any] | None = None, sid: str | None = None) -> None:
        def on_update(changed: ConsoleSession) -> None:
            changed.modified = True

        super().__init__(initial, on_update)
        self.sid = sid
        self.retired: str | None = None
        self.modified = False

    def renew(self) -> None:
        """A new id at the next save (at sign-in: an id known before it is worthless after)."""
        if self.sid is not None:
            self.retired = self.sid
        self.sid = None
        self.modified = True


class ConsoleSessions(SessionInterface):
    """Server-side sessions, opened only under ``/console``, the cookie's path: an API request
    has no session to read (Flask gives it the null session instead)."""

    def _store(self, app: Flask) -> ConsoleSessionStore:
        store: ConsoleSessionStore = app.extensions["loom"].store(ConsoleSessionStore)
        return store

    def open_session(self, app: Flask, request: Request) -> ConsoleSession | None:
        if not request.path.startswith(CONSOLE_PATH):
            return None
        sid = request.cookies.get(self.get_cookie_name(app), "")
        if sid and len(sid) <= 128:
            data = self._store(app).load(sid)
            if data is not None:
                return ConsoleSession(data, sid=sid)
        return ConsoleSession()

    def save_session(self, app: Flask, session: SessionMixin, response: Response) -> None:
        if not isinstance(session, ConsoleSession):
            return
        store = self._store(app)
        name, path = self.get_cookie_name(app), self.get_cookie_path(app)
        if session.retired is not None:
            store.delete(session.retired)
            session.retired = None
        if not session:
            if session.sid is not None:
                store.delete(session.sid)
                response.delete_cookie(name, path=path, httponly=True, samesite="Strict",
                                       secure=request.is_secure)
            return
        if not session.modified and session.sid is not None:
            return
        if session.sid is None:
            session.sid = secrets.token_urlsafe(32)
        store.save(session.sid, dict(session), SESSION_SECONDS)
        response.set_cookie(name, session.sid, max_age=SESSION_SECONDS, path=path,
                            httponly=True, samesite="Strict", secure=request.is_secure)


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
    app.register_blueprint(bp)
