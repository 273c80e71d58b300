"""`sparkdeploy logs`: every sparkdeploy container's logs on every node, merged by time, secrets masked."""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from sparkdeploy.cli.common import inventory_option

if TYPE_CHECKING:
    from sparkdeploy.daytwo.logs import LogLine, Notice

SINCE = re.compile(r"(\d+(\.\d+)?(ns|us|ms|s|m|h))+|\d{4}-\d\d-\d\d(T[0-9:.]+(Z|[+-]\d\d:\d\d)?)?|\d+")
# Prefix colours per (node, container), stable within a run.
COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "bright_cyan", "bright_magenta", "bright_green")


def _since(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not SINCE.fullmatch(value):
        raise click.BadParameter(
            f"{value!r}: a duration (10m, 1h30m, 45s), an RFC 3339 time (2026-11-23T09:00:00Z) or a Unix timestamp"
        )
    return value


class Printer:
    """`node/container | text` lines: coloured prefixes on a terminal, plain otherwise; every line masked."""

    def __init__(self, mask: Callable[[str], str], timestamps: bool, colour: bool | None = None) -> None:
        self.mask = mask
        self.timestamps = timestamps
        self.colour = sys.stdout.isatty() if colour is None else colour
        self._styles: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def prefix(self, node: str, container: str) -> str:
        text = f"{node}/{container.removeprefix('sparkdeploy-')}"
        if not self.colour:
            return text
        style = self._styles.setdefault((node, container), COLOURS[len(self._styles) % len(COLOURS)])
        return click.style(text, fg=style)

    def line(self, line: LogLine | Notice) -> None:
        from sparkdeploy.daytwo.logs import Notice

        with self._lock:
            if isinstance(line, Notice):
                click.echo(
                    click.style(f"== {line.node}: {self.mask(line.text)}", fg="yellow", bold=True),
                    err=True,
                    color=self.colour,
                )
                return
            stamp = f"{line.short_time()} " if self.timestamps else ""
            click.echo(f"{stamp}{self.prefix(line.node, line.container)} | {self.mask(line.text)}", color=self.colour)


@click.command("logs")
@inventory_option
@click.option(
    "--node", "-n", "nodes", multiple=True, metavar="NAME", help="Only this node (repeatable; default: every node)."
)
@click.option(
    "--container",
    "-c",
    "containers",
    multiple=True,
    metavar="NAME",
    help="Only this container, e.g. sparkdeploy-vllm or just vllm (repeatable; default: all of ours).",
)
@click.option(
    "--since",
    default=None,
    callback=_since,
    metavar="WHEN",
    help="Only lines newer than a duration (10m, 1h) or a time (RFC 3339 or Unix seconds).",
)
@click.option(
    "--tail",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="The last N lines of each container (default: all; with --follow: 10).",
)
@click.option(
    "--follow",
    "-f",
    is_flag=True,
    help="Keep printing new lines until Ctrl-C; a node that goes away is reported and retried.",
)
@click.option("--timestamps", "-t", is_flag=True, help="Show each line's time (UTC).")
@click.option("--deployment", metavar="NAME", help="Only this deployment of a stack (`up --stack`), e.g. coder.")
def logs(
    inventory: str | None,
    nodes: tuple[str, ...],
    containers: tuple[str, ...],
    since: str | None,
    tail: int | None,
    follow: bool,
    timestamps: bool,
    deployment: str | None,
) -> None:
    """The logs of sparkdeploy's containers on every node, merged by time, each line prefixed node/container.

    \b
    Read over the nodes' SSH connections (host keys checked); secrets from the secrets file (HF token,
    proxy master key) are shown as ******** if anything ever prints them.
    Examples:
      sparkdeploy logs --inventory lab --tail 100              # the last 100 lines of each container
      sparkdeploy logs -n spark2 -c vllm --since 10m           # one node's engine, last 10 minutes
      sparkdeploy logs -f                                      # follow every node until Ctrl-C
      sparkdeploy logs --deployment coder --tail 20            # one deployment of a stack
    Exit codes: 0 ok, 1 a node could not be read (the others are shown), 2 bad usage, 130 Ctrl-C, 143 SIGTERM
    (--follow stops within a second, however a node's stream stalls).
    """
    from sparkdeploy.config.inventory import load_inventory
    from sparkdeploy.config.secrets import load_secrets
    from sparkdeploy.daytwo import logs as node_logs
    from sparkdeploy.errors import NothingDeployed, StepFailed
    from sparkdeploy.runtime.remote import on_nodes
    from sparkdeploy.runtime.session import Session

    inv = load_inventory(inventory)
    chosen = [inv.node(n) for n in nodes] if nodes else list(inv.nodes)
    mask = load_secrets(inv.local_path(inv.cluster.secrets_file)).mask
    wanted = tuple(c if c.startswith("sparkdeploy-") else f"sparkdeploy-{c}" for c in containers)
    printer = Printer(mask, timestamps)
    label = node_logs.label_filter(deployment)
    with Session.open(inv) as session:
        conns = [session.conn(n) for n in chosen]
        if follow:
            stop = threading.Event()
            try:  # until Ctrl-C or SIGTERM (sparkdeploy/runtime/interrupts.py): exit 130 or 143
                node_logs.follow(
                    conns, printer.line, stop, since, 10 if tail is None and not since else tail, wanted, label
                )
            finally:
                stop.set()
            return
        outcomes = on_nodes(chosen, lambda n: node_logs.read(session.conn(n), since, tail, wanted, label))
    shown = set()
    for line in node_logs.merge(o.value[0] for o in outcomes if o.ok):
        printer.line(line)
    for o in outcomes:
        if o.ok:
            shown.update(o.value[1])
    failed = [o for o in outcomes if not o.ok]
    for o in failed:
        click.secho(f"{o.node.name}: could not read its logs: {mask(str(o.error))}", fg="red", err=True)
    if not shown and not failed:
        if wanted:
            click.echo(
                f"no sparkdeploy container named {', '.join(wanted)} on {', '.join(n.name for n in chosen)}", err=True
            )
        else:
            raise NothingDeployed(", ".join(n.name for n in chosen))
    if failed:
        raise StepFailed(f"logs incomplete: {', '.join(o.node.name for o in failed)} could not be read")
