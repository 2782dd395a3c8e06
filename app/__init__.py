"""Loom's web app: ``create_app`` builds it from settings, the registry and the stores."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from types import FunctionType, MethodType
from typing import Any

import swagger_ui_bundle
from flask import Blueprint, Flask, Response
from flask.json.provider import DefaultJSONProvider
from flask_smorest import Api
from werkzeug.middleware.proxy_fix import ProxyFix

from app import bad_tokens, error_catalogue, host_guard, log_ids
from app.api import register_error_handlers, register_ops
from app.console import register_console
from app.mcp_web import register_mcp
from app.operate import register_operations
from app.ops import load_ops
from app.schemas import contract, openapi
from app.schemas.common import ErrorAnswer
from app.services import Services
from app.settings import load_settings

API_TITLE = "Loom"
API_VERSION = "1"
SWAGGER_UI_ASSETS = "/docs/assets"


def swagger_ui_assets() -> Blueprint:
    """The Swagger UI files of the installed swagger-ui-bundle, under ``/docs/assets/``."""
    return Blueprint(
        "swagger_ui_assets", __name__,
        static_folder=str(swagger_ui_bundle.swagger_ui_path), static_url_path=SWAGGER_UI_ASSETS,
    )


_COMPACT = (",", ":")


class LoomJSONProvider(DefaultJSONProvider):
    """Flask's JSON, compact and in the answer's own key order, with one encoder kept for the
    compact answers: ``json.dumps`` builds a new encoder whenever it is given options, and
    Flask gives it options for every answer."""

    sort_keys = False
    compact = True
    # (default, ensure_ascii, sort_keys) the kept encoder was built with, and the encoder; one
    # attribute, so that a reader never pairs one's options with another's encoder.
    _kept: tuple[tuple[Any, ...], json.JSONEncoder] | None = None

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        if len(kwargs) != 1 or kwargs.get("separators") != _COMPACT:
            return super().dumps(obj, **kwargs)
        options = (self.default, self.ensure_ascii, self.sort_keys)
        kept = self._kept
        if kept is None or kept[0] != options:
            encoder = json.JSONEncoder(
                separators=_COMPACT, default=self.default, ensure_ascii=self.ensure_ascii,
                sort_keys=self.sort_keys,
            )
            kept = self._kept = (options, encoder)
        return kept[1].encode(obj)


class LoomFlask(Flask):
    """Flask, with request guards, and remembering which views and hooks are plain functions.

    A request guard (``add_request_guard``) is a ``before_request`` hook that refuses a request
    by returning an answer (the Host check, the refused-token budget). At the first request the
    guards are moved behind every other app-level ``before_request`` hook, a deployer's too
    (Flask takes no new hook once a request has been handled): the deployer's hooks and
    tracing see the refused request start and its answer leave, and no blueprint's hook or
    view, where credentials are checked, runs before a guard.

    Flask asks ``ensure_sync`` about the view and every request hook on every request, and
    each answer inspects the function's code flags again. Loom declares no ``async def`` view
    or hook; the answer per function or bound method is kept, so a request pays one lookup
    each.
    """

    json_provider_class = LoomJSONProvider

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plain_functions: set[Callable[..., Any]] = set()
        self.request_guards: list[Callable[[], Any]] = []
        self._guards_placed = False
        self._guards_lock = threading.Lock()

    def add_request_guard(self, guard: Callable[[], Any]) -> None:
        """Run ``guard`` before every request's view: an answer it returns is the answer."""
        self.request_guards.append(guard)
        self.before_request(guard)

    def make_response(self, rv: Any) -> Response:
        # An op's answer, a plain dict: what Flask makes of one, without its tests of the
        # value's type on the way (an Iterator ABC check among them).
        if type(rv) is dict:
            return self.json.response(rv)  # type: ignore[return-value]
        return super().make_response(rv)

    def preprocess_request(self) -> Any:
        if not self._guards_placed:
            self._place_guards()
        return super().preprocess_request()

    def _place_guards(self) -> None:
        with self._guards_lock:
            if self._guards_placed:
                return
            hooks = self.before_request_funcs.setdefault(None, [])
            guards = [hook for hook in hooks if hook in self.request_guards]
            hooks[:] = [hook for hook in hooks if hook not in self.request_guards] + guards
            self._guards_placed = True

    def ensure_sync(self, func: Callable[..., Any]) -> Callable[..., Any]:
        if type(func) is not FunctionType and type(func) is not MethodType:
            return super().ensure_sync(func)
        if func in self._plain_functions:
            return func
        made = super().ensure_sync(func)
        if made is func:
            self._plain_functions.add(func)
        return made


