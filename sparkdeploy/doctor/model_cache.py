"""model.present: the recipe's model and its speculative draft complete and verified in each engine node's HF cache.

The same check `up` runs before starting any engine (sparkdeploy/models/up_check.py, over the one reading of a
node's cache: models/listing.py `presence`, the nodeside `models status` program): engines start with
HF_HUB_OFFLINE=1, so a node without the model or its draft (docs/speculative.md) would fail to serve. A failing
row names the node and the pull that fixes it (`models pull RECIPE` for the draft, which brings both). Read once
for every engine node doctor reaches (a simulated engine passes a model absent from all of them, as in `up`).
"""

from __future__ import annotations

import copy

from sparkdeploy.checks import Result, skip
from sparkdeploy.config.inventory import Node
from sparkdeploy.models import up_check

from .check_context import SessionContext


def present(run: SessionContext, node: Node) -> list[Result]:
    dep = run.deployment
    nd = run.node_deployment(node)
    if dep is None or nd is None or not nd.runs_engine:
        return [skip(f"no engine of this recipe/topology runs on {node.name}")]
    if not up_check.refs_of(dep):
        return [skip(f"{dep.recipe.recipe.model}: not a hub model (a local path): nothing to verify")]
    reached = {n.name for n in run.nodes if run.reachable(n)}
    key = ("model.present", dep.recipe.name, id(dep))

    def read() -> list[Result]:
        conns = {name: run.session(n).conn for n in run.nodes if (name := n.name) in reached}
        return up_check.checks(dep, conns, run.simulated_image, only=reached)

    rows = [copy.copy(r) for r in run.memo.get(key, read) if r.node == node.name]
    for r in rows:
        r.check = ""  # the runner names it (model.present), not up's preflight name
    return rows
