"""The services a job runs with: built once per process from the environment.

RQ forks a child per job; redis-py's pools notice the fork and reconnect, so the child can
use what the parent built. Tests install their own services with ``use_services``.
"""

from __future__ import annotations

from app.services import Services
from app.settings import load_settings

_services: Services | None = None


def services() -> Services:
    global _services
    if _services is None:
        _services = Services(load_settings())
    return _services


def use_services(installed: Services | None) -> None:
    """Run jobs in this process with ``installed`` (None: build from the environment again)."""
    global _services
    _services = installed
