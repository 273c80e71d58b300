"""What a lab is: its name, node count, subnets and where its keys and inventory live.

Everything the lab creates in the Docker engine is named after the lab (`sparkdeploy-<name>-...`) and carries
the labels below, so `lab down` can remove exactly what a lab made and nothing else, and several labs (the
shared test lab, a throw-away one for the `lab down` test, the benchmark's) can live side by side on their
own subnets.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from sparkdeploy import paths
from sparkdeploy.errors import ConfigError, Problem

LAB_LABEL = "io.sparkdeploy.lab"  # "1" on every container, network and volume a lab creates
NAME_LABEL = "io.sparkdeploy.lab.name"
NODE_LABEL = "io.sparkdeploy.lab.node"
CONFIG_LABEL = "io.sparkdeploy.lab.config-hash"

DEFAULT_NAME = "lab"
DEFAULT_MGMT_SUBNET = "172.30.77.0/24"
DEFAULT_FABRIC_SUBNET = "172.30.78.0/24"
DEFAULT_IMAGES = ("vllm-sim", "litellm-proxy", "guard")  # the memory guard runs beside every engine (#29)
NODE_IMAGE = "lab-node"
BARE_NODE_IMAGE = "lab-node-bare"  # `lab up --bare`: nodes as a new pair arrives (images/lab-node-bare)
FIRST_HOST = 11  # spark1 is .11, spark2 .12, ...: away from the gateway (.1) and easy to read

# A DGX Spark's ConnectX-7 port as the OS names it, and the two RoCE "twins" of that port.
FABRIC_IFACE = "enp1s0f1np1"
HCAS = ("rocep1s0f1", "roceP2p1s0f1")
ROCE_V2_GID_INDEX = 3  # show_gids: 0/1 link-local v1/v2, 2/3 the fabric IPv4 v1/v2
BARE_TWIN_IFACE = "enP2p1s0f1np1"  # the same port's other name: a bare lab's even nodes show it (names differ)

NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,30}")

# Developers running several checkouts on one engine keep their labs apart: SPARKDEPLOY_LAB_INSTANCE prefixes
# every Docker object (and label) a lab makes, and SPARKDEPLOY_LAB_SUBNETS ("MGMT,FABRIC") moves the default
# lab to subnets of its own. Both are unset for users and for CI's first lab shard; its second shard sets both
# (tests/support/lab_shards.py: a lab of its own beside the first, on the same engine).
INSTANCE_ENV = "SPARKDEPLOY_LAB_INSTANCE"
SUBNETS_ENV = "SPARKDEPLOY_LAB_SUBNETS"
# The throw-away labs beside the shared one (tests, benchmarks, `lab up --name`) take two free 172.30.X.0/24 subnets
# (lab/network.py free_subnets) with X in FIRST-LAST; SPARKDEPLOY_LAB_SIDE_OCTETS ("FIRST-LAST", inside the default)
# narrows it, so that two test processes at once (CI's two lab shards, tests/support/lab_shards.py) never pick the
# same free subnets before either has made its networks.
SIDE_OCTETS_ENV = "SPARKDEPLOY_LAB_SIDE_OCTETS"
SIDE_OCTETS_FIRST = 100
SIDE_OCTETS_LAST = 249
# Each node's memory limit (a cgroup: `docker run --memory`), standing in for a Spark's 128 GB of unified memory
# scaled down (1/10); the inner engine's containers run under it (lab/nodes.py nests their cgroups), so the guard
# (sparkdeploy/guard) sees one node's memory run out as on a Spark. 0 turns it off.
NODE_MEMORY_ENV = "SPARKDEPLOY_LAB_NODE_MEMORY_MB"
DEFAULT_NODE_MEMORY_MB = 12 * 1024


def _default_node_memory() -> int:
    value = os.environ.get(NODE_MEMORY_ENV, "")
    return int(value) if value.isdigit() else DEFAULT_NODE_MEMORY_MB


def _default_subnet(index: int) -> str:
    value = os.environ.get(SUBNETS_ENV, "")
    if value:
        parts = [p.strip() for p in value.split(",")]
        if len(parts) == 2:
            return parts[index]
    return (DEFAULT_MGMT_SUBNET, DEFAULT_FABRIC_SUBNET)[index]


def side_octets() -> range:
    """The X of the 172.30.X.0/24 subnets a throw-away lab may take (see SIDE_OCTETS_ENV); bad input is exit 2."""
    value = os.environ.get(SIDE_OCTETS_ENV, "")
    if not value:
        return range(SIDE_OCTETS_FIRST, SIDE_OCTETS_LAST + 1)
    first, _, last = value.partition("-")
    if first.isdigit() and last.isdigit() and SIDE_OCTETS_FIRST <= int(first) <= int(last) <= SIDE_OCTETS_LAST:
        return range(int(first), int(last) + 1)
    raise ConfigError(
        Problem(
            "environment",
            SIDE_OCTETS_ENV,
            f"{value!r} is not FIRST-LAST",
            f"unset it, or give two numbers from {SIDE_OCTETS_FIRST} to {SIDE_OCTETS_LAST}, e.g. 100-174",
        )
    )


# A docker SDK list filter (label, name, ...), the SDK's own type for it.
Filters = dict[str, str | list[str] | bool]


@dataclass(frozen=True)
class NodeSpec:
    name: str  # spark1, spark2, ...
    mgmt_ip: str
    fabric_ip: str
    prefixlen: int

    @property
    def fabric_cidr(self) -> str:
        return f"{self.fabric_ip}/{self.prefixlen}"


@dataclass(frozen=True)
class LabSpec:
    """A lab's parameters. `state_dir` defaults to paths.lab_dir() for the default lab, a sibling otherwise."""

    name: str = DEFAULT_NAME
    nodes: int = 2
    mgmt_subnet: str = field(default_factory=lambda: _default_subnet(0))
    fabric_subnet: str = field(default_factory=lambda: _default_subnet(1))
    images: tuple[str, ...] = DEFAULT_IMAGES
    state_dir: Path | None = None
    fabric_iface: str = FABRIC_IFACE
    hcas: tuple[str, ...] = field(default=HCAS)
    seed: bool = False  # fill fresh nodes after the first by copying its image store (lab/seed.py)
    bare: bool = False  # `lab up --bare`: password login, no fabric address, MTU 1500, netplan.io (lab/bare.py)
    node_memory_mb: int = field(default_factory=_default_node_memory)  # see NODE_MEMORY_ENV; 0: no limit

    def __post_init__(self) -> None:
        problems = []
        if not NAME_RE.fullmatch(self.name):
            problems.append(
                Problem(
                    "lab",
                    "--name",
                    f"{self.name!r} is not a lab name",
                    "use lower-case letters, digits and '-', at most 31",
                )
            )
        if not 1 <= self.nodes <= 20:
            problems.append(Problem("lab", "--nodes", f"{self.nodes} nodes", "choose 1 to 20"))
        nets = {}
        for flag, value in (("--subnet", self.mgmt_subnet), ("--fabric-subnet", self.fabric_subnet)):
            try:
                net = ipaddress.IPv4Network(value, strict=True)
            except ValueError as exc:
                problems.append(Problem("lab", flag, f"{value!r}: {exc}", "e.g. 172.30.77.0/24"))
                continue
            if net.num_addresses < FIRST_HOST + self.nodes + 1:
                problems.append(
                    Problem("lab", flag, f"{value} is too small for {self.nodes} nodes", "use a /24 or larger")
                )
            nets[flag] = net
        if len(nets) == 2 and nets["--subnet"].overlaps(nets["--fabric-subnet"]):
            problems.append(
                Problem(
                    "lab", "--fabric-subnet", "the management and fabric subnets overlap", "give them distinct subnets"
                )
            )
        if problems:
            raise ConfigError(problems)
        object.__setattr__(self, "images", tuple(self.images))

    @property
    def node_image(self) -> str:
        return BARE_NODE_IMAGE if self.bare else NODE_IMAGE

    def fabric_iface_for(self, node: str) -> str:
        """The fabric interface's name on `node`: a bare lab's even nodes (spark2, ...) use the twin name."""
        index = int(node.removeprefix("spark") or 1) - 1 if node.removeprefix("spark").isdigit() else 0
        return BARE_TWIN_IFACE if self.bare and index % 2 == 1 else self.fabric_iface

    # -- names of everything the lab creates -------------------------------------------------------------
    @property
    def qualified_name(self) -> str:
        """The name on Docker objects and labels: the lab's name, behind the developer's instance if one is set."""
        instance = os.environ.get(INSTANCE_ENV, "")
        return f"{instance}-{self.name}" if instance else self.name

    @property
    def prefix(self) -> str:
        return f"sparkdeploy-{self.qualified_name}"

    @property
    def mgmt_network(self) -> str:
        return f"{self.prefix}-mgmt"

    @property
    def fabric_network(self) -> str:
        return f"{self.prefix}-fabric"

    def container_name(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    def volume_name(self, node: str) -> str:
        return f"{self.prefix}-{node}-docker"

    def labels(self, node: str | None = None) -> dict[str, str]:
        labels = {LAB_LABEL: "1", NAME_LABEL: self.qualified_name}
        if node:
            labels[NODE_LABEL] = node
        return labels

    @property
    def filter_labels(self) -> list[str]:
        """The labels every object of this lab carries (and no other lab's)."""
        return [f"{LAB_LABEL}=1", f"{NAME_LABEL}={self.qualified_name}"]

    @property
    def filters(self) -> Filters:
        """Docker list filter selecting this lab's objects only."""
        return {"label": self.filter_labels}

    # -- addresses --------------------------------------------------------------------------------------
    def node_specs(self) -> list[NodeSpec]:
        mgmt = ipaddress.IPv4Network(self.mgmt_subnet)
        fabric = ipaddress.IPv4Network(self.fabric_subnet)
        return [
            NodeSpec(f"spark{i + 1}", str(mgmt[FIRST_HOST + i]), str(fabric[FIRST_HOST + i]), fabric.prefixlen)
            for i in range(self.nodes)
        ]

    def gateway(self, subnet: str) -> str:
        return str(ipaddress.IPv4Network(subnet)[1])

    # -- files on this machine --------------------------------------------------------------------------
    @property
    def directory(self) -> Path:
        if self.state_dir is not None:
            return Path(self.state_dir)
        if self.name == DEFAULT_NAME:
            return paths.lab_dir()
        return paths.state_dir() / f"lab-{self.name}"

    @property
    def inventory_path(self) -> Path:
        return self.directory / "inventory.yaml"
