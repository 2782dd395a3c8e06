"""The console's blueprint and what every page shares: the session's CSRF token, and ``run``,
an op run for the signed-in principal the way the API runs it.

The pages (``app.console.views``) import this module, and the package that mounts them
(``app.console``) imports both, so no module imports the one that imports it.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Any

from flask import Blueprint, current_app, session

from app.api import run_op
from app.auth import Principal
from app.keyed import keyed_digest
from app.ops import load_ops
from app.store.activity import CONSOLE_CLIENT

CONSOLE_PATH = "/console"
# The query fields whose values are ids of people: written into addresses as references.
ID_FIELDS = ("user_id", "session_id")
REFERENCE_PREFIX = "r:"
_REFERENCE_PURPOSE = b"loom.console.reference.v1"

bp = Blueprint(
    "console",
    __name__,
    url_prefix=CONSOLE_PATH,
    template_folder="templates",
    static_folder="static",
    static_url_path="/static",
)


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
    services = current_app.extensions["loom"]
    declared = load_ops().get(name)
    if declared is None:
        raise KeyError(name)
    services.check_budget(principal)
    return run_op(declared, body, principal, services, client=CONSOLE_CLIENT,
                  by_console=True)


def end_session() -> None:
    """Forget this browser's session here and in the store (sign-out, a token that failed)."""
    session.clear()


def id_reference(value: str) -> str:
    """The address form of a user or session id: a keyed hash this session maps back."""
    if value in ("", "-") or value.startswith(REFERENCE_PREFIX):
        return value
    secret = current_app.extensions["loom"].settings.secret_key.encode("utf-8")
    reference = REFERENCE_PREFIX + keyed_digest(
        secret, _REFERENCE_PURPOSE, str(session.get("csrf", "")), value)[:24]
    references = dict(session.get("references") or {})
    if references.get(reference) != value:
        references[reference] = value
        session["references"] = references
    return reference


def resolve_reference(value: str) -> str | None:
    """The id a reference stands for in this session; the value itself when it is none;
    None for a reference this session did not make (another sign-in's link)."""
    if not value.startswith(REFERENCE_PREFIX):
        return value
    found = (session.get("references") or {}).get(value)
    return str(found) if found is not None else None
