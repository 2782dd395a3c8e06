"""``flask loom ...``: operator commands that work without the HTTP API."""

from __future__ import annotations

import click

from app.readme import ops_table


@click.group("loom")
def loom_cli() -> None:
    """Loom operator commands."""


@loom_cli.command("ops")
def list_ops() -> None:
    """Print the ops table."""
    click.echo(ops_table())
