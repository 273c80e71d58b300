"""From the facts of every node to a proposed inventory and one line per problem. Pure: no I/O.

Problems that stop `init` (nothing is written): no GB10 GPU, no ConnectX-7 port (or, with several nodes, none
up), two hosts that are one machine (same machine-id or the same SSH host key), a host reached over its own
ConnectX-7 link instead of its management address, fabric addresses already on different subnets. Warnings
(written, said once): the cable in different ports on the two ends (each node's own interface names go in the
inventory, so it works), a port slower than a CX7's 200 Gb/s, an MTU below 9000 (`setup network` sets it).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Literal

from sparkdeploy import names
from sparkdeploy.dayzero.discover import DiscoveredNode, Port
from sparkdeploy.errors import ConfigError, Problem, escape_controls

# Proposed when the link has no addresses: the first of these no node uses on any interface.
FABRIC_SUBNETS = ("192.168.100.0/24", "192.168.101.0/24", "10.100.0.0/24", "10.101.0.0/24")
FIRST_HOST = 10  # the first node gets .10, the next .11, ...
CX7_SPEED_MBPS = 200_000
FABRIC_MTU = 9000


@dataclass(frozen=True)
class Finding:
    host: str
    severity: Literal["error", "warning"]
    message: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.host}: {self.message}"
        return f"{text} (fix: {self.fix})" if self.fix else text

    def to_json(self) -> dict[str, str]:
        return {"host": self.host, "severity": self.severity, "message": self.message, "fix": self.fix}


@dataclass
class NodeDraft:
    facts: DiscoveredNode
    name: str
    ports: list[Port]  # the fabric ports chosen: the ones up, else the first one
    fabric_ip: str = ""
    proposed: bool = False  # fabric_ip is a proposal: the link has no address yet


@dataclass
class InitPlan:
    drafts: list[NodeDraft]
    findings: list[Finding] = field(default_factory=list)
    subnet: str = ""

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]


def _names(facts: list[DiscoveredNode]) -> list[str]:
    """The hostnames when each is a valid, unique label; spark1, spark2, ... otherwise."""
    hostnames = [f.hostname for f in facts]
    if all(h and names.error("node", h) is None for h in hostnames) and len(set(hostnames)) == len(hostnames):
        return hostnames
    return [f"spark{i + 1}" for i in range(len(facts))]


def _same_machine(facts: list[DiscoveredNode]) -> list[Finding]:
    out = []
    for i, a in enumerate(facts):
        for b in facts[:i]:
            why = ""
            if a.machine_id and a.machine_id == b.machine_id:
                why = f"the same machine-id ({a.machine_id[:12]}...)"
            elif a.host_key and a.host_key == b.host_key:
                why = f"the same SSH host key ({a.host_key})"
            if why:
                out.append(
                    Finding(
                        a.host,
                        "error",
                        f"is the same machine as {b.host}: {why}",
                        "give each Spark once, by its management address",
                    )
                )
    return out


def _node_findings(f: DiscoveredNode, many: bool) -> list[Finding]:
    out = []
    sim = " (SIMULATED)" if "gpu" in f.simulated else ""
    if not f.gb10:
        seen = ", ".join(f.gpus) if f.gpus else (f.gpu_error or "no GPU")
        out.append(
            Finding(
                f.host,
                "error",
                f"no GB10 GPU{sim}: nvidia-smi says {seen}",
                "is this a DGX Spark? check the address, and `nvidia-smi` on its console",
            )
        )
    if not f.ports:
        out.append(
            Finding(
                f.host,
                "error",
                "no ConnectX-7 port: no RDMA device with a network interface",
                "check `ls /sys/class/infiniband/*/device/net` on the node (a DGX Spark has four)",
            )
        )
    elif many and not f.up_ports:
        out.append(
            Finding(
                f.host,
                "error",
                "no ConnectX-7 port is up: " + ", ".join(f"{'/'.join(p.names)} down" for p in f.ports),
                "plug the QSFP cable into the same port on both Sparks (the one nearer the edge), then run init again",
            )
        )
    if f.mgmt_iface and any(f.mgmt_iface in p.names for p in f.ports):
        out.append(
            Finding(
                f.host,
                "error",
                f"is an address of the ConnectX-7 port {f.mgmt_iface}, not of the management network",
                "give the address of the node's 10 GbE or Wi-Fi interface (`ip -br addr` on the node)",
            )
        )
    for p in f.up_ports:
        if p.speed_mbps is not None and p.speed_mbps < CX7_SPEED_MBPS:
            out.append(
                Finding(
                    f.host,
                    "warning",
                    f"{p.name} links at {p.speed_mbps // 1000} Gb/s, not {CX7_SPEED_MBPS // 1000}",
                    "check the cable (QSFP112 DAC) and reseat it",
                )
            )
    return out


def _cable_findings(drafts: list[NodeDraft]) -> list[Finding]:
    if len(drafts) != 2 or not all(d.facts.up_ports for d in drafts):
        return []
    a, b = drafts
    ka, kb = {p.key for p in a.facts.up_ports}, {p.key for p in b.facts.up_ports}
    if ka == kb:
        return []
    return [
        Finding(
            b.facts.host,
            "warning",
            f"the cable is in different ports on the two ends: {a.name} uses {', '.join(p.name for p in a.ports)}, "
            f"{b.name} {', '.join(p.name for p in b.ports)}; the inventory names each node's own",
            "nothing to do; for identical nodes move the cable to the same port on both",
        )
    ]


def _used_networks(facts: list[DiscoveredNode], skip: set[str]) -> list[ipaddress.IPv4Interface]:
    used = []
    for f in facts:
        for ifname, addrs in f.addresses.items():
            if ifname in skip:
                continue
            for a in addrs:
                try:
                    used.append(ipaddress.IPv4Interface(a))
                except ValueError:
                    continue
    return used


def subnet_problems(subnet: str, nodes: int) -> list[Problem]:
    """--fabric-subnet before anything connects: an IPv4 subnet (host bits are dropped) that is no loopback,
    link-local, multicast or reserved range and holds an address for every node from .FIRST_HOST on."""
    fix = "e.g. --fabric-subnet 192.168.100.0/24"
    try:
        net = ipaddress.ip_network(subnet.strip(), strict=False)
    except ValueError:
        return [Problem("init", "--fabric-subnet", f"{escape_controls(repr(subnet[:80]))} is not a subnet (CIDR)", fix)]
    if net.version != 4:
        return [Problem("init", "--fabric-subnet", f"{net} is IPv6: the fabric link takes an IPv4 subnet", fix)]
    for what, bad in (
        ("a loopback", net.is_loopback),
        ("a link-local", net.is_link_local),
        ("a multicast", net.is_multicast),
        ("a reserved", net.is_reserved or net.network_address.is_unspecified),
    ):
        if bad:
            return [Problem("init", "--fabric-subnet", f"{net} is {what} range, not a link's subnet", fix)]
    if net.num_addresses - 2 < FIRST_HOST + nodes - 1:
        return [
            Problem(
                "init",
                "--fabric-subnet",
                f"{net} holds no address for {nodes} node(s) from .{FIRST_HOST} on",
                "use a /24, e.g. 192.168.100.0/24",
            )
        ]
    return []


def _fabric_addresses(drafts: list[NodeDraft], subnet: str | None) -> tuple[str, list[Finding]]:
    """Keep the addresses the links have (one subnet), propose the rest from `subnet` or a free default."""
    fabric_names = {n for d in drafts for p in d.ports for n in p.names}
    existing: dict[str, ipaddress.IPv4Interface] = {}
    for d in drafts:
        for p in d.ports:
            for a in p.addresses:
                existing.setdefault(d.facts.host, ipaddress.IPv4Interface(a))
    others = _used_networks([d.facts for d in drafts], fabric_names)
    nets = {str(i.network) for i in existing.values()}
    if len(nets) > 1:
        return "", [
            Finding(
                d.facts.host,
                "error",
                f"the fabric link already has {existing[d.facts.host]}, and the nodes' addresses are on "
                f"different subnets ({', '.join(sorted(nets))})",
                "put them on one subnet, or let `sparkdeploy setup network --replace` do it",
            )
            for d in drafts
            if d.facts.host in existing
        ][:1]
    if nets:
        net = ipaddress.IPv4Network(nets.pop())
        if subnet and ipaddress.IPv4Network(subnet, strict=False) != net:
            raise ConfigError(
                Problem(
                    "init",
                    "--fabric-subnet",
                    f"the fabric link already has addresses on {net}, not {subnet}",
                    f"drop --fabric-subnet (or pass {net})",
                )
            )
    elif subnet:
        net = ipaddress.IPv4Network(subnet, strict=False)
        clash = [o for o in others if o.network.overlaps(net)]
        if clash:
            raise ConfigError(
                Problem(
                    "init",
                    "--fabric-subnet",
                    f"{net} overlaps {clash[0]}, an address the nodes use on another network",
                    "choose a subnet no node uses, e.g. 192.168.100.0/24",
                )
            )
    else:
        free = [s for s in FABRIC_SUBNETS if not any(o.network.overlaps(ipaddress.IPv4Network(s)) for o in others)]
        net = ipaddress.IPv4Network(free[0] if free else FABRIC_SUBNETS[0])
    taken = {i.ip for i in existing.values()} | {o.ip for o in others}
    hosts = (h for h in net.hosts() if int(h) - int(net.network_address) >= FIRST_HOST and h not in taken)
    for d in drafts:
        if d.facts.host in existing:
            d.fabric_ip = str(existing[d.facts.host])
        else:
            ip = next(hosts, None)
            if ip is None:
                raise ConfigError(Problem("init", "--fabric-subnet", f"{net} has no free address left", "use a /24"))
            d.fabric_ip, d.proposed = f"{ip}/{net.prefixlen}", True
    return str(net), []


def plan(facts: list[DiscoveredNode], fabric_subnet: str | None = None) -> InitPlan:
    many = len(facts) > 1
    drafts = []
    for f, name in zip(facts, _names(facts), strict=True):
        drafts.append(NodeDraft(f, name, f.up_ports or f.ports[:1]))
    result = InitPlan(drafts)
    for f in facts:
        result.findings += _node_findings(f, many)
    result.findings += _same_machine(facts)
    result.findings += _cable_findings(drafts)
    if all(d.ports for d in drafts):
        result.subnet, problems = _fabric_addresses(drafts, fabric_subnet)
        result.findings += problems
    return result


def inventory_data(result: InitPlan, user: str | None, key: str | None, known_hosts: str) -> dict[str, Any]:
    """The inventory as data (the schema of docs/CONVENTIONS.md); the first node is the head."""
    nodes = []
    for i, d in enumerate(result.drafts):
        ifaces = [p.address_iface or p.name for p in d.ports]
        ssh: dict[str, object] = {"port": 22}
        if user:
            ssh["user"] = user
        if key:
            ssh["key"] = key
        node: dict[str, object] = {
            "name": d.name,
            "role": "head" if i == 0 else "worker",
            "mgmt_ip": d.facts.host,
            "fabric_ip": d.fabric_ip,
            "fabric_ifaces": ifaces,
            "hcas": [h for p in d.ports for h in p.hcas],
        }
        gid = d.ports[0].gid_index if d.ports and not d.proposed else None
        if gid is not None:
            node["gid_index"] = gid
        node["ssh"] = ssh
        nodes.append(node)
    return {"cluster": {"name": "sparks", "known_hosts": known_hosts}, "nodes": nodes}


# What `init` reads from a node: on a re-run, the new reading replaces the file's (everything else is the owner's).
DISCOVERED = ("fabric_ifaces", "hcas", "gid_index")


def merge(old: dict[str, Any], new: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The inventory `init` proposes (`new`) merged into the one the owner has (`old`): the owner's values win
    (cluster settings, names, addresses, ssh, other keys), the nodes' new readings (DISCOVERED) replace the old,
    the order and roles follow --hosts (the first is the head), what only `new` has is added. Returns the merged
    data and one line per value the merge drops or replaces."""
    changes: list[str] = []
    cluster = {**new.get("cluster", {}), **(old.get("cluster") or {})}
    olds = {str(n.get("mgmt_ip")): n for n in old.get("nodes") or [] if isinstance(n, dict)}
    nodes = []
    for n in new["nodes"]:
        o = olds.pop(str(n["mgmt_ip"]), None)
        if o is None:
            nodes.append(n)
            continue
        m = {**n, **o, "role": n["role"]}
        if o.get("role") not in (None, n["role"]):
            changes.append(f"{m.get('name')}.role: {o.get('role')} -> {n['role']} (the first of --hosts is the head)")
        for key in DISCOVERED:
            if key in n and o.get(key) != n[key]:
                changes.append(f"{m.get('name')}.{key}: {o.get(key)!r} -> {n[key]!r} (read from the node now)")
                m[key] = n[key]
        if isinstance(o.get("ssh"), dict):
            m["ssh"] = {**(n.get("ssh") or {}), **o["ssh"]}
        nodes.append(m)
    for ip, o in olds.items():
        changes.append(f"node {o.get('name', ip)} ({ip}) is dropped: not in --hosts")
    return {**old, "cluster": cluster, "nodes": nodes}, changes
