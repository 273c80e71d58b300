"""`sparkdeploy init`: discover new Sparks and write the inventory (logic: sparkdeploy/dayzero/init.py)."""

from __future__ import annotations

import getpass
from collections.abc import Callable
from pathlib import Path

import click

from sparkdeploy.cli.common import Command, emit_json, json_option
from sparkdeploy.dayzero.init import InitOptions, InitResult, run_init
from sparkdeploy.dayzero.login import read_password_file
from sparkdeploy.errors import StepFailed


def password_options(command: Command) -> Command:
    command = click.option(
        "--password-file",
        metavar="PATH",
        help="The nodes' SSH password, from a file only you can read (mode 0600); for scripts.",
    )(command)
    return click.option(
        "--ask-password",
        is_flag=True,
        help="Ask for the nodes' SSH password once (typed, never shown): new Sparks take only a password.",
    )(command)


def read_password(ask: bool, path: str | None) -> str | None:
    if path:
        return read_password_file(path)
    if ask:
        return getpass.getpass("SSH password for the nodes: ")
    return None


def _confirm(yes: bool, as_json: bool) -> Callable[[str, str, str], bool]:
    def confirm(host: str, ktype: str, fp: str) -> bool:
        click.echo(f"{host} offers the SSH host key {ktype} {fp}", err=as_json)
        if yes:
            click.echo("  trusted (--yes)", err=as_json)
            return True
        return click.confirm(
            "  Is that the fingerprint the node shows on its console (ssh-keygen -lf "
            "/etc/ssh/ssh_host_ed25519_key.pub)? Trust it",
            default=False,
            err=as_json,
        )

    return confirm


def _print(result: InitResult, dry_run: bool) -> None:
    for line in result.failures:
        click.echo(f"FAILED {line}")
    if result.plan is not None:
        for f in result.facts:
            sim = f"  [SIMULATED: {', '.join(f.simulated)}]" if f.simulated else ""
            gpu = ", ".join(f.gpus) or "no GPU"
            ports = "; ".join(
                f"{'/'.join(p.names)} {'up' if p.up else 'down'}"
                + (f" {p.speed_mbps // 1000} Gb/s" if p.up and p.speed_mbps else "")
                for p in f.ports
            )
            click.echo(f"{f.host}: {f.hostname or '?'}, {gpu}, CX7: {ports or 'none'}{sim}")
        for finding in result.plan.findings:
            click.echo(f"{finding.severity.upper()} {finding.line()}")
    if result.lab is not None and result.text:
        click.echo(
            f"these hosts are the sparkdeploy lab `{result.lab['name']}` (SIMULATED): the inventory gets its settings "
            f"({', '.join(f'{k}: {v}' for k, v in (result.lab.get('lab_cluster') or {}).items())}, fabric subnet "
            f"{result.plan.subnet if result.plan else '?'})"
        )
    if result.text and dry_run and not result.diff:
        click.echo("--- the inventory (dry run: nothing written) ---")
        click.echo(result.text, nl=False)
    if result.diff:
        how = "merged with yours: your edits kept" if result.merged else "replaced (--force): lines marked - go"
        click.echo(f"--- the inventory {'would be ' if dry_run else ''}{how} ---")
        click.echo(result.diff)
        for line in result.changes:
            click.echo(f"  {line}")
    if result.written:
        click.echo(f"wrote {result.written}" + (f" (the old one kept as {result.backup})" if result.backup else ""))
        click.echo("next: sparkdeploy setup ssh; sparkdeploy setup network")


@click.command("init")
@click.option(
    "--hosts", required=True, metavar="IP[,IP...]", help="The nodes' management addresses; the first is the head."
)
@click.option("--user", "-u", metavar="USER", help="SSH login on the nodes (default: as ssh would, your own).")
@click.option("--key", metavar="PATH", help="Private key to log in with (default: the SSH agent and ~/.ssh keys).")
@click.option(
    "--out", "-o", default="inventory.yaml", show_default=True, type=click.Path(dir_okay=False, path_type=Path)
)
@click.option(
    "--known-hosts",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where host keys are pinned (default: sparkdeploy's own, in its state folder).",
)
@click.option(
    "--fabric-subnet", metavar="CIDR", help="Propose fabric addresses from this subnet (default: a free one)."
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace an existing --out file instead of merging into it (the diff shows what goes; the old one is "
    "kept as .bak). Without it, init merges: your edits stay, the nodes' new readings replace the old ones.",
)
@click.option("--yes", "-y", is_flag=True, help="Trust the host keys shown without asking (you checked them).")
@click.option("--dry-run", is_flag=True, help="Read the nodes and print the inventory; write nothing, pin no key.")
@password_options
@json_option
def init(
    hosts: str,
    user: str | None,
    key: str | None,
    out: Path,
    known_hosts: Path | None,
    fabric_subnet: str | None,
    force: bool,
    yes: bool,
    dry_run: bool,
    ask_password: bool,
    password_file: str | None,
    as_json: bool,
) -> None:
    """Read new Sparks over SSH and write a commented inventory.

    \b
    On every node: the GPU, the ConnectX-7 ports (up or not, speed, both names of each port, their RDMA
    devices, the RoCE v2 GID index), addresses and MTU. Each unknown SSH host key is shown with its
    fingerprint and pinned only once you confirm it (or --yes). Problems get one line each (no GB10, no
    port up, the cable in different ports, two addresses of one machine); with one, nothing is written.

    \b
    Examples:
      sparkdeploy init --hosts 192.168.1.101,192.168.1.102 --user spark --ask-password --dry-run
      sparkdeploy init --hosts 192.168.1.101,192.168.1.102 --user spark --key ~/.ssh/id_ed25519
    """
    opts = InitOptions(
        hosts=hosts,
        user=user,
        key=key,
        out=out,
        known_hosts=known_hosts,
        fabric_subnet=fabric_subnet,
        dry_run=dry_run,
        force=force,
        password=read_password(ask_password, password_file),
    )
    result = run_init(opts, _confirm(yes, as_json))
    if as_json:
        emit_json(result.to_json())
    else:
        _print(result, dry_run)
    if not result.ok:
        raise StepFailed("init: nothing written: fix the lines above and run it again")


__all__ = ["init"]
