"""What a running stack (`up --stack`, deploy/stack/converge.py) leaves on the nodes, read by whoever looks at it
(deploy/, doctor/): its reserved unit names, each deployment's label and state dir, and a deployment rendered
again from the manifest `up --stack` wrote. Below deploy/ and doctor/, so neither imports the other for it."""

from __future__ import annotations

from typing import Any

from sparkdeploy.config.guard_settings import STACK_UNIT
from sparkdeploy.config.inventory import Inventory
from sparkdeploy.config.secrets import Secrets
from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.facts import NodeFacts
from sparkdeploy.labels import DEPLOYMENT_LABEL
from sparkdeploy.recipes.recipe import resolve
from sparkdeploy.topologies import build_deployment
from sparkdeploy.topologies.deployment import Deployment

GATEWAY = "gateway"  # the gateway's deployment name (reserved)
GUARD = STACK_UNIT  # the guards' deployment name (reserved): one memory guard per engine node
RESERVED = (GATEWAY, GUARD)


def state_dir_of(inventory: Inventory, name: str) -> str:
    return f"{inventory.cluster.state_dir}-{name}"


def sub_inventory(inv: Inventory, names: list[str], port: int, state_dir: str) -> Inventory:
    nodes = [inv.node(n).model_copy(update={"role": "head" if i == 0 else "worker"}) for i, n in enumerate(names)]
    cluster = inv.cluster.model_copy(update={"vllm_port": port, "state_dir": state_dir, "metrics": False})
    return inv.model_copy(update={"nodes": nodes, "cluster": cluster, "groups": None})


def deployments_on(facts: dict[str, NodeFacts | Exception]) -> set[str]:
    """The stack deployments whose containers run on the nodes (their labels), the gateway included."""
    return {
        c.labels[DEPLOYMENT_LABEL]
        for f in facts.values()
        if isinstance(f, NodeFacts)
        for c in f.containers
        if c.labels.get(DEPLOYMENT_LABEL)
    }


def rebuild(
    inv: Inventory, secrets: Secrets, name: str, manifest: dict[str, Any], recipes_dir: str | None = None
) -> Deployment:
    """A running stack deployment rendered again from its manifest (its recipe, topology, backend, nodes, port
    and --set values as `up --stack` recorded them): what doctor's recipe checks look at. ConfigError when the
    manifest lacks them (written before they were recorded) or the recipe no longer renders."""
    about = manifest.get("stack")
    if not isinstance(about, dict) or not manifest.get("recipe"):
        raise ConfigError(
            Problem(
                state_dir_of(inv, name),
                "manifest.json",
                f"deployment {name}'s manifest does not say how it was rendered",
                "run `sparkdeploy up --stack FILE` once (it changes no container)",
            )
        )
    sub = sub_inventory(inv, list(about["nodes"]), int(about["port"]), state_dir_of(inv, name))
    resolved = resolve(
        manifest["recipe"], manifest.get("topology"), manifest.get("backend"), about["sets"], recipes_dir
    )
    return build_deployment(sub, resolved, secrets, stack_name=name)
