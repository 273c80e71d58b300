"""`sparkdeploy setup ssh|...`: day-zero setup of new Sparks (logic: sparkdeploy/dayzero/)."""

from __future__ import annotations

import click

from sparkdeploy.cli.common import emit_json, inventory_option, json_option, stop_deployments_option
from sparkdeploy.cli.init_cmd import password_options, read_password
from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.dayzero.network_setup import ROLLBACK_S, problems, restore_network, setup_network
from sparkdeploy.dayzero.ssh_setup import setup_ssh
from sparkdeploy.errors import StepFailed


@click.group("setup")
def setup() -> None:
    """Day-zero setup of new Sparks, after `sparkdeploy init` wrote the inventory.

    \b
      sparkdeploy setup ssh --ask-password      # this machine's key on every node; sudo and docker checked
      sparkdeploy setup ssh --ask-password --grant-sudo   # and passwordless sudo for what sparkdeploy needs
      sparkdeploy setup network --dry-run       # the ConnectX-7 link's netplan file on every node, MTU 9000
    """


@setup.command("ssh")
@inventory_option
@click.option("--login-key", metavar="PATH", help="Log in once with this key (one the nodes already accept).")
@click.option(
    "--grant-sudo",
    is_flag=True,
    help="With the password: write /etc/sudoers.d/sparkdeploy granting exactly the programs missing (visudo-checked).",
)
@click.option("--dry-run", is_flag=True, help="Say what would be added; change nothing (no key is created either).")
@password_options
@json_option
def ssh(
    inventory: str | None,
    login_key: str | None,
    grant_sudo: bool,
    dry_run: bool,
    ask_password: bool,
    password_file: str | None,
    as_json: bool,
) -> None:
    """Put this machine's key on every node; check passwordless sudo and the docker group.

    \b
    The key is each node's ssh.key in the inventory (default ~/.ssh/id_ed25519, created if missing). A node
    that does not take it yet is logged into once with its password (--ask-password: typed, never shown;
    or --password-file, mode 0600) or a key it accepts (--login-key). Then the key alone must work. Passwordless
    sudo is checked for exactly the programs sparkdeploy runs as root, and each missing one is named with the
    sudoers line that grants it. Running it again changes nothing.
    """
    inv = load_inventory(inventory)
    results = setup_ssh(inv, dry_run, read_password(ask_password, password_file), login_key, grant_sudo)
    problems = [p for r in results for p in r.problems()]
    if as_json:
        emit_json({"ok": not problems, "dry_run": dry_run, "nodes": [r.to_json() for r in results]})
    else:
        for r in results:
            if r.error:
                continue
            sudo = ", ".join(f"{c} {s}" for c, s in r.sudo.items())
            works = "works" if r.key_login else ("not checked (dry run)" if dry_run else "FAILS")
            click.echo(
                f"{r.node}: logged in with {r.login}; key {r.key}; key login {works}; sudo: {sudo}; "
                f"docker group: {'yes' if r.docker_group else 'no'}"
            )
        for p in problems:
            click.echo(f"FAILED {p}")
    if problems:
        raise StepFailed("setup ssh: fix the lines above and run it again")


@setup.command("network")
@inventory_option
@click.option("--dry-run", is_flag=True, help="Show each node's file (and the diff of a file it would replace).")
@click.option(
    "--replace", is_flag=True, help="Take over a netplan file sparkdeploy did not write (kept for --restore)."
)
@click.option("--restore", is_flag=True, help="Put back the netplan files as they were before sparkdeploy's.")
@click.option(
    "--rollback-after",
    type=click.IntRange(15, 600),
    default=ROLLBACK_S,
    show_default=True,
    help="Seconds after which a node undoes a change this command could not confirm over a new connection.",
)
@stop_deployments_option
@json_option
def network(
    inventory: str | None,
    dry_run: bool,
    replace: bool,
    restore: bool,
    rollback_after: int,
    stop_deployments: bool,
    as_json: bool,
) -> None:
    """Configure the ConnectX-7 fabric on every node (netplan, MTU 9000), safely, then verify it.

    \b
    The file (/etc/netplan/40-sparkdeploy-fabric.yaml) comes from the inventory: each node's fabric_ifaces and
    fabric_ip (a second interface gets the next subnet), dhcp off, MTU 9000 also on the port's twin name;
    netplan renders for NetworkManager where it owns the ports. Bad input (an interface the node lacks, a
    subnet that overlaps another network, an address in use, an MTU the port refuses) changes nothing.
    A netplan file sparkdeploy did not write that configures these ports stops it with the diff (--replace).
    Each node starts its own rollback timer before applying and undoes the change unless this command
    confirms it from a NEW SSH connection (a change that cuts the management network undoes itself).
    Then: don't-fragment pings at the MTU between every pair, RDMA devices up, the RoCE v2 GID index.
    A deployment whose ranks talk over the fabric of a node it would change is named and refused, unless
    --stop-deployments (it is stopped cleanly first; `sparkdeploy up` starts it again).
    """
    from sparkdeploy.deploy import serving  # the fact layer and sessions: only once the options parsed
    from sparkdeploy.deploy.serving import FLAG

    inv = load_inventory(inventory)
    doing = "setup network --restore" if restore else "setup network"

    def before_change(nodes: list[str]) -> None:
        if dry_run:
            for r in serving.find(serving.read(inv), nodes, fabric_only=True):
                click.echo(
                    f"{doing} would break {r.name} (its ranks talk over the fabric): refused without {FLAG}", err=True
                )
            return
        serving.guard(inv, doing, nodes, stop_deployments, click.echo, fabric_only=True)

    if restore:
        results = restore_network(inv, dry_run, before_change)
    else:
        results = setup_network(
            inv, dry_run=dry_run, replace=replace, rollback_s=rollback_after, before_change=before_change
        )
    found = problems(results)
    if as_json:
        emit_json({"ok": not found, "dry_run": dry_run, "nodes": [r.to_json() for r in results]})
    else:
        for r in results:
            sim = " (applied by the lab's stand-in for systemd-networkd: SIMULATED)" if r.standin else ""
            pings = ", ".join(f"{peer} {state}" for peer, state in r.pings.items())
            extra = f"; DF pings at MTU 9000: {pings}" if pings else ""
            extra += f"; RoCE v2 GID index {r.gid_index}" if r.gid_index is not None else ""
            click.echo(f"{r.node}: {r.state}{sim}{extra}")
            if dry_run and r.text:
                click.echo(f"--- {r.node}: /etc/netplan/40-sparkdeploy-fabric.yaml ---")
                click.echo(r.text, nl=False)
            if r.foreign:
                click.echo(r.diffs(), nl=False)
        for line in found:
            click.echo(f"FAILED {line}")
    if found:
        raise StepFailed("setup network: fix the lines above and run it again")


__all__ = ["setup"]
