"""The fabric's netplan file for each node, rendered from the inventory (templates/netplan-fabric.yaml.j2), and
the checks that refuse bad input before anything changes. Pure: the node facts come in as discover.DiscoveredNode.

Topologies: a direct cable (two nodes) or a switch (any number): every node's first fabric interface gets its
fabric_ip on the one subnet; a second fabric interface (a second cable, "both ports") gets the same host number
on the next subnet of the same size. Every fabric interface, and the port's twin name where the node has it
(enp1s0f1np1 / enP2p1s0f1np1: its RDMA device's MTU follows it), runs at MTU 9000. Where NetworkManager owns
the ports, netplan renders for it (renderer: NetworkManager). A direct mesh of three nodes or a ring of three
or more (cluster.fabric: mesh | ring): every cabled port gets its cable's own /30 (fabric_mesh.py), its twin
MTU 9000 only; fabric_ip goes on no port there (it is the nodes' meeting address, e.g. the management one).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from sparkdeploy.config.fabric_mesh import LAYOUTS
from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.dayzero.discover import DiscoveredNode
from sparkdeploy.dayzero.proposal import FABRIC_MTU
from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.topologies.render import render

TEMPLATE = "netplan-fabric.yaml.j2"
PATH = "/etc/netplan/40-sparkdeploy-fabric.yaml"
MARKER = "# Written by sparkdeploy setup network"


@dataclass(frozen=True)
class PortConfig:
    name: str
    address: str | None  # "ip/prefix", or None (the twin: MTU only)
    peer: str | None = None  # mesh/ring: the node at the cable's other end


def twin(name: str) -> str:
    """enp1s0f1np1 <-> enP2p1s0f1np1: the same port's name on the other PCIe half."""
    if name.startswith("enP2p"):
        return "en" + name[len("enP2") :]
    if name.startswith("enp"):
        return "enP2" + name[len("en") :]
    return ""


def port_addresses(inv: Inventory, node: Node) -> list[PortConfig]:
    if inv.fabric in LAYOUTS:
        out = []
        for cable in inv.cables:
            end = cable.end(node.name)
            if end is not None:
                out.append(PortConfig(end.port, end.address, cable.other(node.name).node))
        return out
    iface = ipaddress.ip_interface(node.fabric_ip)
    net = iface.network
    out = []
    for i, name in enumerate(node.fabric_ifaces):
        start = ipaddress.ip_address(int(net.network_address) + i * net.num_addresses)
        shifted = ipaddress.ip_network(f"{start}/{net.prefixlen}")
        host = int(iface.ip) - int(net.network_address)
        out.append(PortConfig(name, f"{shifted.network_address + host}/{net.prefixlen}"))
    return out


def ports_for(inv: Inventory, node: Node, facts: DiscoveredNode | None) -> list[PortConfig]:
    ports = port_addresses(inv, node)
    present = set(facts.addresses) if facts is not None else set()
    for p in list(ports):
        other = twin(p.name)
        if other and other in present and other not in {q.name for q in ports}:
            ports.append(PortConfig(other, None))
    return ports


def render_node(inv: Inventory, node: Node, facts: DiscoveredNode | None, renderer: str | None = None) -> str:
    return render(
        TEMPLATE,
        node=node.name,
        cluster=inv.cluster.name,
        topology=inv.fabric,
        renderer=renderer,
        ports=ports_for(inv, node, facts),
        mtu=FABRIC_MTU,
    )


def problems(inv: Inventory, facts: dict[str, DiscoveredNode]) -> list[Problem]:
    """Bad input, one line each: an interface the node does not have (or its management one), a subnet that
    overlaps another network of a node, an address some node already holds, an MTU the port refuses."""
    out: list[Problem] = []
    for i, node in enumerate(inv.nodes):
        f = facts.get(node.name)
        if f is None:
            continue
        out += _interface_problems(inv.source, i, node, f)
        out += _address_problems(inv, i, node, facts)
    seen: set[str] = set()
    unique = []
    for p in out:
        if str(p) not in seen:
            seen.add(str(p))
            unique.append(p)
    return unique


def _interface_problems(src: str, i: int, node: Node, f: DiscoveredNode) -> list[Problem]:
    """Each of the node's fabric_ifaces: one it lacks, its management interface, or a port whose MTU is too small."""
    out: list[Problem] = []
    field = f"nodes[{i}].fabric_ifaces"
    for name in node.fabric_ifaces:
        if name not in f.addresses:
            have = ", ".join(sorted(n for n in f.addresses if n.startswith("en"))) or "none"
            out.append(
                Problem(
                    src,
                    field,
                    f"{name} is not an interface of {node.name} (its en* interfaces: {have})",
                    "write the name `ip -br link` shows on the node (or run sparkdeploy init again)",
                )
            )
        elif name == f.mgmt_iface:
            out.append(
                Problem(
                    src,
                    field,
                    f"{name} carries {node.name}'s management address {node.mgmt_ip}",
                    "name the ConnectX-7 port, never the management interface",
                )
            )
        else:
            top = f.max_mtu.get(name)
            if top is not None and top < FABRIC_MTU:
                out.append(
                    Problem(
                        src,
                        field,
                        f"{name} on {node.name} takes at most MTU {top}, not {FABRIC_MTU}",
                        "is it a ConnectX-7 port? (`ip -d link show` on the node shows max_mtu)",
                    )
                )
    return out


def _address_problems(inv: Inventory, i: int, node: Node, facts: dict[str, DiscoveredNode]) -> list[Problem]:
    """Each address the node's ports would take: one some node already holds, or a subnet overlapping another
    network of a node (its own fabric ports aside)."""
    out: list[Problem] = []
    where = "cluster.mesh_subnet" if inv.fabric in LAYOUTS else f"nodes[{i}].fabric_ip"
    for j, port in enumerate(port_addresses(inv, node)):
        if port.address is None:
            continue
        mine = ipaddress.ip_interface(port.address)
        for other in inv.nodes:
            of = facts.get(other.name)
            if of is None:
                continue
            for ifname, addrs in of.addresses.items():
                if other.name == node.name and ifname == port.name:
                    continue  # its own address already there: nothing changes
                for a in addrs:
                    held = ipaddress.ip_interface(a)
                    if held.ip == mine.ip:
                        out.append(
                            Problem(
                                inv.source,
                                where,
                                f"{mine.ip} is already in use on {other.name} ({ifname})",
                                "choose a free address on the fabric subnet",
                            )
                        )
                    elif held.network.overlaps(mine.network) and ifname not in _fabric_names(inv, other):
                        out.append(
                            Problem(
                                inv.source,
                                where + (f" (port {j + 1})" if j else ""),
                                f"{mine.network} overlaps {held.network} of {other.name}'s {ifname}",
                                "choose a fabric subnet no other network of the nodes uses",
                            )
                        )
    return out


def _fabric_names(inv: Inventory, node: Node) -> set[str]:
    return {n for name in node.fabric_ifaces for n in (name, twin(name)) if n}


def check(inv: Inventory, facts: dict[str, DiscoveredNode]) -> None:
    found = problems(inv, facts)
    if found:
        raise ConfigError(found)
