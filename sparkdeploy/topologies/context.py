"""Load everything a command needs, validated, before anything connects anywhere."""

from __future__ import annotations

from dataclasses import dataclass

from sparkdeploy.config.inventory import Inventory, load_inventory
from sparkdeploy.config.secrets import Secrets, load_secrets
from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.recipes.recipe import ResolvedRecipe, resolve
from sparkdeploy.topologies import build_deployment
from sparkdeploy.topologies.deployment import Deployment


def recipe_name_for(inventory: Inventory, recipe: str | None) -> str:
    name = recipe or inventory.cluster.default_recipe
    if not name:
        raise ConfigError(
            Problem(
                inventory.source,
                "cluster.default_recipe",
                "no recipe given and no default",
                "pass --recipe NAME or set cluster.default_recipe",
            )
        )
    return name


@dataclass(frozen=True)
class DeploymentSource:
    """What a deployment is rendered from, read and resolved once: the inventory, the recipe (with --set), the
    secrets, and --node / --metrics. `up` renders it again from this (never from the files) when a registry
    image's CLI was read just now."""

    inventory: Inventory
    resolved: ResolvedRecipe
    secrets: Secrets
    node: str | None = None
    metrics: bool | None = None

    def render(self) -> Deployment:
        return build_deployment(self.inventory, self.resolved, self.secrets, solo_node=self.node, metrics=self.metrics)


def load_source(
    inventory_path: str | None,
    recipe: str | None,
    topology: str | None = None,
    backend: str | None = None,
    sets: list[str] | tuple[str, ...] = (),
    recipes_dir: str | None = None,
    node: str | None = None,
    metrics: bool | None = None,
) -> DeploymentSource:
    """The inventory read, the recipe resolved (its --set values applied), the secrets read: once per command."""
    inventory = load_inventory(inventory_path)
    resolved = resolve(recipe_name_for(inventory, recipe), topology, backend, sets, recipes_dir)
    if node and resolved.topology != "solo":
        raise ConfigError(
            Problem(
                "--node", node, "only the solo topology runs on one chosen node", "drop --node or use --topology solo"
            )
        )
    secrets = load_secrets(inventory.local_path(inventory.cluster.secrets_file))
    return DeploymentSource(inventory, resolved, secrets, node, metrics)


def load_deployment(
    inventory_path: str | None,
    recipe: str | None,
    topology: str | None = None,
    backend: str | None = None,
    sets: list[str] | tuple[str, ...] = (),
    recipes_dir: str | None = None,
    node: str | None = None,
    metrics: bool | None = None,
) -> Deployment:
    """The deployment of a recipe on an inventory, rendered (load_source, then render)."""
    return load_source(inventory_path, recipe, topology, backend, sets, recipes_dir, node, metrics).render()
