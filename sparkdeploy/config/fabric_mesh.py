"""A direct mesh or ring of Sparks: which ConnectX-7 port of which node is cabled to which peer, and the
point-to-point subnet each cable gets. Pure (plain names in, cables and problem lines out): the inventory
validates with it, the netplan rendering and `setup network`'s verification read its cables.

A Spark has two CX7 ports, so a full mesh (every pair cabled) of N nodes needs N-1 ports per node: three
nodes. Four or more are wired as a ring (each node cabled to its two neighbours; non-neighbours have no cable).
Every cable gets its own /30 from cluster.mesh_subnet, in a fixed order: the cables sorted by the inventory
positions of their two ends; cable k is the k-th /30, the end earlier in the inventory gets .1, the other .2.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from sparkdeploy.errors import Invalid

LAYOUTS = ("mesh", "ring")
CABLE_PREFIX = 30
DEFAULT_SUBNET = "192.168.200.0/24"
PORTS_PER_SPARK = 2


@dataclass(frozen=True)
class End:
    node: str
    port: str
    address: str  # "ip/30"


@dataclass(frozen=True)
class Cable:
    index: int
    a: End  # the end earlier in the inventory
    b: End

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Interface(self.a.address).network

    def end(self, node: str) -> End | None:
        return self.a if self.a.node == node else self.b if self.b.node == node else None

    def other(self, node: str) -> End:
        return self.b if self.a.node == node else self.a


def cables(
    layout: str, order: list[str], links: dict[str, list[tuple[str, str]]], base: str
) -> tuple[list[Cable], list[Invalid]]:
    """order: the node names in inventory order; links: node -> [(port, peer)]. Returns the cables and the
    problems, one Invalid each (its field, what is wrong, the fix: the inventory's validator raises them)."""
    pos = {name: i for i, name in enumerate(order)}
    n = len(order)
    problems = _count_problems(layout, n)
    ends, listed = _ends(order, pos, links)
    problems += listed
    pairs, paired = _pairs(layout, pos, ends)
    problems += paired
    if layout == "mesh" and 3 <= n <= PORTS_PER_SPARK + 1:
        problems += _mesh_gaps(order, pos, ends)
    if layout == "ring" and n >= 3:
        problems += _ring_counts(order, pos, links)
        if not problems and not _one_cycle(order, pairs):
            problems.append(
                Invalid.at(
                    "nodes",
                    "the cables form more than one loop",
                    "one ring through every node (spark1 -> spark2 -> ... -> spark1)",
                )
            )
    if problems:
        return [], problems
    pairs.sort(key=lambda p: (pos[p[0]], pos[p[2]]))
    return _addressed(layout, pairs, base)


def _count_problems(layout: str, n: int) -> list[Invalid]:
    """Too few nodes for a mesh or ring, or too many for a full mesh of a Spark's ports."""
    problems: list[Invalid] = []
    if n < 3:
        problems.append(
            Invalid.at(
                "cluster.fabric",
                f"a {layout} links three or more nodes, this inventory has {n}",
                "two nodes are one direct cable (fabric: direct; both ports: list both in fabric_ifaces)",
            )
        )
    if layout == "mesh" and n > PORTS_PER_SPARK + 1:
        problems.append(
            Invalid.at(
                "cluster.fabric",
                f"a full mesh of {n} nodes needs {n - 1} ConnectX-7 ports per node and a Spark has {PORTS_PER_SPARK}",
                "cable them as a ring (fabric: ring, each node to its two neighbours) or through a switch "
                "(fabric: switch)",
            )
        )
    return problems


def _ends(
    order: list[str], pos: dict[str, int], links: dict[str, list[tuple[str, str]]]
) -> tuple[dict[tuple[str, str], list[str]], list[Invalid]]:
    """Each node's listed cables as (node, peer) -> its ports, in the order listed; a port listed twice, a cable
    to the node itself or to a node not in the inventory is a problem."""
    problems: list[Invalid] = []
    ends: dict[tuple[str, str], list[str]] = {}
    for node in order:
        i = pos[node]
        used: set[str] = set()
        for port, peer in links.get(node, []):
            field = f"nodes[{i}].links"
            if port in used:
                problems.append(
                    Invalid.at(
                        f"{field}",
                        f"port {port} of {node} is listed twice",
                        "one cable per port",
                    )
                )
                continue
            used.add(port)
            if peer == node:
                problems.append(
                    Invalid.at(
                        f"{field}",
                        f"{node}'s {port} goes to {node} itself",
                        "name the peer node",
                    )
                )
            elif peer not in pos:
                problems.append(
                    Invalid.at(
                        f"{field}",
                        f"{node}'s {port} goes to {peer}, not a node of this inventory",
                        f"one of {', '.join(order)}",
                    )
                )
            else:
                ends.setdefault((node, peer), []).append(port)
    return ends, problems


def _pairs(
    layout: str, pos: dict[str, int], ends: dict[tuple[str, str], list[str]]
) -> tuple[list[tuple[str, str, str, str]], list[Invalid]]:
    """The cables both ends list, as (a, a_port, b, b_port) with a earlier in the inventory; a cable one end
    lists alone, or two nodes cabled more than once, is a problem."""
    problems: list[Invalid] = []
    pairs: list[tuple[str, str, str, str]] = []
    for (node, peer), ports in ends.items():
        back = ends.get((peer, node), [])
        if pos[node] > pos[peer]:
            if not back:
                problems.append(_one_end(pos, node, peer, ports[0]))
            continue
        if not back:
            problems.append(_one_end(pos, node, peer, ports[0]))
        elif len(ports) != len(back) or len(ports) > 1:
            problems.append(
                Invalid.at(
                    f"nodes[{pos[node]}].links",
                    f"{node} and {peer} are cabled {max(len(ports), len(back))} times ({node} lists {len(ports)}, "
                    f"{peer} {len(back)})",
                    f"a {layout} has one cable per pair of neighbours; two cables between two nodes are fabric: direct",
                )
            )
        else:
            pairs.append((node, ports[0], peer, back[0]))
    return pairs, problems


def _mesh_gaps(order: list[str], pos: dict[str, int], ends: dict[tuple[str, str], list[str]]) -> list[Invalid]:
    """A full mesh's pairs of nodes with no cable between them."""
    problems: list[Invalid] = []
    for a in order:
        for b in order[pos[a] + 1 :]:
            if (a, b) not in ends and (b, a) not in ends:
                problems.append(
                    Invalid.at(
                        f"nodes[{pos[a]}].links",
                        f"{a} and {b} have no cable",
                        f"a full mesh cables every pair: add {{port: ..., peer: {b}}} to {a} "
                        f"and {{port: ..., peer: {a}}} to {b}",
                    )
                )
    return problems


def _ring_counts(order: list[str], pos: dict[str, int], links: dict[str, list[tuple[str, str]]]) -> list[Invalid]:
    """A ring's nodes that do not list exactly two cables."""
    problems: list[Invalid] = []
    for node in order:
        count = len(links.get(node, []))
        if count != 2:
            problems.append(
                Invalid.at(
                    f"nodes[{pos[node]}].links",
                    f"{node} lists {count} cables; in a ring every node has two (one per CX7 port, to its two "
                    "neighbours)",
                    "list both",
                )
            )
    return problems


def _addressed(layout: str, pairs: list[tuple[str, str, str, str]], base: str) -> tuple[list[Cable], list[Invalid]]:
    """The cables in order, each a /CABLE_PREFIX of the subnet `base` (a problem if it is not one, or too small)."""
    try:
        net = ipaddress.IPv4Network(base)
    except ValueError:
        return [], [
            Invalid.at(
                "cluster.mesh_subnet",
                f"{base!r} is not an IPv4 subnet",
                f"e.g. {DEFAULT_SUBNET}",
            )
        ]
    size = 2 ** (32 - CABLE_PREFIX)
    if len(pairs) * size > net.num_addresses:
        return [], [
            (
                Invalid.at(
                    "cluster.mesh_subnet",
                    f"{net} holds {net.num_addresses // size} cables of /{CABLE_PREFIX}, the {layout} has {len(pairs)}",
                    "a larger subnet, e.g. a /24",
                )
            )
        ]
    out = []
    for k, (a, ap, b, bp) in enumerate(pairs):
        start = int(net.network_address) + k * size
        out.append(
            Cable(
                k,
                End(a, ap, f"{ipaddress.IPv4Address(start + 1)}/{CABLE_PREFIX}"),
                End(b, bp, f"{ipaddress.IPv4Address(start + 2)}/{CABLE_PREFIX}"),
            )
        )
    return out, []


def _one_end(pos: dict[str, int], node: str, peer: str, port: str) -> Invalid:
    return Invalid.at(
        f"nodes[{pos[node]}].links",
        f"{node}'s {port} goes to {peer}, but {peer} lists no cable to {node}",
        f"add {{port: <{peer}'s port>, peer: {node}}} to {peer}'s links (both ends of every cable)",
    )


def _one_cycle(order: list[str], pairs: list[tuple[str, str, str, str]]) -> bool:
    nxt: dict[str, list[str]] = {n: [] for n in order}
    for a, _, b, _ in pairs:
        nxt[a].append(b)
        nxt[b].append(a)
    seen = {order[0]}
    stack = [order[0]]
    while stack:
        for m in nxt[stack.pop()]:
            if m not in seen:
                seen.add(m)
                stack.append(m)
    return len(seen) == len(order)
