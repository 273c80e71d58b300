"""The inventory: which nodes exist, by IP address only, and cluster-wide settings.

Addresses are IPs because mDNS (`*.local`) names crash clients under load and do not resolve inside
containers, and because a hostname that resolves differently on each node is the classic cross-node hang.
Everything is validated on load, before anything connects anywhere.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sparkdeploy import names, paths
from sparkdeploy.config import fabric_mesh
from sparkdeploy.config.guard_settings import GuardSettings
from sparkdeploy.config.schema import Whole, problems_from_validation
from sparkdeploy.config.userfile import load_yaml_file, present_file_problems
from sparkdeploy.errors import ConfigError, Invalid, Invalids, Problem
from sparkdeploy.names import ClusterName, HcaName, InterfaceName, NodeName, UserName


def _not_an_ip(value: str, field: str) -> Invalid:
    text = str(value)
    if text.lower().rstrip(".").endswith(".local"):
        return Invalid(
            f"{text!r} is an mDNS name: mDNS lookups crash clients at high concurrency and do not resolve "
            "inside containers",
            f"write the node's IP address in {field}",
        )
    return Invalid(
        f"{text!r} is not an IP address (hostnames are not accepted)",
        "write the IP address",
    )


def parse_ip(value: str, field: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """A node's own address: an IP (never a hostname) that another machine can send to, i.e. unicast."""
    try:
        addr = ipaddress.ip_address(str(value))
    except ValueError:
        raise _not_an_ip(value, field) from None
    what = _not_unicast(addr)
    if what:
        raise Invalid(
            f"{addr} is {what}, not one machine's address",
            f"write the node's own IP address in {field}, as `ip -br addr` on the node shows it",
        )
    return addr


