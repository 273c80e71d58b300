"""cluster: one vLLM over every node, tensor parallel across the fabric link (TP = number of nodes).

Three ways to launch it, chosen by the recipe's cluster_backend or --backend:
- ray: a Ray head on the head node, workers joining over the fabric IPs; vLLM on the head drives all ranks;
- torchrun: torchrun on each node runs the serving launcher from the image; rank 0 serves HTTP and
  broadcasts requests over gloo, every rank steps the engine in lockstep (seed 004);
- native: vLLM's own multi-node mode (--nnodes/--node-rank/--master-addr, --headless workers).
"""

from __future__ import annotations

from sparkdeploy.backend_features import check_backend_flags
from sparkdeploy.deployment import NodeDeployment
from sparkdeploy.topologies.base import SERVING_CONTAINER, Context
from sparkdeploy.vllm_args import Distributed, check_args, serve_args

RAY_JOIN_TIMEOUT_S = 600
RAY_JOIN_ATTEMPTS = 120


def build(ctx: Context) -> tuple[list[NodeDeployment], str, list[str]]:
    nodes = sorted(ctx.inventory.nodes, key=lambda n: n.role != "head")  # head is rank 0
    head = nodes[0]
    tp = len(nodes)
    port = ctx.cluster.vllm_port
    backend = ctx.resolved.backend
    out = []
    for rank, node in enumerate(nodes):
        nd = NodeDeployment(node=node, state_dir=ctx.cluster.state_dir, files=ctx.common_files(node))
        role = "head" if rank == 0 else "worker"
        common = dict(role=role, name=SERVING_CONTAINER, image_tag=ctx.run_image.tag, gpus=True)
        if backend == "ray":
            if rank == 0:
                args = serve_args(ctx.resolved, ctx.image, port, Distributed(tp, "ray"))
                check_args(args, ctx.image, str(ctx.resolved.source))
                ctx.container(nd, entry_template="entry-ray-head.sh.j2", entry_name="ray-head.entry.sh",
                              ports=(port, ctx.cluster.ray_port), health_port=port, args=args,
                              ray_port=ctx.cluster.ray_port, ip=node.fabric_address, nnodes=tp,
                              join_timeout=RAY_JOIN_TIMEOUT_S, **common)
            else:
                ctx.container(nd, entry_template="entry-ray-worker.sh.j2", entry_name="ray-worker.entry.sh",
                              ports=(), health_port=None, head_ip=head.fabric_address,
                              ray_port=ctx.cluster.ray_port, ip=node.fabric_address,
                              join_attempts=RAY_JOIN_ATTEMPTS, **common)
        elif backend == "torchrun":
            args = serve_args(ctx.resolved, ctx.image, port, Distributed(tp, "external_launcher"))
            check_args(args, ctx.image, str(ctx.resolved.source))
            check_backend_flags(args, backend, str(ctx.resolved.source))  # the launcher's server: issue 18
            ctx.container(nd, entry_template="entry-torchrun.sh.j2", entry_name="torchrun.entry.sh",
                          ports=(port, ctx.cluster.master_port) if rank == 0 else (),
                          health_port=port if rank == 0 else None, args=args, rank=rank, nnodes=tp,
                          master_addr=head.fabric_address, master_port=ctx.cluster.master_port,
                          launcher=ctx.run_image.launchers["torchrun"], **common)
        else:  # native
            dist = Distributed(tp, None, nnodes=tp, node_rank=rank, master_addr=head.fabric_address,
                               master_port=ctx.cluster.master_port, headless=rank > 0)
            args = serve_args(ctx.resolved, ctx.image, port, dist)
            check_args(args, ctx.image, str(ctx.resolved.source))
            ctx.container(nd, entry_template="entry-vllm.sh.j2", entry_name="vllm.entry.sh",
                          ports=(port, ctx.cluster.master_port) if rank == 0 else (),
                          health_port=port if rank == 0 else None, args=args, headless=rank > 0, **common)
        out.append(nd)
    return out, f"http://{head.url_host}:{port}/v1", []
