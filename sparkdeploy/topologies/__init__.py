"""Topologies, registered in one place: each turns inventory + resolved recipe into files and containers per node.

Adding one is one module with a `build(ctx) -> (nodes, endpoint, backend URLs)` function, registered in REGISTRY
below as a Topology with the fewest nodes it needs and the backends it launches with (and its name added to
recipe.TOPOLOGIES, which the recipe schema validates against). The CLI's --topology and --backend read REGISTRY.

Beside the topologies (solo, cluster, twosolo, replicas; layout.py the node layouts, base.py their Context,
guard.py and metrics_stack.py what joins them), what a deployment is and what looks at one: deployment.py (the
Deployment, pure data), context.py (load_deployment: inventory + recipe -> Deployment, before anything connects),
render.py (the Jinja environment of the node files), ports.py (one port map per node), dryrun.py (the dry run's
text), running_stack.py (a running stack's deployments, rebuilt from their manifests), lint.py (`recipes lint`)
and fit.py (`recipes fit`: the memory budget of a recipe on each topology's nodes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sparkdeploy.config.inventory import Inventory
from sparkdeploy.config.secrets import Secrets
from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.images.definitions import ImageDefinition, definition_names, load_definition
from sparkdeploy.images.image_ref import RegistryImage, is_reference, registry_image
from sparkdeploy.images.vllm_cli import check_env
from sparkdeploy.recipes.engines.registered import engine_of
from sparkdeploy.recipes.recipe import BACKENDS, TOPOLOGIES, ResolvedRecipe
from sparkdeploy.topologies import cluster, ports, replicas, solo, twosolo
from sparkdeploy.topologies import guard as guard_deploy
from sparkdeploy.topologies.base import Context
from sparkdeploy.topologies.deployment import Deployment, NodeDeployment
from sparkdeploy.topologies.metrics_stack import add_prometheus


@dataclass(frozen=True)
class Topology:
    name: str
    # (nodes, endpoint, backend URLs) for one recipe on one inventory
    build: Callable[[Context], tuple[list[NodeDeployment], str, list[str]]]
    # cluster and replicas split one engine over nodes; 2xsolo is one engine per node behind a proxy: on one node
    # it would be solo with a proxy in front, so it is refused with the fix (solo) rather than quietly served.
    min_nodes: int = 1
    backends: tuple[str, ...] = ()  # how its ranks are launched (--backend); none for one-node engines


REGISTRY: dict[str, Topology] = {
    t.name: t
    for t in (
        Topology("solo", solo.build),
        Topology("cluster", cluster.build, min_nodes=2, backends=BACKENDS),
        Topology("2xsolo", twosolo.build, min_nodes=2),
        Topology("replicas", replicas.build, min_nodes=2, backends=BACKENDS),
    )
}
# The recipe schema names the same topologies (recipes/recipe.py cannot import this package: it is imported here).
assert tuple(REGISTRY) == TOPOLOGIES, "recipes.TOPOLOGIES and topologies.REGISTRY must name the same topologies"


def check_engine_topology(resolved: ResolvedRecipe) -> None:
    """The recipe's engine serves this topology with this backend, or one line says why not."""
    engine = engine_of(resolved.recipe)
    source = str(resolved.source)
    reason = engine.refused_topologies.get(resolved.topology)
    if reason:
        raise ConfigError(
            Problem(
                source,
                "topologies",
                f"{engine.title} does not serve {resolved.topology}: {reason}",
                "use solo, or 2xsolo for one engine per node behind the proxy",
            )
        )
    allowed = engine.multi_node_backends
    if resolved.backend and allowed is not None and resolved.backend not in allowed:
        raise ConfigError(
            Problem(
                source,
                "cluster_backend",
                f"{engine.title} runs multi-node only with its own launcher, not {resolved.backend}",
                f"set cluster_backend: {allowed[0]} in the recipe (or --backend {allowed[0]})",
            )
        )


