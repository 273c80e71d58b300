"""What `init` reads on a new node, through the one fact layer (sparkdeploy/facts/, set DAYZERO, one round trip).

The node's GPU (nvidia-smi), its machine-id and hostname, every interface with its addresses, MTU and state
(`ip -j addr`) and its largest MTU, the RDMA devices and the network interface each belongs to
(/sys/class/infiniband/*/device/net, else `rdma -j link`), the link speed of each en* port (ethtool) and the
GID table (show_gids, else sysfs): each declared once in facts/catalog.py. This module only turns them into
the day-zero view: a DGX Spark's ConnectX-7 shows each physical port twice, once per PCIe half (enp1s0f1np1
and enP2p1s0f1np1, RDMA devices rocep1s0f1 and roceP2p1s0f1): the two names are grouped into one Port here.

The facts are read over a NodeConnection like every other reader's: `init` reads only after the host key was
shown and pinned (or, with --dry-run, accepted into a temporary known_hosts), and a node that takes only a
password yet is read over a connection that logs in with it (NodeConnection.password).

In the lab the GPU, the RDMA devices and the link speed come from stand-ins that say SIMULATED; a node's
facts list what was simulated, and `init` prints it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sparkdeploy import facts as node_facts
from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.facts.parsers import rocev2_gid_index
from sparkdeploy.runtime.remote import NodeConnection

TIMEOUT_S = 60
GB10 = "GB10"

# en[P<domain>]p<bus>s<slot>f<function>[np<port>]: the PCI domain is what differs between a port's two names.
PORT_NAME = re.compile(r"en(?:P(?P<domain>\d+))?(?P<key>p\d+s\d+f\d+)(?:np\d+)?")
HCA_NAME = re.compile(r"roce(?:P(?P<domain>\d+))?(?P<key>p\d+s\d+f\d+)")


@dataclass
class Port:
    """One physical ConnectX-7 port: its interface names and RDMA devices (domain 0's first)."""

    key: str  # the PCI bus/slot/function both names share, e.g. p1s0f1
    names: list[str] = field(default_factory=list)
    hcas: list[str] = field(default_factory=list)
    up: bool = False
    speed_mbps: int | None = None
    mtu: int | None = None
    addresses: list[str] = field(default_factory=list)  # IPv4 "ip/prefix" on any of its names
    address_iface: str = ""  # the name that holds the first address
    gid_index: int | None = None  # RoCE v2 GID of its first IPv4 address on its first HCA

    @property
    def name(self) -> str:
        return self.names[0]

    def to_json(self) -> dict[str, Any]:
        return {
            "port": self.key,
            "names": self.names,
            "hcas": self.hcas,
            "up": self.up,
            "speed_mbps": self.speed_mbps,
            "mtu": self.mtu,
            "addresses": self.addresses,
            "gid_index": self.gid_index,
        }


@dataclass
class DiscoveredNode:
    """A new node as `init` sees it: what the facts layer read (facts.NodeFacts, set DAYZERO), its ports grouped."""

    host: str  # the management address we connected to
    host_key: str = ""  # its SSH host key fingerprint
    hostname: str = ""
    machine_id: str = ""
    gpus: list[str] = field(default_factory=list)
    gpu_error: str = ""
    driver: str = ""
    ports: list[Port] = field(default_factory=list)
    mgmt_iface: str = ""  # the interface holding `host`
    addresses: dict[str, list[str]] = field(default_factory=dict)  # every interface's IPv4 "ip/prefix"
    simulated: list[str] = field(default_factory=list)  # gpu, rdma, link-speed: stand-ins answered
    max_mtu: dict[str, int] = field(default_factory=dict)  # the largest MTU each interface takes

    @property
    def gb10(self) -> bool:
        return any(GB10 in g for g in self.gpus)

    @property
    def up_ports(self) -> list[Port]:
        return [p for p in self.ports if p.up]

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "host_key": self.host_key,
            "hostname": self.hostname,
            "machine_id": self.machine_id,
            "gpus": self.gpus,
            "gpu_error": self.gpu_error,
            "driver": self.driver,
            "mgmt_iface": self.mgmt_iface,
            "ports": [p.to_json() for p in self.ports],
            "simulated": self.simulated,
        }


