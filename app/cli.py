"""``flask loom ...``: operator commands that work without the HTTP API."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click
from flask import current_app
from flask.cli import with_appcontext

from app.docs_reference import ops_table


@click.group("loom")
def loom_cli() -> None:
    """Loom operator commands."""


@loom_cli.command("ops")
def list_ops() -> None:
    """Print the ops table."""
    click.echo(ops_table())


@loom_cli.group("token")
def token_cli() -> None:
    """Mint, list and revoke tokens without the HTTP API."""


@token_cli.command("create")
@click.option("--org", default=None, help="The org (default: LOOM_DEFAULT_ORG).")
@click.option("--namespace", default="*", show_default=True, help="A namespace, or * for all.")
@click.option("--role", type=click.Choice(["viewer", "writer", "admin"]), required=True)
@click.option("--read-scope", type=click.Choice(["namespace", "own_user", "own_session"]))
@click.option("--read-user-id", default=None, help="Pin the token to one end user.")
@click.option("--session-id", default=None, help="Bind the token to one session.")
@click.option("--agent", default=None, help="Fix the agent.")
@click.option("--scope", "scopes", multiple=True, help="Extra scopes, e.g. agent_state.")
@click.option("--label", default="", help="What the token is for.")
@click.option("--expires-at", default=None, help="ISO 8601 time the token stops working.")
@with_appcontext
def token_create(**options: object) -> None:
    """Mint a token and print its secret once."""
    body = {key: value for key, value in options.items() if value not in (None, ())}
    body["scopes"] = list(options["scopes"])  # type: ignore[call-overload]
    answer = _invoke("token.create", body)
    click.echo(f"token_id: {answer['token_id']}")
    click.echo(f"token:    {answer['token']}")


@token_cli.command("list")
@click.option("--org", default=None)
@with_appcontext
def token_list(org: str | None) -> None:
    """List the org's tokens (never their secrets)."""
    for row in _invoke("token.list", {"org": org} if org else {})["tokens"]:
        state = "revoked" if row["revoked"] else "active"
        click.echo(
            f"{row['token_id']}  {row['role']:<6}  {row['namespace']:<16}  {state:<7}  "
            f"{row['label']}"
        )


@token_cli.command("revoke")
@click.argument("token_id")
@click.option("--org", default=None)
@with_appcontext
def token_revoke(token_id: str, org: str | None) -> None:
    """Revoke a token; it fails on its next use."""
    body = {"token_id": token_id, **({"org": org} if org else {})}
    _invoke("token.revoke", body)
    click.echo(f"revoked {token_id}")


def _invoke(op_name: str, body: Mapping[str, object]) -> dict[str, Any]:
    """Run an op as the install's admin, reporting a refusal as a CLI error."""
    from app.api import run_op
    from app.auth import ANY, Principal
    from app.errors import LoomError
    from app.registry import REGISTRY

    services = current_app.extensions["loom"]
    admin = Principal(org=ANY, role="admin", default_org=services.settings.default_org)
    declared = REGISTRY.get(op_name)
    assert declared is not None, op_name
    try:
        return run_op(declared, dict(body), admin, services, client="loom-cli")
    except LoomError as error:
        raise click.ClickException(f"{error.code}: {error.message}") from None


# --- erasure and the data package --------------------------------------------------------------


ERASE_POLL_SECONDS = 0.25


def _show_progress(step: str, counts: dict[str, object]) -> None:
    """One line per finished step, on stderr (stdout may be the data package)."""
    done = ", ".join(f"{kind} {n}" for kind, n in counts.items() if n)
    click.echo(f"  {step:<15} {done or '-'}", err=True)


def _with_progress(op_name: str, body: dict[str, object]) -> dict[str, object]:
    from app.store.erasure import PROGRESS

    reset = PROGRESS.set(_show_progress)
    try:
        return _invoke(op_name, body)
    finally:
        PROGRESS.reset(reset)


def _user_body(user_id: str, org: str | None, namespace: str,
               handles: tuple[str, ...]) -> dict[str, object]:
    body: dict[str, object] = {"user_id": user_id, "namespace": namespace,
                               "handles": list(handles)}
    if org:
        body["org"] = org
    return body


@loom_cli.command("erase")
@click.argument("user_id")
@click.option("--org", default=None, help="The org (default: LOOM_DEFAULT_ORG).")
@click.option("--namespace", required=True, help="The namespace whose user is erased.")
@click.option("--handle", "handles", multiple=True,
              help="Another handle of the customer (email, phone) whose agent states go too.")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Follow the erasure until it ends (a worker runs it either way).")