def _run_image(
    inventory: Inventory, resolved: ResolvedRecipe, image: ImageDefinition, warnings: list[str]
) -> ImageDefinition:
    """The image that runs: the recipe's, or the inventory's image_override standing in for it (the lab's
    simulator); warnings gets what the user should know (an unknown registry CLI, SIMULATED)."""
    ref = resolved.recipe.image
    run_image = image
    # A registry image runs as it is, also in the lab: the lab's registry serves an image the lab built; but
    # another engine's registry image (SGLang's) is stood in for by the definition that says `engine:NAME`.
    override = None if isinstance(image, RegistryImage) else inventory.cluster.image_override
    engine = engine_of(resolved.recipe)
    if isinstance(image, RegistryImage) and image.cli is None and engine.name == "vllm":
        warnings.append(
            f"the vLLM CLI of {ref} is not known yet: its flags are checked once `up` or "
            f"`sparkdeploy images pull {ref} --on NODE` has pulled it and read it from the image"
        )
    if override and override != image.name:
        run_image = load_definition(override)
        # The override stands in for one engine's images (the lab's vllm-sim for vLLM's); another engine's image
        # is stood in for by the definition that says so (llamacpp-cpu, the real llama-server built for CPU).
        if engine.name != "vllm" and image.name not in run_image.stands_in_for:
            run_image = next(
                (d for d in map(load_definition, definition_names()) if image.name in d.stands_in_for), run_image
            )
        if image.name not in run_image.stands_in_for:
            raise ConfigError(
                Problem(
                    inventory.source,
                    "cluster.image_override",
                    f"{override} does not stand in for {image.name}",
                    f"use an image whose stands_in_for lists {image.name}",
                )
            )
    if isinstance(image, RegistryImage) and inventory.cluster.image_override and engine.name != "vllm":
        stand_in = [d for d in map(load_definition, definition_names()) if f"engine:{engine.name}" in d.stands_in_for]
        if stand_in:
            run_image = stand_in[0]
    if run_image.simulated:
        warnings.append(f"SIMULATED: {run_image.name} stands in for {image.name} (no GPU math: timings are modelled)")
    return run_image


def _refuse_unfit(
    inventory: Inventory, resolved: ResolvedRecipe, topology: Topology, run_image: ImageDefinition
) -> None:
    """ConfigError when the topology cannot run here: too few nodes, or torchrun without the image's launcher."""
    if len(inventory.nodes) < topology.min_nodes:
        raise ConfigError(
            Problem(
                inventory.source,
                "nodes",
                f"the {resolved.topology} topology needs at least "
                f"{topology.min_nodes} nodes, this inventory has {len(inventory.nodes)}",
                "add the second Spark or use --topology solo",
            )
        )
    if (
        resolved.topology in ("cluster", "replicas")
        and resolved.backend == "torchrun"
        and "torchrun" not in run_image.launchers
    ):
        raise ConfigError(
            Problem(
                f"images/{run_image.name}/manifest.yaml",
                "launchers",
                "declares no torchrun serving launcher",
                "use --backend ray or native",
            )
        )


def build_deployment(
    inventory: Inventory,
    resolved: ResolvedRecipe,
    secrets: Secrets,
    solo_node: str | None = None,
    metrics: bool | None = None,
    stack_name: str = "",
) -> Deployment:
    """Render everything for one recipe + topology. Pure: reads files in the repo, touches no host.
    metrics: add Prometheus on the head node (None: the inventory's cluster.metrics).
    stack_name: the deployment's name in a stack (deploy/stack/converge.py): in its container names and labels."""
    ref = resolved.recipe.image
    image = registry_image(ref, str(resolved.source)) if is_reference(ref) else load_definition(ref)
    warnings = list(resolved.warnings) + list(secrets.warnings)
    check_engine_topology(resolved)
    run_image = _run_image(inventory, resolved, image, warnings)
    topology = REGISTRY[resolved.topology]
    _refuse_unfit(inventory, resolved, topology, run_image)

    warnings += check_env(resolved.recipe.env, image)
    ctx = Context(
        inventory=inventory,
        resolved=resolved,
        image=image,
        run_image=run_image,
        secrets=secrets,
        solo_node=inventory.node(solo_node) if solo_node else None,
        deployment=stack_name,
    )
    nodes, endpoint, backends = topology.build(ctx)
    metrics_url = None
    if inventory.cluster.metrics if metrics is None else metrics:
        metrics_url = add_prometheus(ctx, nodes)
    guard_deploy.add_guard(ctx, nodes)  # the memory guard on every engine node (sparkdeploy/guard, #29)
    dep = Deployment(
        inventory=inventory,
        recipe=resolved,
        image=image,
        image_tag=run_image.tag,
        nodes=nodes,
        endpoint=endpoint,
        backends=backends,
        warnings=warnings + ctx.warnings,
        secrets=secrets,
        metrics_url=metrics_url,
        engine_groups=ctx.engine_groups,
    )
    clashes = ports.deployment_problems(dep, inventory.source)  # one port map per node, before anything starts
    if clashes:
        raise ConfigError(clashes)
    return dep
