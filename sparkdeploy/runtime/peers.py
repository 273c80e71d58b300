"""Node-to-node SSH over the fabric, with host keys checked: how one node sends bytes straight to another.

Chosen over a one-shot token receiver: sshd already runs on every Spark, authenticates both ends and
protects every byte (AEAD cipher), so there is no listener to open, no token to hand out and no second
integrity scheme to get right. sparkdeploy sets it up the way `trust` does for this machine:

- a dedicated key pair per node, `~/.ssh/sparkdeploy_peer` (ed25519, 0600), generated ON the node (no private
  key ever crosses the CLI machine);
- its public key in every peer's `~/.ssh/authorized_keys` with `restrict,from="<sender's fabric IP>"`: the key
  logs in only from that address (the peer ssh binds it with -b) and gets no forwarding, agent or pty;
- each peer's host keys, read from its /etc/ssh/ssh_host_*_key.pub over the CLI's own host-key-checked
  connection (and cross-checked against the key that connection verified), written to the sender's
  `~/.ssh/known_hosts_sparkdeploy` under the peer's FABRIC address;
- every peer ssh runs with StrictHostKeyChecking=yes, that known_hosts file only, BatchMode and IdentitiesOnly.

Everything is idempotent (a second run changes nothing) and `dry_run` says what it would add where.

`transfer_plan` orders the transfer as a chain source -> t1 -> t2 -> ...: every hop loads what it receives
and forwards it to the next as it arrives, so the source sends each byte once whatever N is, and every node's
link carries the stream once in and once out (full rate on a switch; a binary tree would halve each sender's
rate between two children for the same source load bound).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import shlex

from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.errors import StepFailed
from sparkdeploy.runtime.interrupts import in_threads
from sparkdeploy.runtime.remote import NodeConnection, fingerprint
from sparkdeploy.runtime.thread_imports import preload

PEER_KEY = "~/.ssh/sparkdeploy_peer"  # ssh expands ~ in -i and UserKnownHostsFile itself
PEER_KNOWN_HOSTS = "~/.ssh/known_hosts_sparkdeploy"
PEER_CONNECT_TIMEOUT_S = 10
# AES-GCM first: the GB10's Arm cores have AES instructions (several GB/s per stream); chacha20 as a fallback.
PEER_CIPHERS = "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com"

# Makes the key on the node if it is missing (never replaces one) and prints its public half.
_ENSURE_KEY = r"""set -eu
key="$HOME/.ssh/sparkdeploy_peer"
install -d -m 0700 "$HOME/.ssh"
if [ ! -f "$key" ]; then
  ssh-keygen -q -t ed25519 -N '' -C "$1" -f "$key" >/dev/null
  echo created >&2
fi
chmod 0600 "$key"
cat "$key.pub"
"""


def _home_path(home: str, tilde_path: str) -> str:
    return home.rstrip("/") + "/" + tilde_path.removeprefix("~/")


def known_hosts_host(node: Node) -> str:
    """The name the peer ssh looks the node up under: its fabric address (with the port when not 22)."""
    port = node.ssh.port or 22
    return node.fabric_address if port == 22 else f"[{node.fabric_address}]:{port}"


def peer_ssh_prefix(source: Node, target: Node) -> list[str]:
    """The peer ssh command up to the target's fabric address; the remote command (one argument) follows."""
    argv = [
        "ssh",
        "-T",
        "-i",
        PEER_KEY,
        "-b",
        source.fabric_address,
        "-c",
        PEER_CIPHERS,
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={PEER_KNOWN_HOSTS}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "UpdateHostKeys=no",
        "-o",
        f"ConnectTimeout={PEER_CONNECT_TIMEOUT_S}",
        "-o",
        "ServerAliveInterval=15",
        "-o",
        "ServerAliveCountMax=4",
        "-o",
        "LogLevel=ERROR",
        "-p",
        str(target.ssh.port or 22),
    ]
    if target.ssh.user:
        argv += ["-l", target.ssh.user]
    return argv + ["--", target.fabric_address]