def _port_key(name: str) -> tuple[str, int] | None:
    m = PORT_NAME.fullmatch(name)
    return (m.group("key"), int(m.group("domain") or 0)) if m else None


def _hca_order(hca: str) -> tuple[int, str]:
    m = HCA_NAME.fullmatch(hca)
    return (int(m.group("domain") or 0) if m else 0, hca)


def from_facts(host: str, facts: node_facts.NodeFacts, host_key: str = "") -> DiscoveredNode:
    """The facts layer's NodeFacts (set DAYZERO) -> the day-zero view. Pure: tested on real and stand-in output."""
    f = DiscoveredNode(host=host, host_key=host_key, machine_id=facts.machine_id, hostname=facts.hostname)
    gpu = facts.gpu
    if gpu is None or gpu.rc != 0:
        f.gpu_error = "nvidia-smi not found" if gpu and gpu.rc == 127 else (gpu.error if gpu else "")
        f.gpu_error = f.gpu_error.splitlines()[-1] if f.gpu_error else "nvidia-smi failed"
    else:
        for row in gpu.gpus:
            if row.get("name"):
                f.gpus.append(str(row["name"]))
                f.driver = row.get("driver_version") or ""
        if gpu.simulated:
            f.simulated.append("gpu")
    network = facts.network or node_facts.NetworkFact()
    links = network.links
    for ifname, link in links.items():
        v4 = [a for a in link.addresses if ":" not in a]
        f.addresses[ifname] = v4
        if any(a.split("/")[0] == host for a in v4):
            f.mgmt_iface = ifname
    f.max_mtu = dict(facts.max_mtu)
    hca_net = facts.rdma_netdevs
    if facts.rdma_netdevs_simulated:
        f.simulated.append("rdma")
    # A CX7 port: an interface some RDMA device belongs to, and its twin (same bus/slot/function, other domain).
    rdma_keys = {k[0] for k in map(_port_key, hca_net.values()) if k}
    names: dict[str, list[tuple[int, str]]] = {}
    for ifname in sorted(set(links) | set(hca_net.values())):
        found = _port_key(ifname)
        if found is not None and (ifname in hca_net.values() or found[0] in rdma_keys):
            names.setdefault(found[0], []).append((found[1], ifname))
    ports: dict[str, Port] = {}
    gids = facts.rdma.gids if facts.rdma else []
    for pci in sorted(names):
        port = ports.setdefault(pci, Port(pci))
        port.names = [n for _, n in sorted(names[pci])]
        port.hcas = sorted((h for h, n in hca_net.items() if n in port.names), key=_hca_order)
        for ifname in port.names:
            if ifname not in links:
                continue
            link = links[ifname]
            port.up = port.up or link.up
            port.mtu = port.mtu or link.mtu
            v4 = [a for a in link.addresses if ":" not in a and a not in port.addresses]
            if v4 and not port.addresses:
                port.address_iface = ifname
            port.addresses += v4
            speed = network.speeds.get(ifname)
            if speed and (port.speed_mbps is None or speed > port.speed_mbps):
                port.speed_mbps = speed
            if ifname in network.simulated_ifaces and "link-speed" not in f.simulated:
                f.simulated.append("link-speed")
        if port.addresses and port.hcas:
            port.gid_index = rocev2_gid_index(gids, port.hcas[0], port.addresses[0].split("/")[0])
    f.ports = list(ports.values())
    return f


def read(conn: NodeConnection, host_key: str = "") -> DiscoveredNode:
    """One node's day-zero view, read in one round trip over `conn` (key or password login alike)."""
    args = node_facts.FactArgs(fabric_ifaces=(node_facts.EVERY_PORT,))
    return from_facts(conn.node.mgmt_ip, node_facts.gather(conn, "dayzero", args, timeout=TIMEOUT_S), host_key)


def read_node(node: Node, inv: Inventory, key_fp: str, password: str | None) -> DiscoveredNode:
    """Connect (host key verified by the inventory's known_hosts; `password` where the key is not taken yet)
    and read the node's day-zero view."""
    with NodeConnection(node, inv) as conn:
        conn.password = password
        return read(conn, key_fp)
