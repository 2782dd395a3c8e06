"""Op declarations, one module per plane. Importing this package fills the registry."""

from app.ops import (  # noqa: F401  (importing declares the ops)
    agent_state,
    namespace_config,
    profile_schema,
    tokens,
    usage,
    working_memory,
)
