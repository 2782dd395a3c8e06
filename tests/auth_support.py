"""Helpers for tests that run with auth on: an app, the install admin, minted tokens."""

from __future__ import annotations

from typing import Any

ADMIN_TOKEN = "install-admin-token-for-tests"


def auth_app(app_factory, **overrides: Any):
    return app_factory(auth="on", admin_token=ADMIN_TOKEN, **overrides)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def mint(client, creator: str = ADMIN_TOKEN, **claims: Any) -> str:
    response = client.post("/v1/token.create", json=claims, headers=bearer(creator))
    assert response.status_code == 200, response.get_json()
    return response.get_json()["token"]