def peer_ssh_argv(source: Node, target: Node, remote_argv: list[str]) -> list[str]:
    """argv to run ON `source` that runs `remote_argv` on `target` over its fabric address, host key checked.

    The remote command is one argument (shlex-joined here), so each of its parts reaches the target's shell
    quoted; quote this argv again (shlex.join, or NodeConnection.run) to run it on the source."""
    return peer_ssh_prefix(source, target) + [shlex.join(remote_argv)]


def transfer_plan(source: Node, targets: list[Node]) -> list[tuple[Node, Node]]:
    """The edges (sender, receiver) of a chain source -> t1 -> t2 -> ... in the order given (the source and
    duplicates left out): the source sends each byte once, every other hop forwards while it receives."""
    chain: list[Node] = [source]
    for node in targets:
        if all(node.name != n.name for n in chain):
            chain.append(node)
    return list(itertools.pairwise(chain))


# -- pure text edits (unit tested) -------------------------------------------------------------------------


def authorized_line(public_key: str, sender: Node) -> str:
    """The authorized_keys line for a sender's peer key: only from its fabric address, nothing but commands."""
    ktype, blob, *comment = public_key.split()
    return " ".join([f'restrict,from="{sender.fabric_address}"', ktype, blob, *comment[:1]])


def with_authorized(text: str, line: str) -> str | None:
    """authorized_keys `text` with `line` in it, replacing any other line of the same key (new options or
    comment); None when it is already there as is."""
    tokens = line.split()
    types = [i for i, t in enumerate(tokens) if t.startswith(("ssh-", "ecdsa-", "sk-")) and i + 1 < len(tokens)]
    blob = tokens[types[0] + 1] if types else line  # the key itself, never its type or options
    lines = text.splitlines()
    if line in lines:
        return None
    kept = [raw for raw in lines if blob not in raw.split()]
    return "\n".join(kept + [line]) + "\n"


def with_known_host(text: str, host: str, keys: list[str]) -> str | None:
    """known_hosts `text` with exactly `keys` ("type base64") for `host`; None when nothing changes."""
    lines = text.splitlines()
    mine = [raw for raw in lines if raw.split()[:1] == [host]]
    wanted = [f"{host} {key}" for key in keys]
    if sorted(mine) == sorted(wanted):
        return None
    kept = [raw for raw in lines if raw.split()[:1] != [host]]
    return "\n".join(kept + wanted) + "\n"


# -- setting it up on the nodes -----------------------------------------------------------------------------


def host_keys_of(conn: NodeConnection) -> list[str]:
    """The node's host keys ("type base64"), read over the CLI's verified connection; the key that connection
    verified must be among them (else the files are not the sshd's, and nothing is trusted)."""
    out = conn.run(["sh", "-c", "cat /etc/ssh/ssh_host_*_key.pub"], check=False).stdout
    keys = []
    for raw in out.splitlines():
        parts = raw.split()
        if len(parts) >= 2 and parts[0].startswith(("ssh-", "ecdsa-")):
            keys.append(f"{parts[0]} {parts[1]}")
    verified = conn.open().client.get_transport().get_remote_server_key()
    if f"{verified.get_name()} {verified.get_base64()}" not in keys:
        raise StepFailed(
            f"{conn.node.name}: the host key this machine verified ({fingerprint(verified)}) is not "
            f"among /etc/ssh/ssh_host_*_key.pub there; not trusting those files for peer SSH"
        )
    return sorted(set(keys))


def _fingerprints(keys: list[str]) -> str:
    """ssh-keygen -l style fingerprints of "type base64" keys."""
    out = []
    for key in keys:
        ktype, blob = key.split()[:2]
        digest = hashlib.sha256(base64.b64decode(blob)).digest()
        out.append(f"{ktype} SHA256:{base64.b64encode(digest).decode().rstrip('=')}")
    return ", ".join(out)


