"""Marshmallow schemas shared by every plane: identity fields, strict scalars, answers."""
