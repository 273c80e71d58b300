"""`sparkdeploy setup ssh`: this machine's key on every node, then passwordless sudo and the docker group checked.

Per node: log in with the inventory's key; when the node does not take it yet, log in once with the password
(typed at a getpass prompt or read from a 0600 file: never a command line, never a message) or with a key it
already accepts (--login-key), and append the public key to ~/.ssh/authorized_keys unless that exact line is
there. Then a fresh connection with the key alone proves it works. Over the same connection (a password login
is a NodeConnection too) the fact layer reads `sudo -n -l` for each program in sudo_needs.NEEDS and the user's
groups (facts/ set ACCESS); what is missing is named with the fix.
Running it again changes nothing. Host keys: the inventory's known_hosts (`init` pinned them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko

from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.config.userfile import read_text
from sparkdeploy.dayzero import sudo_needs
from sparkdeploy.dayzero.login import key_file_problems
from sparkdeploy.errors import ConfigError, Problem, StepFailed, has_controls
from sparkdeploy.facts import FactArgs, NodeFacts, gather
from sparkdeploy.lab.ssh_keys import ensure_keypair
from sparkdeploy.runtime.remote import HostKeyError, NodeConnection, NodeUnreachable, on_nodes

DEFAULT_KEY = "~/.ssh/id_ed25519"

# The one change: stdin, the public key line, appended to ~/.ssh/authorized_keys unless that exact line is there.
# $1: 1 for a dry run. Prints present | would-add | added | failed. What the node has (user, groups, sudo) is
# read through the fact layer (facts/ set ACCESS), not here.
KEY_SCRIPT = r"""
set -u
key=$(head -n 1)
ak="$HOME/.ssh/authorized_keys"
if [ -f "$ak" ] && grep -qxF -- "$key" "$ak"; then echo present
elif [ "$1" = 1 ]; then echo would-add
else
  umask 077; mkdir -p "$HOME/.ssh" && chmod 700 "$HOME/.ssh" && printf '%s\n' "$key" >> "$ak" && chmod 600 "$ak" \
    && echo added || echo failed
fi
"""
KEY_STATES = ("present", "would-add", "added", "failed")


@dataclass
class NodeSsh:
    node: str
    login: str = ""  # key | password | login-key: how this run got in
    key: str = ""  # present | added | would-add | failed
    key_login: bool = False  # a fresh connection with the key alone works
    sudo: dict[str, str] = field(default_factory=dict)  # command -> ok | missing | absent
    sudo_paths: dict[str, str] = field(default_factory=dict)
    docker_group: bool = False
    user: str = ""
    error: str = ""

    @property
    def missing_sudo(self) -> list[str]:
        return [c for c, state in self.sudo.items() if state not in ("ok", "granted")]

    def problems(self) -> list[str]:
        if self.error:
            return [f"{self.node}: {self.error}"]
        out = []
        if self.key == "failed" or (self.key in ("present", "added") and not self.key_login):
            out.append(f"{self.node}: the key is in ~/.ssh/authorized_keys but logging in with it fails")
        if self.missing_sudo:
            paths = [self.sudo_paths.get(c) or c for c in self.missing_sudo]
            grant = sudo_needs.sudoers_line(self.user or "USER", paths)
            out.append(
                f"{self.node}: no passwordless sudo for {', '.join(self.missing_sudo)} "
                f"({'; '.join(f'{c}: {sudo_needs.why(c)}' for c in self.missing_sudo)}) (fix: on the node, "
                f"`sudo visudo -f /etc/sudoers.d/sparkdeploy` and add: {grant})"
            )
        if not self.docker_group:
            out.append(
                f"{self.node}: {self.user or 'the SSH user'} is not in the docker group "
                f"(fix: sudo usermod -aG docker {self.user or 'USER'}, then log in again)"
            )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "login": self.login,
            "key": self.key,
            "key_login": self.key_login,
            "sudo": self.sudo,
            "docker_group": self.docker_group,
            "problems": self.problems(),
        }


def from_facts(node: str, key: str, facts: NodeFacts) -> NodeSsh:
    """The key's state and the node's facts (set ACCESS: user, groups, `sudo -n -l` per sudo_needs program)."""
    return NodeSsh(
        node,
        key=key,
        sudo=dict(facts.sudo),
        sudo_paths=dict(facts.sudo_paths),
        docker_group="docker" in facts.groups,
        user=facts.user,
    )


def read_access(conn: NodeConnection) -> NodeFacts:
    """The user, its groups and `sudo -n -l` of each program sudo_needs names: one round trip (facts/)."""
    return gather(conn, "access", FactArgs(sudo_programs=tuple(sudo_needs.commands())))


def key_paths(inv: Inventory) -> dict[str, Path]:
    """Each node's private key on this machine: its ssh.key, else ~/.ssh/id_ed25519."""
    out: dict[str, Path] = {}
    for n in inv.nodes:
        path = inv.local_path(n.ssh.key) if n.ssh.key else None
        out[n.name] = path or Path(os.path.expanduser(DEFAULT_KEY))
    return out


