"""cluster: one vLLM over every node, tensor parallel across the fabric (TP = number of nodes, or `--tp k`
with pipeline parallel over the N/k groups: TP=2 x PP=2 on four nodes; see layout.py).

Three ways to launch it, chosen by the recipe's cluster_backend or --backend:
- ray: a Ray head on rank 0's node, the other nodes joining over the fabric IPs; vLLM there drives all ranks;
- torchrun: torchrun on each node runs the serving launcher from the image; rank 0 serves HTTP and
  broadcasts requests over gloo, every rank steps the engine in lockstep (seed 004);
- native: the engine's own multi-node mode (vLLM's --nnodes/--node-rank/--master-addr with --headless workers;
  SGLang's --nnodes/--node-rank/--dist-init-addr, the only one SGLang has).
`engine` builds one such engine on any list of nodes: replicas.py uses it once per group.
"""

from __future__ import annotations

from typing import Any

from sparkdeploy.config.inventory import Node
from sparkdeploy.recipes.backend_features import check_backend_flags
from sparkdeploy.recipes.engines.interface import Distributed
from sparkdeploy.topologies import layout
from sparkdeploy.topologies.base import SERVING_CONTAINER, Context, engine_listen
from sparkdeploy.topologies.deployment import Listen, NodeDeployment

MASTER = "cluster.master_port"
RAY_JOIN_TIMEOUT_S = 600
RAY_JOIN_ATTEMPTS = 120


def engine(ctx: Context, ranks: list[Node], tp: int, pp: int) -> list[NodeDeployment]:
    """One multi-node engine: ranks[0] is rank 0 (serves HTTP), TP groups are consecutive ranks."""
    head = ranks[0]
    nnodes = len(ranks)
    port = ctx.cluster.vllm_port
    backend = ctx.resolved.backend
    group = ctx.engine_group(ranks)  # the unit the node-side watcher restarts (nodeside/guard/watch.py)
    out = []
    for rank, node in enumerate(ranks):
        nd = NodeDeployment(node=node, state_dir=ctx.cluster.state_dir, files=ctx.common_files(node, head))
        role = "head" if rank == 0 else "worker"
        common: dict[str, Any] = {
            "role": role,
            "name": SERVING_CONTAINER,
            "image_tag": ctx.run_image.tag,
            "gpus": True,
            "group": group,
        }
        if backend == "ray":
            if rank == 0:
                args = ctx.engine_args(port, Distributed(tp, pp, "ray"))
                ctx.container(
                    nd,
                    entry_template="entry-ray-head.sh.j2",
                    entry_name="ray-head.entry.sh",
                    ports=(engine_listen(port), Listen(ctx.cluster.ray_port, "the Ray head", "cluster.ray_port")),
                    health_port=port,
                    args=args,
                    ray_port=ctx.cluster.ray_port,
                    ip=node.fabric_address,
                    nnodes=nnodes,
                    join_timeout=RAY_JOIN_TIMEOUT_S,
                    **common,
                )
            else:
                ctx.container(
                    nd,
                    entry_template="entry-ray-worker.sh.j2",
                    entry_name="ray-worker.entry.sh",
                    ports=(),
                    health_port=None,
                    head_ip=head.fabric_address,
                    ray_port=ctx.cluster.ray_port,
                    ip=node.fabric_address,
                    join_attempts=RAY_JOIN_ATTEMPTS,
                    **common,
                )
        elif backend == "torchrun":
            args = ctx.engine_args(port, Distributed(tp, pp, "external_launcher"))
            check_backend_flags(args, backend, str(ctx.resolved.source))  # the launcher's server: issue 18
            ctx.container(
                nd,
                entry_template="entry-torchrun.sh.j2",
                entry_name="torchrun.entry.sh",
                ports=(engine_listen(port), Listen(ctx.cluster.master_port, "torchrun's rendezvous", MASTER))
                if rank == 0
                else (),
                health_port=port if rank == 0 else None,
                args=args,
                rank=rank,
                nnodes=nnodes,
                master_addr=head.fabric_address,
                master_port=ctx.cluster.master_port,
                launcher=ctx.run_image.launchers["torchrun"],
                **common,
            )
        else:  # native
            dist = Distributed(
                tp,
                pp,
                None,
                nnodes=nnodes,
                node_rank=rank,
                master_addr=head.fabric_address,
                master_port=ctx.cluster.master_port,
                headless=rank > 0,
            )
            args = ctx.engine_args(port, dist)
            title = ctx.engine.title
            master = Listen(ctx.cluster.master_port, f"{title}'s multi-node master", MASTER)
            ctx.container(
                nd,
                entry_template=ctx.engine.entry_template,
                entry_name=ctx.engine.entry_name,
                ports=(engine_listen(port, title), master) if rank == 0 else (),
                health_port=port if rank == 0 else None,
                args=args,
                headless=rank > 0,
                **common,
            )
        out.append(nd)
    return out


def build(ctx: Context) -> tuple[list[NodeDeployment], str, list[str]]:
    plan = layout.plan(ctx.inventory, ctx.resolved)
    ranks = plan.ranks
    ctx.engine_groups = [[n.name for n in ranks]]
    out = engine(ctx, ranks, plan.tp, plan.pp)
    return out, f"http://{ranks[0].url_host}:{ctx.cluster.vllm_port}/v1", []
