"""Helpers for the console tests: the seed's agent-state type and the API calls that set it up."""

from __future__ import annotations

from typing import Any

NS = "support"
USER = "u-42"
AGENT = "triage-bot"

STATE_TYPE: dict[str, Any] = {
    "type": "shop_guide_state",
    "ownership": "agent",
    "fields": {
        "step": {"type": "enum", "values": ["sizes", "offer", "checkout"]},
        "offer": {"type": "string"},
    },
    "agent_state": {"scope": "conversation", "max_bytes": 16384, "write": "both"},
}
# A value the console must never show: only the state's size, version and dates.
SECRET_OFFER = "familia-plus-secret-offer"


def agent_state_calls(user_id: str = USER) -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path, body) of the admin calls that give ``user_id`` one agent state."""
    return [
        ("POST", "/v1/features.set", {"namespace": NS, "features": {"agent_state": True}}),
        ("POST", "/v1/object_types.set", {"namespace": NS, "types": [STATE_TYPE]}),
        ("PUT", "/v1/agent-state", {
            "namespace": NS, "agent": "shop_guide",
            "scope": {"kind": "conversation", "id": "conv-1"},
            "subject": user_id, "body": {"step": "offer", "offer": SECRET_OFFER},
        }),
    ]