def public_key(path: Path, dry_run: bool) -> str:
    """The public key line of `path` (.pub, else derived from the private key); created when neither exists
    (a dry run says so and creates nothing)."""
    pub = path.with_name(path.name + ".pub")
    if pub.exists():
        line = read_text(pub, "public key", "regenerate it: ssh-keygen -y -f PRIVATE > PRIVATE.pub").split("\n")[0]
        if has_controls(line.strip()):
            raise ConfigError(Problem(str(pub), "", "is not one line of text", "regenerate it"))
        return line.strip()
    if path.is_file():
        try:
            key = paramiko.PKey.from_path(path)
        except (paramiko.SSHException, OSError, ValueError) as exc:
            raise ConfigError(
                Problem(str(path), "ssh.key", f"cannot read the private key ({exc.__class__.__name__})", "check it")
            ) from None
        return f"{key.get_name()} {key.get_base64()}"
    if dry_run:
        return ""
    return ensure_keypair(path, "sparkdeploy").public


def _login_inventory(inv: Inventory, node: Node, login_key: str) -> tuple[Node, Inventory]:
    data = inv.model_dump()
    data["nodes"] = [
        dict(n, ssh=dict(n["ssh"], key=str(Path(login_key).expanduser().resolve()))) for n in data["nodes"]
    ]
    other = Inventory.model_validate(data)
    other.path = inv.path
    return other.node(node.name), other


def _connect(
    node: Node, inv: Inventory, key_exists: bool, password: str | None, login_key: str | None
) -> tuple[NodeConnection, str]:
    if key_exists:
        conn = NodeConnection(node, inv)
        try:
            conn.open()
            return conn, "key"
        except (HostKeyError, NodeUnreachable):
            raise
        except StepFailed:  # authentication failed: the node does not take the key yet
            conn.close()
    if login_key:
        other_node, other = _login_inventory(inv, node, login_key)
        conn = NodeConnection(other_node, other)
        conn.open()
        return conn, "login-key"
    if password is not None:
        conn = NodeConnection(node, inv)
        conn.password = password
        conn.open()
        return conn, "password"
    raise StepFailed(
        f"{node.name} ({node.mgmt_ip}): does not accept the key yet; give its password once with --ask-password "
        "(or --password-file), or a key it accepts with --login-key"
    )


def grant_sudo(conn: NodeConnection, result: NodeSsh, password: str) -> None:
    """Write /etc/sudoers.d/sparkdeploy granting exactly the missing programs (checked by visudo first). The
    password goes to `sudo -S` on stdin, the sudoers text after it; neither is on a command line."""
    paths = [result.sudo_paths[c] for c in result.missing_sudo if c in result.sudo_paths]
    if not paths:
        return
    text = "# Written by `sparkdeploy setup ssh --grant-sudo`: what sparkdeploy runs as root (sudo_needs.py).\n"
    text += sudo_needs.sudoers_line(result.user, paths) + "\n"
    res = conn.run(["sudo", "-S", "-p", "", "bash", "-c", GRANT_SCRIPT], stdin=password + "\n" + text, check=False)
    if res.exit_code != 0:
        raise conn.failed(res, f"{result.node}: could not write /etc/sudoers.d/sparkdeploy (wrong password?)")
    for c in result.missing_sudo:
        if c in result.sudo_paths:
            result.sudo[c] = "granted"


GRANT_SCRIPT = r"""
set -e
f=$(mktemp)
cat > "$f"
visudo -cf "$f" >/dev/null
install -m 0440 -o root -g root "$f" /etc/sudoers.d/sparkdeploy
rm -f "$f"
"""


def setup_node(
    node: Node,
    inv: Inventory,
    pub: str,
    dry_run: bool,
    password: str | None,
    login_key: str | None,
    sudo: bool = False,
) -> NodeSsh:
    conn, how = _connect(node, inv, key_paths(inv)[node.name].is_file(), password, login_key)
    with conn:
        args = ["bash", "-c", KEY_SCRIPT, "setup-ssh", "1" if dry_run else "0"]
        res = conn.run(args, stdin=(pub or "ssh-ed25519 WOULD-BE-CREATED") + "\n", check=False, timeout=60)
        key = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
        if res.exit_code != 0 or key not in KEY_STATES:
            raise conn.failed(res)
        result = from_facts(node.name, key, read_access(conn))
        if sudo and result.missing_sudo and not dry_run:
            if password is None:
                raise StepFailed(f"{node.name}: --grant-sudo needs the password (--ask-password or --password-file)")
            grant_sudo(conn, result, password)
    result.login = how
    if result.key in ("present", "added"):
        with NodeConnection(node, inv) as fresh:  # the key alone, no password
            try:
                fresh.run(["true"], timeout=30)
                result.key_login = True
            except StepFailed:
                result.key_login = False
    return result


def setup_ssh(
    inv: Inventory, dry_run: bool, password: str | None, login_key: str | None, sudo: bool = False
) -> list[NodeSsh]:
    if login_key is not None:  # checked before anything connects, like every argument
        found = key_file_problems(login_key, "setup ssh", "--login-key")
        if not found and not Path(login_key).expanduser().is_file():
            found = [Problem("setup ssh", "--login-key", f"{login_key}: no such file", "a key the nodes accept")]
        if found:
            raise ConfigError(found)
    paths = key_paths(inv)
    pubs = {n.name: public_key(paths[n.name], dry_run) for n in inv.nodes}
    outcomes = on_nodes(inv.nodes, lambda n: setup_node(n, inv, pubs[n.name], dry_run, password, login_key, sudo))
    results = []
    for o in outcomes:
        if o.ok:
            results.append(o.value)
        elif isinstance(o.error, StepFailed):
            results.append(NodeSsh(o.node.name, error=str(o.error)))
        else:
            raise o.error  # type: ignore[misc]  # a bug, not a node's state
    return results
