"""What every topology shares: the node env file, the secrets file, and one container = run script + entry.

A topology module only decides which containers run where with which entry template and arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sparkdeploy import __version__, healthcheck
from sparkdeploy.config.guard_settings import GuardSettings, effective
from sparkdeploy.config.inventory import ClusterSettings, Inventory, Node
from sparkdeploy.config.secrets import Secrets, digest_key, keyed_digest
from sparkdeploy.images.definitions import ImageDefinition, load_definition
from sparkdeploy.labels import (
    DEPLOYMENT_LABEL,
    GROUP_LABEL,
    HEALTH_PORT_LABEL,
    LABEL_PREFIX,
    MANAGED_LABEL,
    RANK_LABEL,
    WATCHERS_LABEL,
)
from sparkdeploy.recipes.engines.interface import ONE_NODE, Distributed, Engine
from sparkdeploy.recipes.engines.registered import engine_of
from sparkdeploy.recipes.recipe import Recipe, ResolvedRecipe
from sparkdeploy.topologies.deployment import ContainerSpec, FileSpec, Listen, NodeDeployment, config_hash, health_path
from sparkdeploy.topologies.render import render

CONTAINER_HF_HOME = "/root/.cache/huggingface"
SERVING_CONTAINER = "sparkdeploy-vllm"
PROXY_CONTAINER = "sparkdeploy-litellm"
ENGINE_PORT = "cluster.vllm_port"  # the engines' HTTP port (a stack deployment's `port`)


def engine_listen(port: int, title: str = "vLLM") -> Listen:
    return Listen(port, title, ENGINE_PORT)


@dataclass(frozen=True)
class EngineGroup:
    """One engine's ranks (one node for solo and 2xsolo): what its containers' group labels say."""

    name: str
    ranks: tuple[Node, ...]


@dataclass
class Context:
    inventory: Inventory
    resolved: ResolvedRecipe
    image: ImageDefinition  # the image the recipe targets (its vLLM version and flags)
    run_image: ImageDefinition  # the image that runs (the same, or the lab's simulator standing in)
    secrets: Secrets
    solo_node: Node | None = None
    warnings: list[str] = field(default_factory=list)
    engine_groups: list[list[str]] = field(default_factory=list)  # node names of each multi-node engine
    # A deployment of a stack (deploy/stack/converge.py): its name goes into container names and labels so several
    # coexist, and the stack's one gateway replaces the topology's own proxy. "": the single deployment.
    deployment: str = ""
    _key: bytes | None = field(default=None, repr=False)

    @property
    def recipe(self) -> Recipe:
        return self.resolved.recipe

    @property
    def engine(self) -> Engine:
        """The recipe's serving engine (recipes/engines/): its serve_args is the one writer of its flags."""
        return engine_of(self.recipe)

    def engine_args(self, port: int, dist: Distributed = ONE_NODE) -> list[str]:
        """The engine's command line for this recipe, checked against the pinned engine's own flag list."""
        args = self.engine.serve_args(self.resolved, self.image, port, dist)
        self.engine.check_args(args, self.image, str(self.resolved.source))
        return args

    @property
    def cluster(self) -> ClusterSettings:
        return self.inventory.cluster

    def fabric_env(self, node: Node, master: Node | None = None) -> dict[str, str]:
        """The NCCL / gloo / Ray settings the public Spark recipes found necessary for the CX7 link.
        master: rank 0 of the node's engine (default: the inventory's head)."""
        # A mesh or ring: the sockets on the meeting interface; NCCL's bulk over every cable's RDMA devices.
        mesh = bool(self.inventory.cables)
        ifaces = (node.socket_iface or "") if mesh else ",".join(node.fabric_ifaces)
        head = master or self.inventory.head
        env = {
            "NCCL_SOCKET_IFNAME": ifaces,
            "GLOO_SOCKET_IFNAME": ifaces,
            "TP_SOCKET_IFNAME": ifaces,
            "UCX_NET_DEVICES": ifaces,
            "OMPI_MCA_btl_tcp_if_include": ifaces,
            "NCCL_IB_DISABLE": "0",
        }
        if node.hcas:
            env["NCCL_IB_HCA"] = ",".join(node.hcas)  # both RoCE twins of the port: ~23.7 vs ~3 GB/s busbw
        if node.gid_index is not None:
            env["NCCL_IB_GID_INDEX"] = str(node.gid_index)
        if mesh:  # a /30 per cable: each HCA reaches only its own peer (eugr's setup-cluster ring/mesh settings)
            env.update({"NCCL_IB_SUBNET_AWARE_ROUTING": "1", "NCCL_IB_MERGE_NICS": "0"})
        env.update(
            {
                "NCCL_IGNORE_CPU_AFFINITY": "1",
                "VLLM_HOST_IP": node.fabric_address,
                "MASTER_ADDR": head.fabric_address,
                "MASTER_PORT": str(self.cluster.master_port),
                "RAY_memory_monitor_refresh_ms": "0",  # Ray's OOM killer misreads unified memory
                "HF_HOME": CONTAINER_HF_HOME,
                # Weights come from `models pull` (verified on every node), never from a node downloading alone.
                "HF_HUB_OFFLINE": "1",
            }
        )
        return env

    @property
    def guard_settings(self) -> GuardSettings:
        """The guard (and watcher) settings of this deployment's nodes: a stack's guards use the inventory's only."""
        return self.cluster.guard if self.deployment else effective(self.cluster.guard, self.recipe.guard)

    def engine_group(self, ranks: list[Node]) -> EngineGroup:
        """The group of one engine over `ranks` (rank 0 first), named after the deployment and its rank 0's node."""
        return EngineGroup(f"{self.deployment or self.recipe.name}:{ranks[0].name}", tuple(ranks))

    def group_labels(self, group: EngineGroup, node: Node, health_port: int | None) -> dict[str, str]:
        port = self.guard_settings.watch.port
        labels = {
            GROUP_LABEL: group.name,
            RANK_LABEL: str([n.name for n in group.ranks].index(node.name)),
            WATCHERS_LABEL: " ".join(f"{n.name}@{n.fabric_address}:{port}" for n in group.ranks),
        }
        if health_port:
            labels[HEALTH_PORT_LABEL] = str(health_port)
        return labels

    def digest(self, f: FileSpec) -> str:
        """A file's part of a config hash; a secret file's is keyed (see secrets.digest_key): never guessable."""
        if not f.secret:
            return f.sha256
        if self._key is None:
            self._key = digest_key(self.inventory.cluster_id)
        return keyed_digest(self._key, f.content)

    def common_files(self, node: Node, master: Node | None = None) -> list[FileSpec]:
        env = self.fabric_env(node, master)
        env.update(self.recipe.env)
        node_env = render(
            "node.env.j2", node=node, env=env, recipe_name=self.recipe.name, topology=self.resolved.topology
        )
        secrets = {k: v for k, v in sorted(self.secrets.values.items()) if v}
        secrets_env = render("secrets.env.j2", node=node, secrets=secrets)
        return [FileSpec("node.env", node_env), FileSpec("secrets.env", secrets_env, mode=0o600, secret=True)]

    def engine_container(self, nd: NodeDeployment, *, role: str, port: int, args: list[str]) -> None:
        """One engine on its own node (solo, each 2xsolo backend): its entry script, the GPU, /health on port."""
        engine = self.engine
        self.container(
            nd,
            role=role,
            name=SERVING_CONTAINER,
            entry_template=engine.entry_template,
            entry_name=engine.entry_name,
            image_tag=self.run_image.tag,
            gpus=True,
            ports=(engine_listen(port, engine.title),),
            health_port=port,
            args=args,
            headless=False,
            group=self.engine_group([nd.node]),
            **engine.entry_vars(self.recipe),
        )

    def rendered(self, name: str, template: str, **variables: Any) -> FileSpec:
        """A file of the deployment rendered from `template`, which also gets the recipe's name and the topology."""
        return FileSpec(
            name, render(template, recipe_name=self.recipe.name, topology=self.resolved.topology, **variables)
        )

    def side_container(
        self,
        nd: NodeDeployment,
        *,
        role: str,
        name: str,
        entry: str,
        image: str,
        listen: Listen,
        health_port: int | None,
        files: tuple[FileSpec, ...],
        **entry_vars: Any,
    ) -> None:
        """A container beside the engines (the LiteLLM proxy, Prometheus): image definition `image`, no GPU, one
        port (`listen`); its entry script entry-<entry>.sh.j2 (<entry>.entry.sh on the node) gets `port` and
        entry_vars."""
        self.container(
            nd,
            role=role,
            name=name,
            entry_template=f"entry-{entry}.sh.j2",
            entry_name=f"{entry}.entry.sh",
            image_tag=load_definition(image).tag,
            gpus=False,
            ports=(listen,),
            health_port=health_port,
            extra_files=files,
            port=listen.port,
            **entry_vars,
        )

    def container(
        self,
        nd: NodeDeployment,
        *,
        role: str,
        name: str,
        entry_template: str,
        entry_name: str,
        image_tag: str,
        gpus: bool,
        ports: tuple[Listen, ...],
        health_port: int | None,
        restart: str = "unless-stopped",
        extra_files: tuple[FileSpec, ...] = (),
        model_cache: bool = True,
        run_options: dict[str, Any] | None = None,
        group: EngineGroup | None = None,
        **entry_vars: Any,
    ) -> None:
        """Add one container to `nd`: its entry script, any extra files, and the run script that starts it.
        model_cache: mount the hub cache (with gpus); run_options: more variables of container-run.sh.j2
        (state_volumes, host_volumes, cap_add, optional_devices), only when given, so no other hash changes."""
        if self.deployment and name != f"sparkdeploy-{self.deployment}":  # sparkdeploy-vllm -> sparkdeploy-coder-vllm
            name = f"sparkdeploy-{self.deployment}-{name.removeprefix('sparkdeploy-')}"
        common = {
            "name": name,
            "node": nd.node,
            "recipe_name": self.recipe.name,
            "topology": self.resolved.topology,
            "backend": self.resolved.backend,
        }
        entry = FileSpec(entry_name, render(entry_template, **common, **entry_vars), mode=0o755)
        depends = [entry, *extra_files, *[f for f in nd.files if f.name in ("node.env", "secrets.env")]]
        run_vars = dict(
            common,
            image=image_tag,
            restart=restart,
            gpus=gpus,
            entry=entry_name,
            hf_cache=self.cluster.hf_cache if gpus and model_cache else None,
            container_hf_home=CONTAINER_HF_HOME,
            # an engine's liveness path is its engine's (recipes/engines/: /health for all three today)
            healthcheck=healthcheck.for_port(health_port, self.engine.health_path if gpus else health_path(role))
            if health_port
            else None,
            **(run_options or {}),
        )
        grouped = self.group_labels(group, nd.node, health_port) if group is not None else {}
        # The hash covers everything the container is made of, so any change restarts exactly this container.
        settings = sorted((k, str(v)) for k, v in run_vars.items() if k != "node")
        if grouped:  # the group labels: a container gets its labels when it is made, so they are part of it
            settings.append(("group", repr(sorted(grouped.items()))))
        chash = config_hash(__version__, image_tag, repr(settings), *(f.name + ":" + self.digest(f) for f in depends))
        labels = {
            MANAGED_LABEL: "true",
            f"{LABEL_PREFIX}.recipe": self.recipe.name,
            f"{LABEL_PREFIX}.topology": self.resolved.topology,
            f"{LABEL_PREFIX}.backend": self.resolved.backend or "none",
            f"{LABEL_PREFIX}.role": role,
            f"{LABEL_PREFIX}.config-hash": chash,
        }
        if self.deployment:
            labels[DEPLOYMENT_LABEL] = self.deployment
        labels.update(grouped)
        run_name = f"{name.removeprefix('sparkdeploy-')}.run.sh"
        run = FileSpec(run_name, render("container-run.sh.j2", labels=labels, **run_vars), mode=0o755)
        for f in (entry, *extra_files, run):
            if all(existing.name != f.name for existing in nd.files):
                nd.files.append(f)
        nd.containers.append(
            ContainerSpec(
                name=name,
                role=role,
                image=image_tag,
                run_script=run_name,
                config_hash=chash,
                listens=ports,
                health_port=health_port,
            )
        )