@with_appcontext
def erase_user(user_id: str, org: str | None, namespace: str, handles: tuple[str, ...],
               wait: bool) -> None:
    """Erase a user of a namespace, step by step; run it again to finish a failed one."""
    import time

    from app.store.erasure import STEPS

    click.echo(f"erasing a user of {namespace}", err=True)
    body = _user_body(user_id, org, namespace, handles)
    receipt = _invoke("user.erase", body)
    status_body = {"namespace": namespace, "erasure_id": receipt["erasure_id"],
                   **({"org": org} if org else {})}
    shown = 0
    while True:
        # A worker runs the saga: follow it through erasure.status, one line per step done.
        done = int(receipt.get("steps_done") or 0)
        for step in STEPS[shown:done]:
            _show_progress(step, receipt["counts"])
        shown = max(shown, done)
        if not wait or receipt["status"] != "running":
            break
        time.sleep(ERASE_POLL_SECONDS)
        receipt = _invoke("erasure.status", status_body)
    census = receipt.get("census") or {}
    click.echo(f"erasure_id: {receipt['erasure_id']}")
    click.echo(f"status:     {receipt['status']} (attempt {receipt['attempts']})")
    for kind, n in receipt["counts"].items():
        click.echo(f"  {kind:<22} {n}")
    if receipt["status"] == "running":
        click.echo("a worker runs it; follow it with erasure.status", err=True)
        return
    if receipt["status"] == "interrupted":
        raise click.ClickException("the erasure's worker died; a worker starting, the "
                                   "scheduler's resume pass or this command again resumes it")
    if isinstance(census, dict) and not census.get("clean", False):
        found = ", ".join(f"{k} {n}" for k, n in census.get("found", {}).items())
        raise click.ClickException(
            f"the census found data left ({found}); the erasure is failed and retryable: "
            "run this command again"
        )
    if receipt["status"] != "done":
        raise click.ClickException(f"the erasure {receipt['status']} ({receipt['error']}); "
                                   "run this command again")
    click.echo(f"aof_rewrite: {receipt['aof_rewrite']}")


@loom_cli.command("export")
@click.argument("user_id")
@click.option("--org", default=None, help="The org (default: LOOM_DEFAULT_ORG).")
@click.option("--namespace", required=True, help="The namespace whose user is exported.")
@click.option("--handle", "handles", multiple=True,
              help="Another handle of the customer whose agent states are theirs too.")
@click.option("--out", "out", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the package to this file (default: stdout).")
@with_appcontext
def export_user(user_id: str, org: str | None, namespace: str, handles: tuple[str, ...],
                out: str | None) -> None:
    """Write a user's data package as one JSON document."""
    import json

    click.echo(f"exporting a user of {namespace}", err=True)
    package = _with_progress("subject.export", _user_body(user_id, org, namespace, handles))
    package.pop("ignored_args", None)
    text = json.dumps(package, ensure_ascii=False, indent=2, sort_keys=True)
    if out is None:
        click.echo(text)
    else:
        with open(out, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
        click.echo(f"wrote {out}", err=True)


# --- recall ------------------------------------------------------------------------------------


@loom_cli.group("recall")
def recall_cli() -> None:
    """Maintain memory.search's indexes."""


@recall_cli.command("backfill")
@click.option("--vectors/--no-vectors", default=True, show_default=True,
              help="Also enqueue the embeddings job of every user whose facts wait for a vector "
                   "(when LOOM_EMBED_* is set and the org's model calls are on).")
@with_appcontext
def recall_backfill(vectors: bool) -> None:
    """Bring every fact's recall entry up to date, as memory.backfill does one's: each lexical
    index onto the current posting layout, every live row's terms, a vector asked for where
    there is none. Bounded steps beside live traffic; run it again after an interruption."""
    from app.recall_backfill import backfill_all

    services = current_app.extensions["loom"]
    backfill_all(services, written_by="loom-cli", vectors=vectors, progress=click.echo)


# --- release -----------------------------------------------------------------------------------


@loom_cli.command("release")
@click.option("--contract", is_flag=True,
              help="Also run the moves only this version reads; once the earlier version "
                   "has stopped.")
@with_appcontext
def release(contract: bool) -> None:
    """Every upgrade step this version needs of a store an earlier one wrote (the Procfile's
    release line runs the same): safe to run twice and while the old version serves; with
    --contract also the moves only this version reads, run after the deploy."""
    from app.release import run_release

    run_release(current_app.extensions["loom"], click.echo, contract=contract)
