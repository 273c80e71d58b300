"""What a deployment puts on each node: files, and containers started from them.

A `Deployment` is pure data rendered from inventory + recipe + topology. The dry run prints it; `up`
compares it with what each node has (files by hash, containers by their config-hash label) and applies
only the differences.
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass, field

from sparkdeploy.images.definitions import ImageDefinition
from sparkdeploy.inventory import Inventory, Node
from sparkdeploy.recipes import ResolvedRecipe
from sparkdeploy.secrets import MASK, Secrets

LABEL_PREFIX = "io.sparkdeploy"
MANAGED_LABEL = f"{LABEL_PREFIX}.managed"
DEPLOYMENT_LABEL = f"{LABEL_PREFIX}.deployment"  # only on a stack's containers (deploy/stack.py): its name
ROLE_LABEL = f"{LABEL_PREFIX}.role"  # the container's role (ContainerSpec.role)
# An engine container's group (one engine, over one node or several: the unit the node-side watcher restarts,
# nodeside/guard/watch.py, which keeps a copy of these names: tests/guard checks they agree): its name, its rank,
# every rank's node and watcher address (NODE@IP:PORT, rank order) and rank 0's health port.
GROUP_LABEL = f"{LABEL_PREFIX}.group"
RANK_LABEL = f"{LABEL_PREFIX}.rank"
WATCHERS_LABEL = f"{LABEL_PREFIX}.group-watchers"
HEALTH_PORT_LABEL = f"{LABEL_PREFIX}.health-port"
# The container roles that hold no engine (the memory guard, the LiteLLM proxy, Prometheus); every other role
# serves or shares a model. nodeside/guard/run.py (stdlib only) keeps a copy: tests/guard checks they agree.
NOT_ENGINES = ("guard", "proxy", "metrics")


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
    port map of a node (sparkdeploy/ports.py) is made of these."""

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
