"""Load everything a command needs, validated, before anything connects anywhere."""

from __future__ import annotations

from sparkdeploy.config.inventory import Inventory, load_inventory
from sparkdeploy.config.secrets import load_secrets
from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.recipes.recipe import resolve
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


def load_deployment(
    inventory_path: str | None,
    recipe: str | None,
    topology: str | None = None,
    backend: str | None = None,
    sets=(),
    recipes_dir: str | None = None,
    node: str | None = None,
    metrics: bool | None = None,
) -> Deployment:
    inventory = load_inventory(inventory_path)
    resolved = resolve(recipe_name_for(inventory, recipe), topology, backend, sets, recipes_dir)
    if node and resolved.topology != "solo":
        raise ConfigError(
            Problem(
                "--node", node, "only the solo topology runs on one chosen node", "drop --node or use --topology solo"
            )
        )
    secrets = load_secrets(inventory.local_path(inventory.cluster.secrets_file))
    return build_deployment(inventory, resolved, secrets, solo_node=node, metrics=metrics)
