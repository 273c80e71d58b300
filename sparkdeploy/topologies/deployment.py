"""What a deployment puts on each node: files, and containers started from them.

A `Deployment` is pure data rendered from inventory + recipe + topology. The dry run prints it; `up`
compares it with what each node has (files by hash, containers by their config-hash label) and applies
only the differences.
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass, field

from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.config.secrets import MASK, Secrets
from sparkdeploy.images.definitions import ImageDefinition
from sparkdeploy.labels import NOT_ENGINES
from sparkdeploy.recipes.recipe import ResolvedRecipe


@dataclass(frozen=True)
class FileSpec:
    """A file under the node's state dir."""

    name: str
    content: str
    mode: int = 0o644
    secret: bool = False

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content.encode()).hexdigest()

    def shown(self) -> str:
        """The content as printed: a secret file shows its names, never its values."""
        if not self.secret:
            return self.content
        lines = []
        for line in self.content.splitlines():
            key, sep, value = line.partition("=")
            if not sep and line and not line.startswith("#"):
                lines.append(MASK)  # a bare value (a key file) is all secret
                continue
            lines.append(f"{key}={MASK if value else ''}" if sep and not line.startswith("#") else line)
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Listen:
    """A port a container listens on (host network), what listens there and the setting that chose it: the
    port map of a node (sparkdeploy/topologies/ports.py) is made of these."""

    port: int
    what: str  # "vLLM", "the Ray head", ...
    setting: str  # "cluster.vllm_port", ...


@dataclass(frozen=True)
class ContainerSpec:
    name: str
    role: str  # solo | head | worker | proxy
    image: str
    run_script: str  # the file (in the state dir) holding its `docker run`
    config_hash: str
    listens: tuple[Listen, ...] = ()
    health_port: int | None = None

    @property
    def ports(self) -> tuple[int, ...]:
        return tuple(listen.port for listen in self.listens)

    @property
    def health_path(self) -> str:
        return health_path(self.role)

    @property
    def is_engine(self) -> bool:
        return self.role not in NOT_ENGINES


def health_path(role: str) -> str:
    """The HTTP path that says a container serves: LiteLLM's `/health` would call every backend, so the proxy is
    asked `/health/liveliness` (no key needed)."""
    return "/health/liveliness" if role == "proxy" else "/health"


@dataclass
class NodeDeployment:
    node: Node
    state_dir: str
    files: list[FileSpec] = field(default_factory=list)
    containers: list[ContainerSpec] = field(default_factory=list)

    def file(self, name: str) -> FileSpec:
        return next(f for f in self.files if f.name == name)

    @property
    def runs_engine(self) -> bool:
        return any(c.is_engine for c in self.containers)

    def fresh_steps(self) -> list[tuple[str, str]]:
        """(kind, text) in order for a node that has nothing of ours: what the dry run shows."""
        steps: list[tuple[str, str]] = [("run", shlex.join(["mkdir", "-p", "-m", "0700", self.state_dir]))]
        for f in self.files:
            steps.append(("write", f.name))
        for c in self.containers:
            steps.append(("run", shlex.join(["docker", "rm", "--force", c.name])))
            steps.append(("run", shlex.join(["bash", f"{self.state_dir}/{c.run_script}"])))
        return steps


@dataclass
class Deployment:
    inventory: Inventory
    recipe: ResolvedRecipe
    image: ImageDefinition
    image_tag: str
    nodes: list[NodeDeployment]
    endpoint: str  # the public OpenAI base URL (…/v1)
    backends: list[str] = field(default_factory=list)  # 2xsolo, replicas: each engine's base URL (behind the proxy)
    # Node names of each engine that spans nodes (cluster: one, replicas: one per group): they restart together.
    engine_groups: list[list[str]] = field(default_factory=list)
    metrics_url: str | None = None  # Prometheus on the head node (up --metrics / cluster.metrics)
    warnings: list[str] = field(default_factory=list)
    secrets: Secrets = field(default_factory=Secrets)

    @property
    def topology(self) -> str:
        return self.recipe.topology

    @property
    def backend(self) -> str:
        return self.recipe.backend

    @property
    def model_name(self) -> str:
        return self.recipe.recipe.public_name

    @property
    def proxied(self) -> bool:
        """The public endpoint is the LiteLLM proxy in front of several engines (2xsolo, replicas)."""
        return bool(self.backends)

    @property
    def groups(self) -> list[list[str]]:
        """engine_groups; for a cluster Deployment built without them (by hand), one engine on every node."""
        if not self.engine_groups and self.topology == "cluster":
            return [[nd.node.name for nd in self.nodes]]
        return self.engine_groups

    def engine_size(self, node_name: str) -> int:
        """How many nodes share the engine that runs on this node (1: a single-node engine)."""
        return next((len(g) for g in self.groups if node_name in g), 1)

    def node(self, name: str) -> NodeDeployment:
        return next(n for n in self.nodes if n.node.name == name)


def config_hash(*parts: str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]
