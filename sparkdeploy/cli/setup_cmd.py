"""`sparkdeploy setup ssh|...`: day-zero setup of new Sparks (logic: sparkdeploy/dayzero/)."""

from __future__ import annotations

import click

from sparkdeploy.cli.common import emit_json, inventory_option, json_option
from sparkdeploy.cli.init_cmd import password_options, read_password
from sparkdeploy.dayzero.ssh_setup import setup_ssh
from sparkdeploy.errors import StepFailed
from sparkdeploy.inventory import load_inventory


@click.group("setup")
def setup():
    """Day-zero setup of new Sparks, after `sparkdeploy init` wrote the inventory.

    \b
      sparkdeploy setup ssh --ask-password      # this machine's key on every node; sudo and docker checked
      sparkdeploy setup ssh --ask-password --grant-sudo   # and passwordless sudo for what sparkdeploy needs
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
def ssh(inventory, login_key, grant_sudo, dry_run, ask_password, password_file, as_json):
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


__all__ = ["setup"]