def _not_unicast(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """Why no machine could be reached at `addr` ("" if it is a unicast address). Loopback is a node's own
    address, so it is refused only where other nodes must reach it (Inventory._consistent)."""
    if addr.is_unspecified:
        return 'the unspecified address ("any address" when listening)'
    if addr.is_multicast:
        return "a multicast address"
    if addr == ipaddress.IPv4Address("255.255.255.255"):
        return "the broadcast address"
    if addr.version == 4 and addr.is_reserved:
        return "in the reserved range 240.0.0.0/4"
    return ""


def _one_line(value: str | None) -> str | None:
    """Values pasted into rendered scripts, paths and messages: a newline or control character would break a
    script line or forge an output line."""
    return None if value is None else names.one_line(value)


class SSHSettings(BaseModel):
    """Left unset, user, port and key come from ~/.ssh/config and the SSH agent, as with ssh(1)."""

    model_config = ConfigDict(extra="forbid")

    user: UserName | None = None  # in ssh's login and the fixes we print (sudo chown USER:)
    port: Whole | None = Field(default=None, ge=1, le=65535)
    key: str | None = Field(default=None, max_length=1024)

    @field_validator("key")
    @classmethod
    def _key(cls, v: str | None) -> str | None:
        return _one_line(v)


class Link(BaseModel):
    """One cable of a direct mesh or ring (cluster.fabric: mesh | ring): this node's port and the node at the
    other end. The cable's /30 comes from cluster.mesh_subnet (fabric_mesh.py)."""

    model_config = ConfigDict(extra="forbid")

    port: InterfaceName
    peer: NodeName


class Node(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: NodeName
    role: Literal["head", "worker"] = "worker"
    mgmt_ip: str
    fabric_ip: str
    fabric_ifaces: list[InterfaceName] = Field(min_length=1)
    hcas: list[HcaName] = Field(default_factory=list)
    gid_index: Whole | None = Field(default=None, ge=0, description="RoCEv2 GID index of fabric_ip (show_gids)")
    ssh: SSHSettings = Field(default_factory=SSHSettings)
    links: list[Link] = Field(default_factory=list)  # mesh/ring only: which port goes to which peer
    # mesh/ring only: the interface holding fabric_ip (the management one), for the socket settings of Ray,
    # gloo and NCCL's bootstrap; NCCL's bulk goes over the cables' RDMA devices (hcas).
    socket_iface: InterfaceName | None = None

    @field_validator("mgmt_ip")
    @classmethod
    def _mgmt(cls, v: str) -> str:
        return str(parse_ip(v, "mgmt_ip"))

    @field_validator("fabric_ip")
    @classmethod
    def _fabric(cls, v: str) -> str:
        text = str(v)
        if "/" not in text:
            parse_ip(text, "fabric_ip")
            raise Invalid(
                f"{text!r} has no prefix length",
                f"write it with its prefix, e.g. {text}/24",
            )
        addr, _, _prefix = text.partition("/")
        parse_ip(addr, "fabric_ip")
        try:
            iface = ipaddress.ip_interface(text)
        except ValueError:
            raise Invalid(
                f"{text!r} is not an address with a prefix length",
                "e.g. 192.168.100.10/24",
            ) from None
        net = iface.network
        if iface.version == 4 and net.prefixlen <= 30 and iface.ip in (net.network_address, net.broadcast_address):
            which = "network" if iface.ip == net.network_address else "broadcast"
            raise Invalid(
                f"{iface.ip} is the {which} address of {net}, not one machine's address",
                f"write the node's own address on the link, e.g. {net[1]}/{net.prefixlen}",
            )
        return str(iface)

    @property
    def url_host(self) -> str:
        """mgmt_ip as it goes into a URL: an IPv6 address in brackets."""
        return f"[{self.mgmt_ip}]" if ":" in self.mgmt_ip else self.mgmt_ip

    @property
    def fabric_address(self) -> str:
        return str(ipaddress.ip_interface(self.fabric_ip).ip)

    @property
    def fabric_network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        return ipaddress.ip_interface(self.fabric_ip).network


class ClusterSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: ClusterName = "sparks"
    default_recipe: str | None = Field(default=None, max_length=128)
    vllm_port: Whole = Field(default=8000, ge=1, le=65535)
    proxy_port: Whole = Field(default=4000, ge=1, le=65535)
    master_port: Whole = Field(default=29500, ge=1, le=65535)
    ray_port: Whole = Field(default=6379, ge=1, le=65535)
    hf_cache: str = Field(default="~/.cache/huggingface", max_length=1024)
    # Where `models pull` downloads from (HF_ENDPOINT): the Hub unless a mirror is named (the lab names its hub).
    hf_endpoint: str | None = Field(default=None, max_length=256)
    secrets_file: str | None = Field(default=None, max_length=1024)
    known_hosts: str = Field(default="~/.ssh/known_hosts", max_length=1024)
    state_dir: str = Field(default=".sparkdeploy", max_length=255)
    image_override: str | None = Field(default=None, max_length=256)
    metrics: bool = False  # also run Prometheus on the head node, scraping every engine (`up --metrics`)
    metrics_port: Whole = Field(default=9090, ge=1, le=65535)
    # How the ConnectX-7 ports meet: one cable between two nodes, or a switch. Unset: direct for two nodes,
    # switch for more. Either way every fabric_ip is on one subnet (a switch is one L2 segment).
    # mesh: three nodes, every pair cabled port to port; ring: three or more, each node to its two neighbours.
    # Both: per node `links` (port -> peer), one /30 per cable from mesh_subnet; fabric_ip is then the address
    # the nodes meet at for Ray and NCCL's bootstrap (no cable address reaches every peer).
    fabric: Literal["direct", "switch", "mesh", "ring"] | None = None
    mesh_subnet: str = fabric_mesh.DEFAULT_SUBNET
    guard: GuardSettings = Field(default_factory=GuardSettings)  # the memory guard's lines (sparkdeploy/guard)
    # The owner's testinfra modules every `doctor` run includes (as with --tests): files or folders on this machine,
    # relative to the inventory file; `@spark` names the shipped example checks (sparkdeploy/doctor/spark_checks).
    doctor_tests: list[str] = Field(default_factory=list, max_length=64)

    @field_validator("state_dir")
    @classmethod
    def _state_dir(cls, v: str) -> str:
        if v.startswith("/") or ".." in Path(v).parts or not re.fullmatch(r"[A-Za-z0-9_./-]+", v):
            raise Invalid(
                "state_dir is a plain folder relative to the SSH user's home",
                "e.g. .sparkdeploy",
            )
        return v

    @field_validator("hf_endpoint")
    @classmethod
    def _hf_endpoint(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~/-]*)?", v):
            raise Invalid(
                "hf_endpoint is an http(s) URL of a Hugging Face Hub mirror",
                "e.g. http://10.0.0.5:8090, or remove it to use huggingface.co",
            )
        return v

    @field_validator("default_recipe", "secrets_file", "known_hosts", "image_override")
    @classmethod
    def _plain_text(cls, v: str | None) -> str | None:
        return _one_line(v)

    @field_validator("doctor_tests")
    @classmethod
    def _doctor_tests(cls, v: list[str]) -> list[str]:
        for item in v:
            _one_line(item)
        return v

    @field_validator("hf_cache")
    @classmethod
    def _hf_cache(cls, v: str) -> str:
        _one_line(v)
        if not v.startswith(("/", "~/")):
            raise Invalid(
                "hf_cache is an absolute path or starts with ~/",
                "e.g. ~/.cache/huggingface",
            )
        return v


class Inventory(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cluster: ClusterSettings = Field(default_factory=ClusterSettings)
    nodes: list[Node] = Field(min_length=1)
    # Which nodes form one tensor-parallel engine (cluster with --tp, replicas), by name or mgmt_ip, e.g.
    # [[spark1, spark2], [spark3, spark4]]: the nodes that share a switch's fastest ports. Unset: in order.
    groups: list[list[str]] | None = None

    path: Path | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _consistent(self) -> Inventory:
        problems: list[Invalid] = []
        heads = [n for n in self.nodes if n.role == "head"]
        if len(heads) != 1:
            problems.append(
                Invalid.at(
                    "nodes",
                    f"{len(heads)} nodes have role head",
                    "mark exactly one node role: head",
                )
            )
        for attr, what in (("name", "name"), ("mgmt_ip", "management IP"), ("fabric_address", "fabric IP")):
            seen: dict[str, str] = {}
            for node in self.nodes:
                value = getattr(node, attr)
                if value in seen:
                    problems.append(
                        Invalid.at(
                            "nodes",
                            f"{node.name} and {seen[value]} share the {what} {value}",
                            f"give each node its own {what}",
                        )
                    )
                seen[value] = node.name
        if len(self.nodes) > 1:  # the nodes reach each other (and the proxy its engines) at these addresses
            for i, node in enumerate(self.nodes):
                for attr, addr in (("mgmt_ip", node.mgmt_ip), ("fabric_ip", node.fabric_address)):
                    if ipaddress.ip_address(addr).is_loopback:
                        problems.append(
                            Invalid.at(
                                f"nodes[{i}].{attr}",
                                f"{addr} is a loopback address: the other nodes cannot reach {node.name} there",
                                f"write {node.name}'s own address on the network the nodes share, "
                                "as `ip -br addr` on the node shows it",
                            )
                        )
        networks = {str(n.fabric_network) for n in self.nodes}
        if self.fabric in fabric_mesh.LAYOUTS:
            problems += self._mesh_problems()
        elif any(n.links for n in self.nodes):
            i = next(i for i, n in enumerate(self.nodes) if n.links)
            problems.append(
                Invalid.at(
                    f"nodes[{i}].links",
                    "cables are listed for a direct mesh or ring only",
                    "set cluster.fabric: mesh (or ring), or remove links",
                )
            )
        if len(networks) > 1 and self.fabric not in fabric_mesh.LAYOUTS:
            where = "the switch's one subnet" if self.fabric == "switch" else "the one subnet of the ConnectX-7 link"
            problems.append(
                Invalid.at(
                    "nodes",
                    f"fabric IPs are on different subnets ({', '.join(sorted(networks))})",
                    f"put every fabric_ip on {where}",
                )
            )
        if self.cluster.fabric == "direct" and len(self.nodes) > 2:
            problems.append(
                Invalid.at(
                    "cluster.fabric",
                    f"a direct cable links two nodes, this inventory has {len(self.nodes)}",
                    "set fabric: switch (every node's CX7 port on one switch and one subnet)",
                )
            )
        problems += self._group_problems()
        if problems:
            raise Invalids(problems)
        return self

    def _mesh_problems(self) -> list[Invalid]:
        problems: list[Invalid] = []
        for i, node in enumerate(self.nodes):
            if node.socket_iface is None or node.socket_iface in node.fabric_ifaces:
                problems.append(
                    Invalid.at(
                        f"nodes[{i}].socket_iface",
                        f"in a {self.fabric} no cable reaches every node, so the nodes meet at fabric_ip ("
                        f"{node.fabric_address}) over another interface",
                        f"name the interface holding it (the management one, `ip -br addr` on {node.name})",
                    )
                )
            for link in node.links:
                if link.port not in node.fabric_ifaces:
                    problems.append(
                        Invalid.at(
                            f"nodes[{i}].links",
                            f"{link.port} is not in {node.name}'s fabric_ifaces",
                            "list every cabled port in fabric_ifaces",
                        )
                    )
        try:
            net = ipaddress.IPv4Network(self.cluster.mesh_subnet)
        except ValueError:
            return [
                *problems,
                (
                    Invalid.at(
                        "cluster.mesh_subnet",
                        f"{self.cluster.mesh_subnet!r} is not an IPv4 subnet (no host bits)",
                        f"e.g. {fabric_mesh.DEFAULT_SUBNET}",
                    )
                ),
            ]
        for node in self.nodes:
            for attr, addr in (("mgmt_ip", node.mgmt_ip), ("fabric_ip", node.fabric_address)):
                if ipaddress.ip_address(addr) in net:
                    problems.append(
                        Invalid.at(
                            "cluster.mesh_subnet",
                            f"{net} overlaps {node.name}'s {attr} {addr}",
                            "a subnet no other network of the nodes uses",
                        )
                    )
        _, found = self._cables()
        return problems + found

    def _cables(self) -> tuple[list[fabric_mesh.Cable], list[Invalid]]:
        return fabric_mesh.cables(
            self.fabric,
            [n.name for n in self.nodes],
            {n.name: [(link.port, link.peer) for link in n.links] for n in self.nodes},
            self.cluster.mesh_subnet,
        )

    @property
    def cables(self) -> list[fabric_mesh.Cable]:
        """A mesh's or ring's cables with their addresses (validated on load); [] for direct and switch."""
        return self._cables()[0] if self.fabric in fabric_mesh.LAYOUTS else []

    def _group_problems(self) -> list[Invalid]:
        if self.groups is None:
            return []
        problems: list[Invalid] = []
        seen: dict[str, int] = {}
        for gi, group in enumerate(self.groups):
            for ref in group:
                node = next((n for n in self.nodes if ref in (n.name, n.mgmt_ip)), None)
                if node is None:
                    problems.append(
                        Invalid.at(
                            "groups",
                            f"[{gi}] names {ref!r}, not a node",
                            f"use a node's name ({', '.join(n.name for n in self.nodes)})",
                        )
                    )
                elif node.name in seen:
                    problems.append(
                        Invalid.at(
                            "groups",
                            f"{node.name} is in group {seen[node.name]} and group {gi}",
                            "put each node in one group",
                        )
                    )
                else:
                    seen[node.name] = gi
        missing = [n.name for n in self.nodes if n.name not in seen]
        if missing and not problems:
            problems.append(
                Invalid.at(
                    "groups",
                    f"{', '.join(missing)} in no group",
                    "list every node in one group",
                )
            )
        sizes = sorted({len(g) for g in self.groups})
        if len(sizes) > 1 or 0 in sizes:
            problems.append(
                Invalid.at(
                    "groups",
                    f"groups of {', '.join(map(str, sizes))} nodes",
                    "one engine = one TP group, so every group has the same number of nodes",
                )
            )
        return problems

    @property
    def fabric(self) -> str:
        """direct (a cable between two nodes) or switch, as set or inferred from the node count."""
        return self.cluster.fabric or ("direct" if len(self.nodes) <= 2 else "switch")

    def node_groups(self) -> list[list[Node]] | None:
        """The inventory's explicit TP groups as nodes (None: not set, the topology chunks nodes in order)."""
        if self.groups is None:
            return None
        return [[self.node(ref) for ref in group] for group in self.groups]

    # -- lookups -------------------------------------------------------------------------------------
    @property
    def head(self) -> Node:
        return next(n for n in self.nodes if n.role == "head")

    @property
    def workers(self) -> list[Node]:
        return [n for n in self.nodes if n.role != "head"]

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name or n.mgmt_ip == name:
                return n
        raise ConfigError(
            Problem(self.source, "nodes", f"no node named {name!r}", f"known: {', '.join(n.name for n in self.nodes)}")
        )

    @property
    def cluster_id(self) -> str:
        """The cluster is its nodes (a copy of the inventory, or another path to it, is the same cluster)."""
        nodes = ",".join(sorted(n.mgmt_ip for n in self.nodes))
        return f"{self.cluster.name}-{hashlib.sha256(nodes.encode()).hexdigest()[:12]}"

    @property
    def source(self) -> str:
        return str(self.path) if self.path else "inventory"

    def local_path(self, value: str | None) -> Path | None:
        """A path on this machine named in the inventory: ~ expanded, relative to the inventory file."""
        if not value:
            return None
        path = Path(os.path.expanduser(value))
        if not path.is_absolute() and self.path is not None:
            path = self.path.parent / path
        return path


def resolve_inventory_path(given: str | None) -> Path:
    """--inventory, then SPARKDEPLOY_INVENTORY, then ./inventory.yaml; `lab` names the lab's inventory."""
    value = given or os.environ.get("SPARKDEPLOY_INVENTORY")
    if value == "lab":
        path = paths.lab_dir() / "inventory.yaml"
        if not path.is_file():
            raise ConfigError(Problem(str(path), "", "the lab is not up", "run: sparkdeploy lab up"))
        return path
    if value:
        return Path(value).expanduser()
    path = Path("inventory.yaml")
    if path.is_file():
        return path
    raise ConfigError(
        Problem(
            "inventory.yaml",
            "",
            "no inventory found",
            "pass --inventory PATH, set SPARKDEPLOY_INVENTORY, or use --inventory lab",
        )
    )


def _cross_node_problems(data: dict[str, Any], source: str) -> list[Problem]:
    """The cross-node checks on the raw file, for when a field error stopped the model's own (report all)."""
    nodes = [n for n in data.get("nodes") or [] if isinstance(n, dict)] if isinstance(data.get("nodes"), list) else []
    problems = []
    heads = sum(1 for n in nodes if n.get("role") == "head")
    if nodes and heads != 1:
        problems.append(Problem(source, "nodes", f"{heads} nodes have role head", "mark exactly one node role: head"))
    for key, what in (("name", "name"), ("mgmt_ip", "management IP")):
        seen: dict[str, str] = {}
        for n in nodes:
            value = str(n.get(key, ""))
            if value and value in seen:
                problems.append(
                    Problem(
                        source,
                        "nodes",
                        f"{n.get('name')} and {seen[value]} share the {what} {value[:64]}",
                        f"give each node its own {what}",
                    )
                )
            seen.setdefault(value, str(n.get("name")))
    return problems


def load_inventory(given: str | os.PathLike[str] | None = None) -> Inventory:
    path = resolve_inventory_path(str(given) if given else None)
    data = load_yaml_file(path, "inventory", "fix the syntax (see inventory.yaml in the project)")
    if not isinstance(data, dict):
        raise ConfigError(Problem(str(path), "", "must be a mapping with cluster: and nodes:", "see inventory.yaml"))
    try:
        inventory = Inventory.model_validate(data)
    except ValidationError as exc:
        problems = problems_from_validation(exc, str(path), Inventory)
        if not any(p.field == "nodes" for p in problems):  # pydantic skips the cross-node checks then
            problems += _cross_node_problems(data, str(path))
        raise ConfigError(problems) from None
    inventory.path = path.resolve()
    problems = local_file_problems(inventory)
    if problems:
        raise ConfigError(problems)
    return inventory


def local_file_problems(inventory: Inventory) -> list[Problem]:
    """The files on this machine the inventory names for SSH (its known_hosts, each node's key), through the one
    door before anything connects: a folder, /dev/zero or a non-UTF-8 file there is one line, not a hang."""
    named = [("cluster.known_hosts", inventory.local_path(inventory.cluster.known_hosts), "known_hosts file")]
    named += [
        (f"nodes[{i}].ssh.key", inventory.local_path(n.ssh.key), "private key")
        for i, n in enumerate(inventory.nodes)
        if n.ssh.key
    ]
    problems: list[Problem] = []
    seen: set[Path] = set()
    for field, path, what in named:
        if path is not None and path not in seen:
            seen.add(path)
            problems += present_file_problems(path, what, inventory.source, field)
    return problems
