"""replicas: R engines of TP=k over k nodes each, behind the LiteLLM proxy on the head (`--tp 2` on four nodes =
two TP=2 engines). The 2xsolo lesson one level up: past some concurrency two independent engines, each with
its own batch budget, beat one engine twice as wide whose every layer waits on an all-reduce.

Each replica is a cluster engine (cluster.engine) on its group (layout.py: the inventory's `groups:` or the
nodes in order, k at a time), with its own rank 0, Ray head or torchrun master; the proxy reaches each
engine's rank 0 over the management network.
"""

from __future__ import annotations

from sparkdeploy.topologies import layout
from sparkdeploy.topologies.base import Context
from sparkdeploy.topologies.cluster import engine
from sparkdeploy.topologies.deployment import NodeDeployment
from sparkdeploy.topologies.twosolo import add_proxy


def build(ctx: Context) -> tuple[list[NodeDeployment], str, list[str]]:
    plan = layout.plan(ctx.inventory, ctx.resolved, default_tp=layout.DEFAULT_REPLICA_TP)
    if len(plan.groups) == 1:  # served, as asked; but it is cluster with a proxy hop in front
        ctx.warnings.append(
            f"replicas with TP={plan.tp} on {len(ctx.inventory.nodes)} nodes is one engine behind "
            "the proxy: nothing to balance, one more hop per request; use --topology cluster, or "
            "replicas on more nodes (or a smaller --tp)"
        )
    port = ctx.cluster.vllm_port
    nodes, backends = [], []
    for group in plan.groups:
        nodes += engine(ctx, list(group), plan.tp, 1)
        ctx.engine_groups.append([n.name for n in group])
        backends.append(("+".join(n.name for n in group), f"http://{group[0].url_host}:{port}/v1"))
    return nodes, add_proxy(ctx, nodes, backends), [url for _, url in backends]
