"""`sparkdeploy history` and `sparkdeploy rollback`: what `up` ran, and going back (sparkdeploy.deploy.history).

Exit codes: 0 ok, 1 the rollback cannot run (what is missing and the command that restores it) or failed,
2 bad usage (an unknown ID).
"""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from sparkdeploy.cli.common import emit_json, inventory_option, json_option, timeout_option
from sparkdeploy.cli.up_cmd import Out
from sparkdeploy.deploy import history as history_mod
from sparkdeploy.deploy.up import deploy
from sparkdeploy.deploy.up_result import UpResult
from sparkdeploy.errors import escape_controls


def cell(value: object) -> Text:
    """A value of a record as shown: never read as rich markup (`[/INST]` in a --set), control characters
    escaped (a record cannot move the cursor or add a line)."""
    return Text(escape_controls(str(value)))


@click.command("history")
@inventory_option
@json_option
def history(inventory: str | None, as_json: bool) -> None:
    """List the deployments `up` recorded, newest first: recipe and its hash, topology, image (and digest),
    model commit, vLLM version, node driver, nodes, cluster, time. Kept in the local state
    ($SPARKDEPLOY_STATE/history/deployments.jsonl); `sparkdeploy rollback ID` brings one back.

    With --inventory (or SPARKDEPLOY_INVENTORY), only that cluster's: a cluster is its nodes' pinned host keys
    (or, without them, its name and the nodes' addresses), so another path to the same inventory lists the same."""
    from sparkdeploy.config.inventory import load_inventory  # only with -i

    records = list(reversed(history_mod.read_records()))
    if inventory:
        records = history_mod.of_cluster(records, history_mod.cluster_identity(load_inventory(inventory)))
    if as_json:
        emit_json([{k: v for k, v in r.items() if k != "recipe_text"} for r in records])
        return
    table = Table(title=cell(f"deployments ({history_mod.history_file()})"), title_justify="left")
    table.add_column("id", no_wrap=True)
    table.add_column("time (UTC)", no_wrap=True)
    for col in ("recipe", "hash", "topology", "image", "model commit", "vLLM", "driver", "nodes", "cluster"):
        table.add_column(col, overflow="fold")
    for r in records:
        drivers = sorted({d for d in (r.get("drivers") or {}).values() if d})
        image = r.get("image_digest") or r.get("image_id") or ""
        row = (
            str(r["id"]),
            str(r.get("time", ""))[:16].replace("T", " "),
            (f"{r['deployment']} (stack): " if r.get("deployment") else "")
            + str(r.get("recipe", ""))
            + (f" --set {' '.join(r['sets'])}" if r.get("sets") else ""),
            str(r.get("recipe_hash") or "")[:12],
            "/".join(x for x in (r.get("topology"), r.get("backend")) if x),
            f"{r.get('image_tag') or ''} {str(image).removeprefix('sha256:')[:12]}".strip(),
            str(r.get("model_commit") or "-")[:12],
            str(r.get("vllm_version") or "-"),
            (", ".join(drivers) or "-") + (" SIMULATED" if r.get("simulated") else ""),
            ", ".join(r.get("nodes") or []),
            str(r.get("cluster_name") or "-"),
        )
        table.add_row(*(cell(v) for v in row))
    Console(highlight=False, soft_wrap=False, width=max(120, Console().width)).print(table)
    if not records:
        click.echo("no deployment recorded yet: `sparkdeploy up` records each one that comes up healthy")


@click.command("rollback")
@click.argument("record_id", metavar="[ID]", required=False)
@click.option("--dry-run", is_flag=True, help="Check what it needs and print the plan; change nothing.")
@inventory_option
@timeout_option
@json_option
def rollback(record_id: str | None, dry_run: bool, inventory: str | None, timeout: float, as_json: bool) -> None:
    """Bring deployment ID back (default: the one before the newest of the inventory's cluster; see
    `sparkdeploy history -i INVENTORY`). A deployment made on another cluster is refused (exit 2).

    Its image (by image ID) and model (by commit) must still be on its nodes: anything missing is named with
    the command that restores it, and nothing changes (exit 1). Then `up` runs again with the recorded recipe
    text, --set values, topology and backend (the inventory it ran with, unless --inventory is given), so the
    same configuration (config hash) runs again; the rollback is itself recorded.
    """
    out = Out(as_json)
    result = UpResult()
    try:
        history_mod.rollback(
            record_id, inventory, dry_run, deploy, out.progress, timeout=timeout, reporter=out, result=result
        )
    finally:
        data = result.as_dict()
        if as_json and data:
            emit_json(data)
