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

import dataclasses
import ipaddress
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import paramiko
from pydantic import ValidationError

from sparkdeploy import paths
from sparkdeploy.config.inventory import Inventory, parse_ip
from sparkdeploy.config.schema import problems_from_validation
from sparkdeploy.config.userfile import present_file_problems, read_text
from sparkdeploy.errors import ConfigError, Invalid, Problem, StepFailed, has_controls
from sparkdeploy.runtime.remote import (
    connect_problem,
    fingerprint,
    known_hosts_name,
    load_host_keys,
    on_nodes,
    record_host_key,
    scan_host_key,
)

# (host, key type, SHA256 fingerprint) -> trust it?
Confirm = Callable[[str, str, str], bool]
PLACEHOLDER_NET = "198.51.100.0/24"  # TEST-NET-2: the fabric of the probe inventory, never used to connect


def default_known_hosts() -> Path:
    """sparkdeploy's own known_hosts (the inventory `init` writes points at it)."""
    return paths.state_dir() / "known_hosts"


def parse_hosts(text: str) -> list[str]:
    """--hosts IP[,IP...]: IP addresses (no names), each once. One line per bad entry."""
    hosts: list[str] = []
    problems: list[Problem] = []
    for raw in [h.strip() for h in text.split(",")]:
        if not raw:
            continue
        try:
            ip = str(parse_ip(raw, "--hosts"))
        except Invalid as exc:
            problems.append(Problem("init", "--hosts", exc.message, exc.fix))
            continue
        if ip in hosts:
            problems.append(Problem("init", "--hosts", f"{ip} is given twice", "give each node once"))
        hosts.append(ip)
    if not hosts and not problems:
        problems.append(Problem("init", "--hosts", "no address given", "e.g. --hosts 192.168.1.101,192.168.1.102"))
    if len(hosts) > 1:  # the nodes reach each other at these addresses (as Inventory checks)
        problems += [
            Problem(
                "init",
                "--hosts",
                f"{ip} is a loopback address: the other nodes cannot reach it",
                "give each node's management address, as `ip -br addr` on the node shows it",
            )
            for ip in hosts
            if ipaddress.ip_address(ip).is_loopback
        ]
    if problems:
        raise ConfigError(problems)
    return hosts


def probe_inventory(
    hosts: list[str], user: str | None, key: str | None, known_hosts: Path, port: int = 22
) -> Inventory:
    """An inventory of the hosts as they are before `init`: only what connecting needs is real."""
    net = list(paths_hosts(len(hosts)))
    nodes = [
        {
            "name": f"host{i + 1}",
            "role": "head" if i == 0 else "worker",
            "mgmt_ip": h,
            "fabric_ip": net[i],
            "fabric_ifaces": ["unknown"],
            "ssh": {"user": user, "port": port, "key": key},
        }
        for i, h in enumerate(hosts)
    ]
    data = {"cluster": {"known_hosts": str(known_hosts)}, "nodes": nodes}
    try:
        return Inventory.model_validate(data)
    except ValidationError as exc:  # the options were checked first (init.check_options): one line each anyway
        raise ConfigError(problems_from_validation(exc, "init", Inventory)) from None


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
    entry = load_host_keys(path).lookup(name)
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
        use_path = Path(tmp) / "known_hosts"  # pinned into known_hosts only once init writes the inventory
        if known_hosts.is_file():
            use_path.write_text(read_text(known_hosts, "known_hosts file"))
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


MAX_PASSWORD_BYTES = 4096


def read_password_file(path: str) -> str:
    """A password for day zero from a file only its owner can read (never from a command line), through the one
    door: the mode is checked on the open file before a byte is read; a regular UTF-8 file of one line."""
    p = Path(path).expanduser()
    try:
        text = read_text(p, "password file", "pass a file holding the password", limit=MAX_PASSWORD_BYTES, private=True)
    except ConfigError as exc:
        raise ConfigError([dataclasses.replace(q, field="--password-file") for q in exc.problems]) from None
    password = text.rstrip("\n")
    if not password or has_controls(password):
        raise ConfigError(
            Problem(str(p), "--password-file", "is not one line of printable text", "write the password on one line")
        )
    return password


def key_file_problems(path: str, command: str, option: str) -> list[Problem]:
    """--key / --login-key: a private key that may not exist yet (`setup ssh` creates one); if it does, it passes
    the one door now (never /dev/zero, a folder or a non-UTF-8 file handed to ssh later)."""
    return present_file_problems(path, "private key", command, option)
