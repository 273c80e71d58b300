"""Entry points: prepare a run (load and render, no network) and execute the selected checks."""

from __future__ import annotations

from sparkdeploy.errors import ConfigError
from sparkdeploy.inventory import load_inventory

from .registry import CHECKS
from .runner import Report, execute, select
from .session import DoctorRun, Options


def prepare(inventory_path: str | None, options: Options, recipes_dir: str | None = None) -> DoctorRun:
    """Load the inventory, secrets and the recipe's deployment. Problems become check rows, not exceptions."""
    try:
        inventory = load_inventory(inventory_path)
    except ConfigError as exc:
        return DoctorRun(inventory=None, inventory_error=exc, options=options)
    run = DoctorRun(inventory=inventory, options=options)
    try:
        from sparkdeploy.secrets import load_secrets

        run.secrets = load_secrets(inventory.local_path(inventory.cluster.secrets_file))
    except ConfigError as exc:
        run.deployment_error = exc
        return run
    name = options.recipe or inventory.cluster.default_recipe
    run.recipe_name = name
    if not name:
        return run
    try:
        from sparkdeploy.images.definitions import load_definition
        from sparkdeploy.recipes import resolve
        from sparkdeploy.topologies import build_deployment

        resolved = resolve(name, options.topology, None, (), recipes_dir)
        run.deployment = build_deployment(inventory, resolved, run.secrets)
        override = inventory.cluster.image_override
        run.simulated_image = (load_definition(override) if override else run.deployment.image).simulated
    except ConfigError as exc:
        run.deployment = None
        run.deployment_error = exc
    return run


def doctor(inventory_path: str | None, options: Options | None = None, only: tuple[str, ...] = (),
           recipes_dir: str | None = None) -> Report:
    options = options or Options()
    checks = select(CHECKS, only, options)  # a bad --only is a ConfigError before anything runs
    run = prepare(inventory_path, options, recipes_dir)
    return execute(run, checks)
