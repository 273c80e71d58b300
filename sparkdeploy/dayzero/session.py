"""Connecting to nodes that have no inventory yet: host keys shown and pinned only once confirmed.

Each host's key is read during the key exchange (remote.scan_host_key: nothing authenticates yet) and compared
with sparkdeploy's known_hosts. Already pinned and equal: nothing to ask. Pinned and different: refused (the
line to remove is named). Unknown: its SHA256 fingerprint goes to `confirm`; a yes lets this run connect with it
(from a temporary copy of known_hosts, gone when the run ends) and `pin` records it in known_hosts, which `init`
calls only once it writes the inventory: a host it refuses (an address of a machine given twice, a problem that
stops it, a dry run) gets nothing pinned. The connections themselves are remote.NodeConnection's, host-key
checking on.
"""

from __future__ import annotations

import ipaddress
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import paramiko

from sparkdeploy import paths
from sparkdeploy.errors import ConfigError, Problem, StepFailed
from sparkdeploy.inventory import Inventory, Node, SSHSettings, parse_ip
from sparkdeploy.remote import connect_problem, fingerprint, known_hosts_name, on_nodes, record_host_key, scan_host_key

# (host, key type, SHA256 fingerprint) -> trust it?
Confirm = Callable[[str, str, str], bool]
PLACEHOLDER_NET = "198.51.100.0/24"  # TEST-NET-2: the fabric of the probe inventory, never used to connect


def default_known_hosts() -> Path:
    """sparkdeploy's own known_hosts (the inventory `init` writes points at it)."""
    return paths.state_dir() / "known_hosts"


def parse_hosts(text: str) -> list[str]:
    """--hosts IP[,IP...]: IP addresses (no names), each once. One line per bad entry."""
    hosts, problems = [], []
    for raw in [h.strip() for h in text.split(",")]:
        if not raw:
            continue
        try:
            ip = str(parse_ip(raw, "--hosts"))
        except ValueError as exc:
            message, _, fix = str(exc).partition(" | fix: ")
            problems.append(Problem("init", "--hosts", message, fix))
            continue
        if ip in hosts:
            problems.append(Problem("init", "--hosts", f"{ip} is given twice", "give each node once"))
        hosts.append(ip)
    if not hosts and not problems:
        problems.append(Problem("init", "--hosts", "no address given", "e.g. --hosts 192.168.1.101,192.168.1.102"))
    if problems:
        raise ConfigError(problems)
    return hosts


def probe_inventory(
    hosts: list[str], user: str | None, key: str | None, known_hosts: Path, port: int = 22
) -> Inventory:
    """An inventory of the hosts as they are before `init`: only what connecting needs is real."""
    net = list(paths_hosts(len(hosts)))
    nodes = [
        Node(
            name=f"host{i + 1}",
            role="head" if i == 0 else "worker",
            mgmt_ip=h,
            fabric_ip=net[i],
            fabric_ifaces=["unknown"],
            ssh=SSHSettings(user=user, port=port, key=key),
        )
        for i, h in enumerate(hosts)
    ]
    return Inventory.model_validate(
        {"cluster": {"known_hosts": str(known_hosts)}, "nodes": [n.model_dump() for n in nodes]}
    )


def paths_hosts(count: int) -> Iterator[str]:
    net = ipaddress.IPv4Network(PLACEHOLDER_NET)
    for i in range(count):
        yield f"{net[10 + i]}/{net.prefixlen}"


@dataclass
class HostKey:
    host: str
    key: paramiko.PKey
    status: str  # pinned (already) | accepted (now) | changed | refused

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.key)

    def to_json(self) -> dict[str, str]:
        return {"host": self.host, "type": self.key.get_name(), "fingerprint": self.fingerprint, "status": self.status}


def _pinned(path: Path, name: str) -> list[paramiko.PKey]:
    keys = paramiko.HostKeys()
    if path.is_file():
        keys.load(str(path))
    entry = keys.lookup(name)
    return list(entry.values()) if entry else []


