"""The model check `up` runs before starting any container: the recipe's model complete on every engine node.

Engines start with HF_HUB_OFFLINE=1, so a node without the model, or without its speculative draft (a recipe's
`speculative.model`: part of the model, docs/speculative.md), would fail to serve instead of downloading on its
own: `up` fails preflight naming the node and the `models pull` command that fixes it, or pulls with
`--pull-model`. A simulated engine (the lab's vllm-sim) reads no weights: there a model absent from every
engine node passes (the demo recipes name models the lab hub does not serve); a copy that is present but
incomplete or corrupt still fails, as it would on real Sparks. doctor's `model.present` is this same check
(sparkdeploy/doctor/model_cache.py), one row per engine node it reaches.
"""

from __future__ import annotations

from collections.abc import Callable

from sparkdeploy.checks import Result, fail, ok
from sparkdeploy.config.inventory import Node
from sparkdeploy.errors import ConfigError, StepFailed
from sparkdeploy.models.listing import presence
from sparkdeploy.models.ops import (
    ModelRef,
    hub_image_tag,
    pull_command,
    recipe_pull_command,
    recipe_ref,
    recipe_refs,
)
from sparkdeploy.recipes.engines.registered import engine_of
from sparkdeploy.runtime.remote import NodeConnection
from sparkdeploy.topologies.deployment import Deployment


def engine_nodes(dep: Deployment) -> list[Node]:
    return [nd.node for nd in dep.nodes if nd.runs_engine]


def model_of(dep: Deployment) -> ModelRef | None:
    try:
        return recipe_ref(dep)
    except ConfigError:
        return None  # a local path or another non-hub name: nothing to pull or verify


def refs_of(dep: Deployment) -> list[ModelRef]:
    """The model and its speculative draft, each a hub id (a local path: nothing to pull or verify)."""
    r = dep.recipe.recipe
    spec = r.speculative
    try:
        files = tuple(engine_of(r).model_files(r))
        return recipe_refs(r.model, spec.model if spec else None, spec.revision if spec else None, include=files)
    except ConfigError:
        return []


def checks(
    dep: Deployment, conns: dict[str, NodeConnection], simulated: bool, only: set[str] | None = None
) -> list[Result]:
    """One row per engine node and ref (the model, then its draft); `only`: these nodes (doctor: the reachable)."""
    nodes = [n for n in engine_nodes(dep) if only is None or n.name in only]
    refs = refs_of(dep)
    if not refs or not nodes:
        return []
    inv_arg = str(dep.inventory.path) if dep.inventory.path else None
    recipe_arg = dep.recipe.name
    rows: list[Result] = []
    for i, ref in enumerate(refs):
        what = "the model" if i == 0 else "the speculative draft"
        found = presence(conns, nodes, dep.inventory.cluster.hf_cache, ref)
        if simulated and all(p.state == "absent" for p in found):
            rows += [_row(p.node, ok(f"{ref}: not here; the simulated engine reads no weights")) for p in found]
            continue
        # the draft comes with its recipe's pull: `models pull RECIPE` fetches the model and the draft
        pull = pull_command(ref, inv_arg) if i == 0 else recipe_pull_command(recipe_arg, inv_arg)
        fix = f"{pull} (or run up with --pull-model)"
        expected = f"{what} complete in the node's HF cache"
        data = {"ref": str(ref), "role": "model" if i == 0 else "draft"}
        rows += [
            _row(
                p.node,
                ok(p.detail, expected, data={**data, "state": p.state})
                if p.state == "complete"
                else fail(p.detail, expected, fix, data={**data, "state": p.state, "pull": pull}),
            )
            for p in found
        ]
    return rows


def _row(node: str, r: Result) -> Result:
    """A preflight row of `up` (doctor's Result; check name `model`)."""
    r.check, r.node = "model", node
    return r


def pull(dep: Deployment, conns: dict[str, NodeConnection], say: Callable[[str], None]) -> None:
    """`up --pull-model`: the pull, from the head to every engine node."""
    from sparkdeploy.models.pull import Puller  # models.pull: ~8 ms that every `up` without --pull-model skips

    inv = dep.inventory
    for ref in refs_of(dep):  # the model, then its speculative draft: each downloaded once, copied over the fabric
        result = Puller(inv, conns, dep.secrets, hub_image_tag(dep), None, say).pull(ref, inv.head, engine_nodes(dep))
        failed = [r for r in result.nodes.values() if not r.ok]
        if failed:
            raise StepFailed("; ".join(r.error or f"{r.node}: {r.action}" for r in failed))
        say(f"model {ref} ready on " + ", ".join(result.nodes))
