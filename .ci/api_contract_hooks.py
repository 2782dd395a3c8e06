"""schemathesis hooks for .ci/api_contract.py: the document's ``x-loom-rules``
(``app.schemas.rules``) kept by the cases schemathesis draws as valid.

A positive case that breaks a rule the document states is no valid body, so it is not drawn
(schemathesis's ``filter_case``); every check still runs on every case that is drawn, the
negative ones included, and a rule the document does not state filters nothing.
"""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import requests
import schemathesis

from app.schemas.rules import rule_holds

# A case reaches the server a little after it is drawn: a moment this close to now is not
# drawn as one in the future.
_CLOCK_MARGIN = timedelta(minutes=1)


def _request_schema(operation: Any) -> dict[str, Any]:
    try:
        schema = operation.definition.raw["requestBody"]["content"]["application/json"]["schema"]
    except (KeyError, TypeError):
        return {}
    reference = schema.get("$ref", "")
    if reference.startswith("#/components/schemas/"):
        components = operation.schema.raw_schema["components"]["schemas"]
        found = components.get(reference.rsplit("/", 1)[1], {})
        return found if isinstance(found, dict) else {}
    return schema if isinstance(schema, dict) else {}


@schemathesis.hook
def filter_case(context: Any, case: Any) -> bool:
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or context.operation is None:
        return True
    if not isinstance(case.body, dict):
        return True
    rules = _request_schema(context.operation).get("x-loom-rules", [])
    now = datetime.now(UTC) + _CLOCK_MARGIN
    return all(rule_holds(rule, case.body, now=now) for rule in rules)


# --- the stored state a valid case needs -------------------------------------------------------
#
# Some rules read what is stored: the text to replace must be in the block or section, an
# addition must fit the stored cap, a memory.set without char_limit keeps the row's cap. A
# case drawn as valid is valid against some stored state; before it is sent, the state it
# needs is written (through the API, with the run's own token), so a refusal of it is a
# finding. .ci/api_contract.py gives the server's address and Authorization header.
_SERVER = os.environ.get("LOOM_CONTRACT_URL", "")
_AUTHORIZATION = os.environ.get("LOOM_CONTRACT_AUTHORIZATION", "")
_IDENTITY = ("org", "namespace", "agent", "user_id", "session_id", "run_id")
_BLOCK_CAP, _BLOCK_DEFAULT_CAP = 16384, 4096  # app.store.working_memory
_ROW_CAP = 65536  # app.store.memory_row.MAX_CHAR_LIMIT


def _write(op: str, body: dict[str, Any]) -> None:
    headers = {"Authorization": _AUTHORIZATION} if _AUTHORIZATION else {}
    requests.post(f"{_SERVER}/v1/{op}", json=body, headers=headers, timeout=30)
    # A preparation refused (403 for another namespace than the token's, 409 while another
    # case's erasure of the user runs, ...) leaves the case to meet the state as it is: the
    # case's own answer is what is checked, and it is refused the same way.


def _prepare_working_memory(path: str, body: dict[str, Any], who: dict[str, Any]) -> None:
    block = {**who, "block_key": body.get("block_key") or "scratchpad"}
    if path == "/v1/working_memory.append":
        addition = body.get("addition")
        if isinstance(addition, str) and len(addition) <= _BLOCK_DEFAULT_CAP:
            _write("working_memory.delete", block)  # created anew, with no separator
        else:
            _write("working_memory.set", {**block, "content": "", "char_limit": _BLOCK_CAP})
    elif isinstance(body.get("old"), str):
        _write("working_memory.set", {**block, "content": body["old"],
                                      "char_limit": _BLOCK_CAP})


def _prepare_profile(path: str, body: dict[str, Any], who: dict[str, Any]) -> None:
    if not isinstance(body.get("label"), str):
        return
    section = {**who, "label": body["label"], "char_limit": _ROW_CAP}
    if path == "/v1/profile.append":
        _write("profile.set", {**section, "value": ""})
    elif isinstance(body.get("old"), str):
        _write("profile.set", {**section, "value": body["old"]})


def _prepare_memory_row(body: dict[str, Any], who: dict[str, Any]) -> None:
    if body.get("char_limit") is not None or not isinstance(body.get("key"), str):
        return
    row = {**who, "key": body["key"], "value": 0, "char_limit": _ROW_CAP}
    if isinstance(body.get("memory_type"), str):
        row["memory_type"] = body["memory_type"]
    _write("memory.set", row)


# Cases of two workers at once would write each other's state between a preparation and its
# case (both ops' examples name the same section), so a case and its preparation are sent as
# one: each holds this lock from before_call to after_call. A worker holds it at most once (a
# call that raised before after_call keeps it until that worker's next after_call), and a wait
# past _LOCK_WAIT goes ahead rather than stall the run.
_ONE_AT_A_TIME = threading.Lock()
_HOLDING = threading.local()
_LOCK_WAIT = 60.0


@schemathesis.hook("before_call")
def hold_the_server(context: Any, case: Any, **kwargs: Any) -> None:
    if not getattr(_HOLDING, "held", False):
        _HOLDING.held = _ONE_AT_A_TIME.acquire(timeout=_LOCK_WAIT)


@schemathesis.hook
def after_call(context: Any, case: Any, response: Any) -> None:
    if getattr(_HOLDING, "held", False):
        _HOLDING.held = False
        _ONE_AT_A_TIME.release()


def _prepare_agent_state(body: dict[str, Any], who: dict[str, Any]) -> None:
    # The body is held to the object type declared for the agent (its modes, scope kind,
    # field values): with none declared every body the document allows is taken. The state
    # the case names starts empty (version 0).
    namespace = {key: who[key] for key in ("org", "namespace") if key in who}
    _write("features.set", {**namespace, "features": {"agent_state": True}})
    _write("object_types.set", {**namespace, "types": []})
    if isinstance(body.get("scope"), dict):
        _write("agent_state.erase", {**namespace, "scope": body["scope"]})
    # A conditional write names the version it expects: the state was just emptied, so the
    # one version it can hold is 0 ("must not exist"), which every mode's document allows.
    # A drawn n > 0 cannot be prepared (a version counts stored writes, up to 2^63 - 1, and
    # no API sets one), so the case is sent with the version it meets; its other fields are
    # as drawn.
    if isinstance(body.get("if_version"), int) and not isinstance(body["if_version"], bool):
        body["if_version"] = 0


@schemathesis.hook
def before_call(context: Any, case: Any, **kwargs: Any) -> None:
    meta = case.meta
    if (not _SERVER or meta is None or not meta.generation.mode.is_positive
            or not isinstance(case.body, dict)):
        return
    path, body = case.operation.path, case.body
    who = {name: body[name] for name in _IDENTITY if isinstance(body.get(name), str)}
    if path in ("/v1/working_memory.append", "/v1/working_memory.replace"):
        _prepare_working_memory(path, body, who)
    elif path in ("/v1/profile.append", "/v1/profile.replace"):
        _prepare_profile(path, body, who)
    elif path == "/v1/memory.set":
        _prepare_memory_row(body, who)
    elif path == "/v1/agent-state":
        _prepare_agent_state(body, who)
