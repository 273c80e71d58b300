"""The model check `up` runs before starting any container: the recipe's model complete on every engine node.

Engines start with HF_HUB_OFFLINE=1, so a node without the model would fail to serve instead of downloading
on its own: `up` fails preflight naming the node and the `models pull` command that fixes it, or pulls with
`--pull-model`. A simulated engine (the lab's vllm-sim) reads no weights: there a model absent from every
engine node passes (the demo recipes name models the lab hub does not serve); a copy that is present but
incomplete or corrupt still fails, as it would on real Sparks.
"""

from __future__ import annotations

from sparkdeploy.checks import Result, fail, ok
from sparkdeploy.errors import ConfigError, StepFailed
from sparkdeploy.models.listing import presence
from sparkdeploy.models.ops import hub_image_tag, pull_command, recipe_ref
from sparkdeploy.topologies.deployment import Deployment


def engine_nodes(dep: Deployment):
    return [nd.node for nd in dep.nodes if nd.runs_engine]


def model_of(dep: Deployment):
    try:
        return recipe_ref(dep)
    except ConfigError:
        return None  # a local path or another non-hub name: nothing to pull or verify


def checks(dep: Deployment, conns, simulated: bool) -> list[Result]:
    ref = model_of(dep)
    nodes = engine_nodes(dep)
    if ref is None or not nodes:
        return []
    found = presence(conns, nodes, dep.inventory.cluster.hf_cache, ref)
    if simulated and all(p.state == "absent" for p in found):
        return [_row(p.node, ok(f"{ref}: not here; the simulated engine reads no weights")) for p in found]
    inv_arg = str(dep.inventory.path) if dep.inventory.path else None
    fix = f"{pull_command(ref, inv_arg)} (or run up with --pull-model)"
    expected = "the model complete in the node's HF cache"
    return [
        _row(p.node, ok(p.detail, expected) if p.state == "complete" else fail(p.detail, expected, fix)) for p in found
    ]


def _row(node: str, r: Result) -> Result:
    """A preflight row of `up` (doctor's Result; check name `model`)."""
    r.check, r.node = "model", node
    return r


def pull(dep: Deployment, conns, say) -> None:
    """`up --pull-model`: the pull, from the head to every engine node."""
    from sparkdeploy.models.pull import Puller  # models.pull: ~8 ms that every `up` without --pull-model skips

    ref = model_of(dep)
    inv = dep.inventory
    result = Puller(inv, conns, dep.secrets, hub_image_tag(dep), None, say).pull(ref, inv.head, engine_nodes(dep))
    failed = [r for r in result.nodes.values() if not r.ok]
    if failed:
        raise StepFailed("; ".join(r.error or f"{r.node}: {r.action}" for r in failed))
    say(f"model {ref} ready on " + ", ".join(result.nodes))
