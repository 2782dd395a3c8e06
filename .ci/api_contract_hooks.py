"""schemathesis hooks for .ci/api_contract.py: the document's ``x-loom-rules``
(``app.schemas.rules``) kept by the cases schemathesis draws as valid.

A positive case that breaks a rule the document states is no valid body, so it is not drawn
(schemathesis's ``filter_case``); every check still runs on every case that is drawn, the
negative ones included, and a rule the document does not state filters nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

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
