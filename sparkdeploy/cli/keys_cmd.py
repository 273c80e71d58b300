"""`sparkdeploy keys create | list | revoke`: per-user keys of a stack's gateway (the library:
sparkdeploy/deploy/stack/keys.py)."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.table import Table

from sparkdeploy.cli.common import emit_json, inventory_option, json_option
from sparkdeploy.deploy.stack import keys as lib


@click.group("keys")
def keys() -> None:
    """Per-user API keys of the stack gateway (`up --stack`): each limited to some models, a request rate, a budget
    of tokens.

    \b
    Examples:
      sparkdeploy keys create alice --models qwen3-coder-30b --rpm 60 -i lab   # the key is printed once
      sparkdeploy keys create bob --max-budget 200k -i lab   # refused once its answers used 200000 tokens
      sparkdeploy keys list -i lab
      sparkdeploy keys revoke alice -i lab                                      # refused from the next request

    Keys are kept hashed (sha256) in a 0600 file on the head node, read by the gateway on every change; the
    token itself is stored nowhere. The master key (LITELLM_MASTER_KEY) stays in the secrets file."""


@keys.command("create")
@click.argument("name")
@click.option("--models", metavar="M,...", help="Only these models (as /v1/models lists them). Default: every model.")
@click.option("--rpm", type=int, help="At most this many requests per minute (counted over all the gateway's workers).")
@click.option(
    "--max-budget",
    metavar="TOKENS",
    help="At most this many tokens (prompt + completion, summed over its answers), e.g. 200000 or 200k; "
    "then refused (429, budget exceeded). Counted by the gateway, kept over restarts (docs/gateway.md).",
)
@inventory_option
@json_option
def create(
    name: str, models: str | None, rpm: int | None, max_budget: str | None, inventory: str | None, as_json: bool
) -> None:
    """Create key NAME and print it once (it is stored only as its sha256)."""
    wanted = [m.strip() for m in models.split(",") if m.strip()] if models else None
    token, entry = lib.create(inventory, name, wanted, rpm, max_budget)
    if as_json:
        emit_json({**entry, "key": token})
        return
    click.echo(token)
    click.echo(
        f"key {name}: models {', '.join(entry['models']) or 'all'}, rpm {entry['rpm'] or 'unlimited'}, "
        f"budget {budget_text(entry)}. Shown once: store it now.",
        err=True,
    )


@keys.command("list")
@inventory_option
@json_option
def list_(inventory: str | None, as_json: bool) -> None:
    """The keys: name, models, rpm, tokens spent / max budget, created (never the key)."""
    entries = lib.list_keys(inventory)
    if as_json:
        emit_json(entries)
        return
    table = Table(title="gateway keys", title_justify="left")
    for col in ("name", "models", "rpm", "spent / budget (tokens)", "created"):
        table.add_column(col)
    for e in entries:
        spent = "?" if e.get("spent") is None else str(e["spent"])
        table.add_row(
            e["name"],
            ", ".join(e["models"]) or "all",
            str(e["rpm"] or "-"),
            f"{spent} / {budget_text(e)}",
            e["created"],
        )
    Console().print(table)
    if entries and any(e.get("spent") is None for e in entries):
        click.echo("spent: ? (the gateway does not run: its counts are read from inside it)", err=True)


def budget_text(entry: dict[str, Any]) -> str:
    if entry.get("budget_unit") == "tokens":
        return str(entry["max_budget"])
    if entry.get("max_budget"):  # recorded by an older sparkdeploy, in no unit: not enforced
        return f"{entry['max_budget']:g} (not enforced: no unit)"
    return "unlimited"


@keys.command("revoke")
@click.argument("name")
@inventory_option
@json_option
def revoke(name: str, inventory: str | None, as_json: bool) -> None:
    """Revoke key NAME: the gateway refuses it from its next request."""
    entry = lib.revoke(inventory, name)
    if as_json:
        emit_json(entry)
    else:
        click.echo(f"revoked key {name}")
