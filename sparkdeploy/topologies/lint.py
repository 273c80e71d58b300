"""`recipes lint`: render every recipe x supported topology x backend with a synthetic two-node inventory."""

from __future__ import annotations

from typing import Any

from sparkdeploy.config.inventory import Inventory
from sparkdeploy.config.secrets import Secrets
from sparkdeploy.errors import ConfigError
from sparkdeploy.recipes import recipe as recipes_mod
from sparkdeploy.recipes.engines.registered import engine_of
from sparkdeploy.topologies import build_deployment


def synthetic_inventory(nodes: int = 2, name: str = "lint") -> dict[str, Any]:
    """An inventory of `nodes` DGX Sparks with documentation addresses (RFC 5737), never connected to: what
    `recipes lint` renders against, and what `recipes fit` without an inventory asks `up`'s judges about."""
    return {
        "cluster": {"name": name},
        "nodes": [
            {
                "name": f"spark{i + 1}",
                "role": "head" if i == 0 else "worker",
                "mgmt_ip": f"192.0.2.{i + 1}",
                "fabric_ip": f"198.51.100.{i + 1}/24",
                "fabric_ifaces": ["enp1s0f1np1"],
                "hcas": ["rocep1s0f1", "roceP2p1s0f1"],
            }
            for i in range(nodes)
        ],
    }


LINT_INVENTORY = synthetic_inventory(2)


def combinations(recipe: recipes_mod.Recipe) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    backends = engine_of(recipe).multi_node_backends or recipes_mod.BACKENDS
    for topo in recipe.topologies:
        if topo == "cluster":
            out += [(topo, b) for b in backends]
        else:
            out.append((topo, None))
    return out


def lint_all(recipes_dir: str | None = None) -> list[dict[str, Any]]:
    inventory = Inventory.model_validate(LINT_INVENTORY)
    secrets = Secrets({"HF_TOKEN": "hf_lint", "LITELLM_MASTER_KEY": "sk-lint"}, source="lint")
    results = []
    for name, path in recipes_mod.recipe_files(recipes_dir).items():
        try:
            recipe, _, _ = recipes_mod.load_recipe(str(path))
        except ConfigError as exc:
            results.append(
                {
                    "recipe": name,
                    "topology": None,
                    "backend": None,
                    "ok": False,
                    "problems": [str(p) for p in exc.problems],
                    "warnings": [],
                }
            )
            continue
        for topo, backend in combinations(recipe):
            try:
                resolved = recipes_mod.resolve(str(path), topo, backend)
                dep = build_deployment(inventory, resolved, secrets)
                results.append(
                    {
                        "recipe": name,
                        "topology": topo,
                        "backend": backend,
                        "ok": True,
                        "problems": [],
                        "warnings": dep.warnings,
                    }
                )
            except ConfigError as exc:
                results.append(
                    {
                        "recipe": name,
                        "topology": topo,
                        "backend": backend,
                        "ok": False,
                        "problems": [str(p) for p in exc.problems],
                        "warnings": [],
                    }
                )
    return results