def scan_keys(inv: Inventory) -> list[HostKey | StepFailed]:
    """Every node's offered host key (in parallel); a node that does not answer SSH: its one line."""
    outcomes = on_nodes(inv.nodes, lambda n: scan_host_key(n, inv))
    out: list[HostKey | StepFailed] = []
    for o in outcomes:
        if o.ok:
            out.append(HostKey(o.node.mgmt_ip, o.value, ""))
        elif isinstance(o.error, (OSError, paramiko.SSHException, EOFError)):
            out.append(
                StepFailed(
                    f"{o.node.mgmt_ip}: no SSH answer: {connect_problem(o.error, o.node.mgmt_ip, o.node.ssh.port)}"
                )
            )
        else:
            raise o.error  # type: ignore[misc]  # a bug, not a node's state
    return out


def pin(known_hosts: Path, inv: Inventory, keys: list[HostKey]) -> None:
    """Record the keys accepted in this run in known_hosts (those already pinned are there)."""
    by_ip = {n.mgmt_ip: n for n in inv.nodes}
    for k in keys:
        if k.status == "accepted":
            record_host_key(known_hosts, by_ip[k.host], k.key)


@contextmanager
def trusted_keys(
    inv: Inventory, known_hosts: Path, confirm: Confirm
) -> Iterator[tuple[Inventory, list[HostKey], list[str]]]:
    """Ask about each unknown key; yield the inventory to connect with (its known_hosts, a temporary copy, holds
    exactly the keys pinned or accepted), the keys (`pin` records the accepted ones), and one line per host that
    cannot be used (no SSH, changed, refused). Nothing is written to known_hosts here."""
    scanned = scan_keys(inv)
    keys: list[HostKey] = []
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="sparkdeploy-init-") as tmp:
        use_path = Path(tmp) / "known_hosts"
        if known_hosts.is_file():
            use_path.write_text(known_hosts.read_text())
        for node, item in zip(inv.nodes, scanned, strict=True):
            if isinstance(item, StepFailed):
                failures.append(str(item))
                continue
            name = known_hosts_name(node.mgmt_ip, node.ssh.port or 22)
            pinned = _pinned(known_hosts, name)
            same = [k for k in pinned if k.get_name() == item.key.get_name() and k.asbytes() == item.key.asbytes()]
            if same:
                item.status = "pinned"
            elif [k for k in pinned if k.get_name() == item.key.get_name()]:
                item.status = "changed"
                failures.append(
                    f"{node.mgmt_ip}: the host key CHANGED: {known_hosts} pins another {item.key.get_name()} key, "
                    f"the node offers {item.fingerprint}; if the node was reinstalled, check the fingerprint on its "
                    f"console and remove the old line: ssh-keygen -R {name} -f {known_hosts}"
                )
            elif confirm(node.mgmt_ip, item.key.get_name(), item.fingerprint):
                item.status = "accepted"
                record_host_key(use_path, node, item.key)
            else:
                item.status = "refused"
                failures.append(f"{node.mgmt_ip}: host key {item.fingerprint} not trusted: nothing was recorded")
            keys.append(item)
        if not use_path.exists():  # nothing pinned: connect with an empty file, create none for the user
            use_path.touch()
        data = inv.model_dump()
        data["cluster"]["known_hosts"] = str(use_path)
        yield Inventory.model_validate(data), keys, failures


def read_password_file(path: str) -> str:
    """A password for day zero from a file only its owner can read (never from a command line)."""
    p = Path(path).expanduser()
    try:
        mode = p.stat().st_mode & 0o077
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(
            Problem(str(p), "--password-file", f"cannot read it: {exc.strerror}", "check the path")
        ) from None
    if mode:
        raise ConfigError(Problem(str(p), "--password-file", "is readable by others", f"chmod 600 {p}"))
    return text.rstrip("\n")
