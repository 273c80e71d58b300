"""Entry points: prepare a run (load and render, no network) and execute the selected checks."""

from __future__ import annotations

import dataclasses
from typing import Any

from sparkdeploy.config.inventory import Node, load_inventory
from sparkdeploy.config.secrets import load_secrets
from sparkdeploy.errors import ConfigError
from sparkdeploy.facts import read_facts
from sparkdeploy.images.definitions import load_definition
from sparkdeploy.recipes.recipe import resolve
from sparkdeploy.runtime.remote import on_nodes
from sparkdeploy.topologies import build_deployment
from sparkdeploy.topologies import running_stack as stack

from .doctor_run import DoctorRun, Options
from .registry import CHECKS
from .runner import Report, execute, select
from .testinfra_run import resolve_paths


def prepare(inventory_path: str | None, options: Options, recipes_dir: str | None = None) -> DoctorRun:
    """Load the inventory and secrets, and render the recipe given with --recipe (else the runner renders what
    the nodes run, once connected). Problems become check rows, not exceptions."""
    try:
        inventory = load_inventory(inventory_path)
    except ConfigError as exc:
        return DoctorRun(inventory=None, inventory_error=exc, options=options)
    run = DoctorRun(inventory=inventory, options=options)
    try:
        run.secrets = load_secrets(inventory.local_path(inventory.cluster.secrets_file))
    except ConfigError as exc:
        run.deployment_error = exc
        return run
    if options.recipe:
        render(run, options.recipe, options.topology, None, "given with --recipe", recipes_dir)
    else:  # what runs is what to check: read from the nodes' manifests once they are connected (runner)
        run.render_later = lambda r: render_deployed(r, recipes_dir)
    return run


def render(
    run: DoctorRun, name: str | None, topology: str | None, backend: str | None, source: str, recipes_dir: str | None
) -> None:
    """The deployment the recipe checks look at (its image, memory, ports); a problem becomes a check row."""
    run.recipe_name, run.recipe_source = name, source
    if not name:
        return
    try:
        resolved = resolve(name, topology, backend, (), recipes_dir)
        run.deployment = build_deployment(run.inventory, resolved, run.secrets)  # type: ignore[arg-type]  # called only with a loaded inventory
        override = run.inventory.cluster.image_override  # type: ignore[union-attr]  # called only with a loaded inventory
        run.simulated_image = (load_definition(override) if override else run.deployment.image).simulated
    except ConfigError as exc:
        run.deployment = None
        run.deployment_error = exc


def render_deployed(run: DoctorRun, recipes_dir: str | None) -> None:
    """The recipe, topology and backend the nodes' manifests name (the head's first), read over the sessions the
    runner opened; with nothing deployed (or no node read), the inventory's default recipe, saying so."""
    state_dir = run.inventory.cluster.state_dir  # type: ignore[union-attr]  # called only with a loaded inventory
    nodes = sorted((n for n in run.nodes if run.reachable(n)), key=lambda n: n.role != "head")
    outcomes = on_nodes(nodes, lambda n: read_facts(run.session(n).conn, state_dir))
    found = [(o.node.name, o.value.manifest) for o in outcomes if o.ok and (o.value.manifest or {}).get("recipe")]
    running = stack.deployments_on({o.node.name: o.value for o in outcomes if o.ok}) - set(stack.RESERVED)
    if running and not found and not run.options.recipe:
        render_stack(run, nodes, sorted(running), recipes_dir)
    elif found:
        manifest = found[0][1]
        render(
            run,
            manifest["recipe"],
            run.options.topology or manifest.get("topology"),
            manifest.get("backend"),
            f"deployed on {', '.join(name for name, _ in found)}",
            recipes_dir,
        )
    else:
        why = "nothing is deployed" if nodes else "no node could be read"
        render(
            run,
            run.inventory.cluster.default_recipe,  # type: ignore[union-attr]  # called only with a loaded inventory
            run.options.topology,
            None,
            f"{why}: the inventory's default recipe",
            recipes_dir,
        )


def render_stack(run: DoctorRun, nodes: list[Node], names: list[str], recipes_dir: str | None) -> None:
    """The deployments of the stack that runs (or only --deployment NAME), each rendered again from its manifest
    (running_stack.py `rebuild`): the recipe checks run once per deployment (runner.execute)."""
    inv = run.inventory
    assert inv is not None  # called only with a loaded inventory
    if run.options.deployment:
        names = [n for n in names if n == run.options.deployment]
    run.recipe_source = f"a stack runs: {', '.join(names) or 'none of --deployment'}"
    for name in names:
        sd = stack.state_dir_of(inv, name)

        def manifest_of(node: Node, sd: str = sd) -> dict[str, Any] | None:
            return read_facts(run.session(node).conn, sd).manifest

        manifest = next((o.value for o in on_nodes(nodes, manifest_of) if o.ok and o.value), None)
        try:
            run.stack.append((name, stack.rebuild(inv, run.secrets, name, manifest or {}, recipes_dir)))
        except ConfigError as exc:
            run.deployment_error = exc
    if run.stack:
        override = inv.cluster.image_override
        run.simulated_image = (load_definition(override) if override else run.stack[0][1].image).simulated


def doctor(
    inventory_path: str | None,
    options: Options | None = None,
    only: tuple[str, ...] = (),
    recipes_dir: str | None = None,
) -> Report:
    options = options or Options()
    checks = select(CHECKS, only, options)  # a bad --only is a ConfigError before anything runs
    run = prepare(inventory_path, options, recipes_dir)
    # The owner's testinfra modules: --tests, else the inventory's cluster.doctor_tests; a missing path: exit 2.
    tests = resolve_paths(options.tests, run.inventory)
    if tests != options.tests:
        run.options = options = dataclasses.replace(options, tests=tests)
        checks = select(CHECKS, only, options)
    return execute(run, checks)
