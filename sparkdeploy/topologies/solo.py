"""solo: one engine on one node (TP=1). The other node stays free for something else."""

from __future__ import annotations

from sparkdeploy.topologies.base import Context
from sparkdeploy.topologies.deployment import NodeDeployment


def build(ctx: Context) -> tuple[list[NodeDeployment], str, list[str]]:
    node = ctx.solo_node or ctx.inventory.head
    port = ctx.cluster.vllm_port
    args = ctx.engine_args(port)
    nd = NodeDeployment(node=node, state_dir=ctx.cluster.state_dir, files=ctx.common_files(node))
    ctx.engine_container(nd, role="solo", port=port, args=args)
    return [nd], f"http://{node.url_host}:{port}/v1", []
