"""`sparkdeploy postmortem [NODE]`: the memory guard's black box, the minutes before the last crash."""

from __future__ import annotations

import time

import click
from rich.console import Console
from rich.table import Table

from sparkdeploy.cli.common import emit_json, inventory_option, json_option
from sparkdeploy.daytwo.postmortem import DEFAULT_MINUTES, evidence, postmortem


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t))


@click.command("postmortem")
@click.argument("node", required=False)
@inventory_option
@click.option(
    "--minutes",
    type=click.FloatRange(min=0.1, max=30),
    default=DEFAULT_MINUTES,
    show_default=True,
    help="How many minutes before the crash to show (the black box keeps 30).",
)
@json_option
def postmortem_cmd(node: str | None, inventory: str | None, minutes: float, as_json: bool) -> None:
    """What the memory guard recorded before a node's last crash, power-off or guard kill: available memory, PSI,
    GPU temperature/clock/power (SIMULATED in the lab), engine restarts, and the kernel's messages about OOM,
    Xid and PCIe AER. Read from each node's black box (STATE_DIR/guard/ring.jsonl, a synced ring of one-second
    samples). A crash is where the record breaks off: a new boot, or a silence ending in the guard's restart.

    \b
    Examples:
      sparkdeploy postmortem --inventory lab            # every node
      sparkdeploy postmortem spark2 --minutes 10 --json
    """
    data = postmortem(inventory, node, minutes)
    if as_json:
        emit_json(data)
        return
    console = Console(highlight=False, width=max(120, Console().width))
    for n in data["nodes"]:
        if n.get("error"):
            console.print(f"{n['name']}: {n['error']}", style="red")
            continue
        if not n["records"]:
            console.print(f"{n['name']}: {n.get('note') or 'the black box is empty'}")
            continue
        crash = n["crash"]
        head = evidence(n) if crash else f"no crash recorded ({n['records']} records); the last {minutes:g} minutes"
        console.print(f"{n['name']}: {head}", style="red" if crash else None)
        table = Table(title_justify="left")
        for col in ("time (UTC)", "available MiB", "PSI some/full %", "GPU C / MHz / W", "state", "event"):
            table.add_column(col)
        rows = sorted(n["samples"] + [dict(e, kind="e") for e in n["events"]], key=lambda r: r["t"])
        step = max(1, len(rows) // 60)  # at most ~60 rows: every n-th sample, every event
        for i, r in enumerate(rows):
            if r["kind"] == "e":
                table.add_row(_clock(r["t"]), "", "", "", "", f"{r['ev']}: {r['msg']}", style="yellow")
            elif i % step == 0 or i == len(rows) - 1:
                psi = r.get("psi")
                gpu = r.get("gpu") or {}
                table.add_row(
                    _clock(r["t"]),
                    str(r.get("avail_mb")),
                    "-" if not psi else f"{psi[0]:.1f} / {psi[1]:.1f}",
                    "-"
                    if gpu.get("temp_c") is None
                    else f"{gpu['temp_c']:.0f} / {gpu.get('sm_mhz')} / {gpu.get('power_w')}"
                    + (" SIMULATED" if "SIMULATED" in str(gpu.get("source")) else ""),
                    r.get("state", ""),
                    "",
                )
        console.print(table)
