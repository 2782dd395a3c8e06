"""Op declarations, one module per plane. Importing this package fills the registry."""

from app.ops import (  # noqa: F401 (importing declares the ops)
    agent_state,
    ask,
    budget,
    context,
    erasure,
    memory,
    namespace_config,
    profile,
    profile_schema,
    recall,
    structured,
    tokens,
    unified_search,
    usage,
    working_memory,
)
from app.registry import REGISTRY, OpRegistry


def load_ops() -> OpRegistry:
    """The registry with every op declared (this package's import declared them)."""
    return REGISTRY