class LoomApi(Api):
    """flask-smorest, documenting Loom's one error shape: no "default" response in
    flask-smorest's own error shape, which Loom never sends (each op lists its statuses)."""

    DEFAULT_ERROR_RESPONSE_NAME = None
    ERROR_SCHEMA = ErrorAnswer


def create_app(test_config: Mapping[str, Any] | None = None) -> Flask:
    """Defaults, then the environment, then ``test_config``.

    ``test_config`` keys are settings attributes (``redis_url``, ``auth``, ...); the keys
    ``clock``, ``redis`` and ``queue_redis`` inject a clock, a Redis client and RQ's client.
    """
    overrides = dict(test_config or {})
    clock = overrides.pop("clock", None)
    redis_client = overrides.pop("redis", None)
    queue_redis = overrides.pop("queue_redis", None)
    settings = load_settings(overrides=overrides)

    app = LoomFlask(__name__)
    app.config.update(
        MAX_CONTENT_LENGTH=settings.max_body_bytes,
        API_TITLE=API_TITLE,
        API_VERSION=API_VERSION,
        OPENAPI_VERSION="3.0.3",
        OPENAPI_URL_PREFIX="/",
        OPENAPI_JSON_PATH="openapi.json",
        OPENAPI_SWAGGER_UI_PATH="/docs",
        # The viewer's scripts and styles come from the swagger-ui-bundle package, served by
        # this app: /docs works offline and loads nothing from a third party.
        OPENAPI_SWAGGER_UI_URL=SWAGGER_UI_ASSETS + "/",
    )
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.json.compact = True  # type: ignore[attr-defined]
    logging.getLogger("loom").setLevel(logging.INFO)
    log_ids.install(settings.secret_key)

    services = Services(settings, redis_client=redis_client, clock=clock,
                        queue_redis=queue_redis)
    app.extensions["loom"] = services

    app.register_blueprint(swagger_ui_assets())
    ops = load_ops()
    plugin = openapi.LoomMarshmallowPlugin(openapi.input_rules(ops, settings.auth == "on"))
    # Every error code with its status, meaning, details and remedy, at the document's top
    # level; each operation's responses name the codes it answers (app.api.error_responses).
    api = LoomApi(app, spec_kwargs={"marshmallow_plugin": plugin,
                                    "x-error-catalogue": error_catalogue.as_json()})
    assert plugin.converter is not None  # built with the spec, by Api(app)
    plugin.converter.add_attribute_function(openapi.field_properties)
    api.spec.components.security_scheme(
        "bearer", {"type": "http", "scheme": "bearer", "description": "A Loom token"}
    )
    register_error_handlers(app)
    register_ops(app, api, ops, services)
    if settings.validate_answers:
        contract.install(app, api)
    register_console(app)
    register_operations(app, services)
    register_mcp(app, services)
    # The Host check, then the refused-token budget, after every app-level hook and before any
    # blueprint's or view (LoomFlask.add_request_guard); and no-store on every answer.
    host_guard.install(app, settings)
    bad_tokens.install(app, services)
    # Around Flask only the proxies' headers, read into the client's address and scheme before
    # any hook reads them.
    if settings.trusted_proxies:
        app.wsgi_app = ProxyFix(  # type: ignore[method-assign]
            app.wsgi_app, x_for=settings.trusted_proxies, x_proto=settings.trusted_proxies)

    from app.cli import loom_cli

    app.cli.add_command(loom_cli)
    return app
