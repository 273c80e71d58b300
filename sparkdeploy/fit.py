"""`sparkdeploy recipes fit`: the memory budget (budget.py) of a recipe and topology, per node.

Without an inventory: the recipe's own figures against DGX Sparks (budget.nominal), on the topology's node
count (--nodes, default its minimum). With one: the rendered deployment's engine nodes, each node's live
memory read over SSH through the fact layer (the facts `resources`: MemAvailable, nvidia-smi), in parallel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkdeploy import budget
from sparkdeploy.facts import NodeFacts, read_facts
from sparkdeploy.inventory import load_inventory
from sparkdeploy.recipes import ResolvedRecipe, resolve
from sparkdeploy.remote import NodeConnection, on_nodes
from sparkdeploy.secrets import Secrets
from sparkdeploy.topologies import REGISTRY, build_deployment


@dataclass
class FitReport:
    recipe: str
    topology: str
    live: bool  # read from an inventory's nodes (else nominal DGX Sparks)
    budgets: list[budget.Budget] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # node -> why its memory could not be read

    @property
    def fits(self) -> bool:
        return not self.errors and all(b.fits for b in self.budgets)

    def as_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "topology": self.topology,
            "live": self.live,
            "fits": self.fits,
            "nodes": [b.as_dict() for b in self.budgets],
            "errors": self.errors,
        }


def nominal_engine_size(resolved: ResolvedRecipe, nodes: int) -> int:
    """How many nodes one engine spans: cluster all of them; replicas --tp (default 2); solo, 2xsolo one."""
    if resolved.topology == "cluster":
        return nodes
    if resolved.topology == "replicas":
        return min(nodes, resolved.recipe.tensor_parallel or 2)
    return 1


def fit(
    name: str,
    topology: str | None = None,
    sets: Sequence[str] = (),
    recipes_dir: str | None = None,
    inventory: str | None = None,
    nodes: int | None = None,
) -> FitReport:
    resolved = resolve(name, topology, None, tuple(sets), recipes_dir)
    recipe = resolved.recipe
    report = FitReport(resolved.name, resolved.topology, live=inventory is not None)
    if inventory is None:
        count = nodes or REGISTRY[resolved.topology].min_nodes
        size = nominal_engine_size(resolved, count)
        engines = 1 if resolved.topology == "solo" else count
        report.budgets = [budget.nominal(recipe, size, f"spark{i + 1}") for i in range(engines)]
        return report
    inv = load_inventory(inventory)
    dep = build_deployment(inv, resolved, Secrets())
    engine_nodes = [nd.node for nd in dep.nodes if nd.runs_engine]

    def read(node: Any) -> NodeFacts:
        conn = NodeConnection(node, inv)
        try:
            return read_facts(conn, inv.cluster.state_dir, what="resources")
        finally:
            conn.close()

    for outcome in on_nodes(engine_nodes, read):
        name_ = outcome.node.name
        if not outcome.ok:
            report.errors[name_] = str(outcome.error)
            continue
        b = budget.for_node(recipe, dep.engine_size(name_), outcome.value)
        if b is None:
            report.errors[name_] = "no memory figure (/proc/meminfo, nvidia-smi)"
        else:
            report.budgets.append(b)
    return report
