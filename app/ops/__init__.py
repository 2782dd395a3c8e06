"""Op declarations, one module per plane. Importing this package fills the registry."""

from app.ops import tokens, usage, working_memory  # noqa: F401
