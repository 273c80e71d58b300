"""`sparkdeploy recipes fit`: the memory budget (budget.py) of a recipe and topology, per node.

Without an inventory: the recipe's own figures against DGX Sparks (budget.nominal), on the topology's node
count (--nodes, default its minimum). The deployment is rendered for that many nodes by the same code `up` runs
(topologies.build_deployment on a synthetic inventory, lint.synthetic_inventory), so `fit` refuses what `up` would
refuse: a topology on fewer nodes than it needs, a TP the nodes cannot be split into, a layout the model's
architecture does not allow. With an inventory: the rendered deployment's engine nodes, each node's live memory
read over SSH through the fact layer (the facts `resources`: MemAvailable, nvidia-smi), in parallel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkdeploy.config.inventory import Inventory, load_inventory
from sparkdeploy.config.secrets import Secrets
from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.facts import NodeFacts, read_facts
from sparkdeploy.recipes import budget
from sparkdeploy.recipes.recipe import resolve
from sparkdeploy.runtime.remote import NodeConnection, on_nodes
from sparkdeploy.topologies import REGISTRY, build_deployment
from sparkdeploy.topologies.lint import synthetic_inventory


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
        nominal = Inventory.model_validate(synthetic_inventory(count, "fit"))
        try:
            dep = build_deployment(nominal, resolved, Secrets())  # refuses what `up` refuses on that many nodes
        except ConfigError as exc:  # the synthetic inventory is --nodes: say so, with the fix that fits
            raise ConfigError(
                [
                    Problem(
                        f"--nodes {count}",
                        "",
                        p.message,
                        f"pass --nodes {REGISTRY[resolved.topology].min_nodes} or more, or another --topology",
                    )
                    if p.file == nominal.source
                    else p
                    for p in exc.problems
                ]
            ) from None
        report.budgets = [
            budget.nominal(recipe, dep.engine_size(nd.node.name), nd.node.name) for nd in dep.nodes if nd.runs_engine
        ]
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