def ensure_peer_trust(inventory: Inventory, source: Node, targets: list[Node], dry_run: bool = False) -> list[str]:
    """Let `source` SSH to every target over the fabric (see the module docstring). Returns one line per change
    made (or, with dry_run, that would be made); an empty list when everything was already in place."""
    targets = [t for t in targets if t.name != source.name]
    if not targets:
        return []
    changes: list[str] = []
    comment = f"sparkdeploy-peer@{source.name}"
    with NodeConnection(source, inventory) as src:
        home = src.home()
        key_file = _home_path(home, PEER_KEY)
        public = (src.read(key_file + ".pub") or b"").decode().strip()
        if not public:
            if dry_run:
                changes.append(f"{source.name}: would create the peer key {PEER_KEY} (ed25519, 0600, on the node)")
            else:
                r = src.run(["sh", "-c", _ENSURE_KEY, "sh", comment])
                public = r.stdout.strip().splitlines()[-1]
                if "created" in r.stderr:
                    changes.append(f"{source.name}: created the peer key {PEER_KEY} (ed25519, 0600)")

        def per_target(target: Node) -> tuple[list[str], list[str]]:
            with NodeConnection(target, inventory) as conn:
                keys = host_keys_of(conn)
                lines = []
                if public:
                    line = authorized_line(public, source)
                    path = _home_path(conn.home(), "~/.ssh/authorized_keys")
                    text = (conn.read(path) or b"").decode(errors="replace")
                    new = with_authorized(text, line)
                    if new is not None:
                        what = (
                            f"{target.name}: {'would authorize' if dry_run else 'authorized'} {source.name}'s "
                            f'peer key in ~/.ssh/authorized_keys (from="{source.fabric_address}" only)'
                        )
                        if not dry_run:
                            conn.run(["install", "-d", "-m", "0700", path.rsplit("/", 1)[0]])
                            conn.put(new, path, 0o600)
                        lines.append(what)
                else:
                    lines.append(
                        f"{target.name}: would authorize {source.name}'s new peer key in "
                        f'~/.ssh/authorized_keys (from="{source.fabric_address}" only)'
                    )
                return keys, lines

        found = in_threads(targets, per_target, max_workers=min(8, len(targets)))  # a stop does not wait for them
        for _keys, lines in found:
            changes += lines

        kh_path = _home_path(home, PEER_KNOWN_HOSTS)
        text = (src.read(kh_path) or b"").decode(errors="replace")
        for target, (keys, _lines) in zip(targets, found, strict=False):
            host = known_hosts_host(target)
            new = with_known_host(text, host, keys)
            if new is not None:
                text = new
                changes.append(
                    f"{source.name}: {'would pin' if dry_run else 'pinned'} {target.name}'s host keys "
                    f"under its fabric address {host} in {PEER_KNOWN_HOSTS} ({_fingerprints(keys)})"
                )
        if not dry_run and any("pinned" in c for c in changes):
            src.put(text, kh_path, 0o600)
    return changes


def ensure_plan_trust(inventory: Inventory, edges: list[tuple[Node, Node]], dry_run: bool = False) -> list[str]:
    """ensure_peer_trust for every sender of a transfer plan (each sender to its receivers)."""
    receivers: dict[str, tuple[Node, list[Node]]] = {}
    for sender, receiver in edges:
        receivers.setdefault(sender.name, (sender, []))[1].append(receiver)
    # Every sender at once: each edits only its own key and known_hosts and its receivers' authorized_keys, and
    # a receiver has one sender in a chain, so no two threads touch one file; a chain of N hops costs one hop.
    # (Edges giving a receiver two senders would share its authorized_keys: then one sender after the other.)
    shared = len({r.name for _s, r in edges}) < len(edges)
    preload()
    found = in_threads(
        list(receivers.values()),
        lambda item: ensure_peer_trust(inventory, item[0], item[1], dry_run=dry_run),
        max_workers=1 if shared else min(8, len(receivers) or 1),
    )
    return [line for lines in found for line in lines]
