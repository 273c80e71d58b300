"""`sparkdeploy trust NODE [--yes] [--replace]`: record a node's SSH host key after showing its fingerprint.

Compare the fingerprint with the node's own (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on its
console) before answering yes. A key already recorded and equal: nothing to do. A recorded key that differs
is a CHANGED key: refused unless --replace is given (the node was reinstalled), and then the old line goes.
"""

from __future__ import annotations

from pathlib import Path

import click
import paramiko

from sparkdeploy.cli.common import inventory_option
from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.config.userfile import read_text
from sparkdeploy.errors import ConfigError, Problem, StepFailed
from sparkdeploy.runtime.remote import connect_problem, fingerprint, known_hosts_name, record_host_key, scan_host_key


def _entries(path: Path) -> list[tuple[str, paramiko.hostkeys.HostKeyEntry | None]]:
    out: list[tuple[str, paramiko.hostkeys.HostKeyEntry | None]] = []
    if not path.is_file():
        return out
    for raw in read_text(path, "known_hosts file").splitlines(keepends=True):
        entry = None
        text = raw.strip()
        if text and not text.startswith("#"):
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(text)
            except (paramiko.SSHException, ValueError, IndexError):
                entry = None
        out.append((raw, entry))
    return out


def _matches(entry: paramiko.hostkeys.HostKeyEntry, name: str) -> bool:
    for host in entry.hostnames:
        if host.startswith("|1|"):
            try:
                if paramiko.HostKeys.hash_host(name, host) == host:
                    return True
            except (ValueError, IndexError):  # a malformed hashed entry (bad base64, missing salt) matches nothing
                continue
        elif host == name:
            return True
    return False


def recorded_keys(path: Path, name: str) -> list[paramiko.PKey]:
    return [e.key for _, e in _entries(path) if e is not None and e.key is not None and _matches(e, name)]


def remove_host(path: Path, name: str) -> int:
    """Drop every line for `name` (plain or hashed); keep all other lines as they are. Returns lines removed."""
    kept, removed = [], 0
    for raw, entry in _entries(path):
        if entry is not None and _matches(entry, name):
            removed += 1
        else:
            kept.append(raw)
    if removed:
        tmp = path.with_name(path.name + ".sparkdeploy-tmp")
        tmp.write_text("".join(kept))
        tmp.chmod(path.stat().st_mode & 0o777)
        tmp.replace(path)
    return removed


@click.command("trust")
@click.argument("node_name", metavar="NODE")
@inventory_option
@click.option("--yes", "-y", is_flag=True, help="Record the key without asking (you checked the fingerprint).")
@click.option("--replace", is_flag=True, help="The node's key CHANGED (reinstalled node): replace the recorded key.")
def trust(node_name: str, inventory: str | None, yes: bool, replace: bool) -> None:
    """Show NODE's SSH host key fingerprint and record it in the inventory's known_hosts."""
    inv = load_inventory(inventory)
    node = inv.node(node_name)
    path = inv.local_path(inv.cluster.known_hosts)
    if path is None:
        raise ConfigError(Problem(inv.source, "cluster.known_hosts", "is empty", "set a known_hosts path"))
    try:
        key = scan_host_key(node, inv)
    except (OSError, paramiko.SSHException, EOFError) as exc:
        raise StepFailed(
            f"{node.name} ({node.mgmt_ip}): could not read its host key: "
            f"{connect_problem(exc, node.mgmt_ip, node.ssh.port)}"
        ) from None
    name = known_hosts_name(node.mgmt_ip, node.ssh.port or 22)
    fp = fingerprint(key)
    click.echo(f"{node.name} ({name}) offers {key.get_name()} {fp}")
    recorded = recorded_keys(path, name)
    same = [k for k in recorded if k.get_name() == key.get_name() and k.asbytes() == key.asbytes()]
    if same:
        click.echo(f"already trusted in {path}")
        return
    if recorded:
        old = ", ".join(f"{k.get_name()} {fingerprint(k)}" for k in recorded)
        if not replace:
            raise StepFailed(
                f"{node.name}: the host key CHANGED: {path} has {old}, the node now offers "
                f"{key.get_name()} {fp}. If the node was reinstalled, check the new fingerprint on its "
                f"console and run: sparkdeploy trust {node.name} --replace"
            )
        click.echo(f"replacing the recorded key(s): {old}")
    if not yes and not click.confirm(f"Trust this key for {node.name}?", default=False):
        raise StepFailed("not trusted: nothing was recorded")
    if recorded:
        remove_host(path, name)
    record_host_key(path, node, key)
    click.echo(f"recorded in {path}")


__all__ = ["trust"]
