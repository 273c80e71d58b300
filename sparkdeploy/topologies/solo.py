"""solo: one vLLM on one node (TP=1). The other node stays free for something else."""

from __future__ import annotations

from sparkdeploy.deployment import NodeDeployment
from sparkdeploy.topologies.base import SERVING_CONTAINER, Context
from sparkdeploy.vllm_args import check_args, serve_args


def build(ctx: Context) -> tuple[list[NodeDeployment], str, list[str]]:
    node = ctx.solo_node or ctx.inventory.head
    port = ctx.cluster.vllm_port
    args = serve_args(ctx.resolved, ctx.image, port)
    check_args(args, ctx.image, str(ctx.resolved.source))
    nd = NodeDeployment(node=node, state_dir=ctx.cluster.state_dir, files=ctx.common_files(node))
    ctx.container(
        nd,
        role="solo",
        name=SERVING_CONTAINER,
        entry_template="entry-vllm.sh.j2",
        entry_name="vllm.entry.sh",
        image_tag=ctx.run_image.tag,
        gpus=True,
        ports=(port,),
        health_port=port,
        args=args,
        headless=False,
    )
    return [nd], f"http://{node.url_host}:{port}/v1", []
