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

from dataclasses import dataclass
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


@dataclass(frozen=True)
class _Rank:
    """One rank of a multi-node engine: its node, its place among the ranks, and the engine's shape."""

    node: Node
    rank: int
    head: Node  # rank 0: serves HTTP, hosts the rendezvous
    nnodes: int
    tp: int
    pp: int

    @property
    def first(self) -> bool:
        return self.rank == 0


def _ray_rank(ctx: Context, nd: NodeDeployment, r: _Rank, common: dict[str, Any]) -> None:
    """A Ray rank: the head starts Ray and serves; the others join it."""
    port = ctx.cluster.vllm_port
    if r.first:
        ctx.container(
            nd,
            entry_template="entry-ray-head.sh.j2",
            entry_name="ray-head.entry.sh",
            ports=(engine_listen(port), Listen(ctx.cluster.ray_port, "the Ray head", "cluster.ray_port")),
            health_port=port,
            args=ctx.engine_args(port, Distributed(r.tp, r.pp, "ray")),
            ray_port=ctx.cluster.ray_port,
            ip=r.node.fabric_address,
            nnodes=r.nnodes,
            join_timeout=RAY_JOIN_TIMEOUT_S,
            **common,
        )
        return
    ctx.container(
        nd,
        entry_template="entry-ray-worker.sh.j2",
        entry_name="ray-worker.entry.sh",
        ports=(),
        health_port=None,
        head_ip=r.head.fabric_address,
        ray_port=ctx.cluster.ray_port,
        ip=r.node.fabric_address,
        join_attempts=RAY_JOIN_ATTEMPTS,
        **common,
    )


def _torchrun_rank(ctx: Context, nd: NodeDeployment, r: _Rank, common: dict[str, Any]) -> None:
    """A torchrun rank: the image's launcher on every rank, rank 0 serving and hosting the rendezvous."""
    port = ctx.cluster.vllm_port
    args = ctx.engine_args(port, Distributed(r.tp, r.pp, "external_launcher"))
    check_backend_flags(args, "torchrun", str(ctx.resolved.source))  # the launcher's server: issue 18
    ctx.container(
        nd,
        entry_template="entry-torchrun.sh.j2",
        entry_name="torchrun.entry.sh",
        ports=(engine_listen(port), Listen(ctx.cluster.master_port, "torchrun's rendezvous", MASTER))
        if r.first
        else (),
        health_port=port if r.first else None,
        args=args,
        rank=r.rank,
        nnodes=r.nnodes,
        master_addr=r.head.fabric_address,
        master_port=ctx.cluster.master_port,
        launcher=ctx.run_image.launchers["torchrun"],
        **common,
    )


def _native_rank(ctx: Context, nd: NodeDeployment, r: _Rank, common: dict[str, Any]) -> None:
    """A rank of the engine's own multi-node mode: rank 0 serves, the others run headless."""
    port = ctx.cluster.vllm_port
    dist = Distributed(
        r.tp,
        r.pp,
        None,
        nnodes=r.nnodes,
        node_rank=r.rank,
        master_addr=r.head.fabric_address,
        master_port=ctx.cluster.master_port,
        headless=not r.first,
    )
    title = ctx.engine.title
    master = Listen(ctx.cluster.master_port, f"{title}'s multi-node master", MASTER)
    ctx.container(
        nd,
        entry_template=ctx.engine.entry_template,
        entry_name=ctx.engine.entry_name,
        ports=(engine_listen(port, title), master) if r.first else (),
        health_port=port if r.first else None,
        args=ctx.engine_args(port, dist),
        headless=not r.first,
        **common,
    )


def engine(ctx: Context, ranks: list[Node], tp: int, pp: int) -> list[NodeDeployment]:
    """One multi-node engine: ranks[0] is rank 0 (serves HTTP), TP groups are consecutive ranks."""
    head = ranks[0]
    backend = ctx.resolved.backend
    rank_container = _ray_rank if backend == "ray" else _torchrun_rank if backend == "torchrun" else _native_rank
    group = ctx.engine_group(ranks)  # the unit the node-side watcher restarts (nodeside/guard/watch.py)
    out = []
    for rank, node in enumerate(ranks):
        nd = NodeDeployment(node=node, state_dir=ctx.cluster.state_dir, files=ctx.common_files(node, head))
        common: dict[str, Any] = {
            "role": "head" if rank == 0 else "worker",
            "name": SERVING_CONTAINER,
            "image_tag": ctx.run_image.tag,
            "gpus": True,
            "group": group,
        }
        rank_container(ctx, nd, _Rank(node, rank, head, len(ranks), tp, pp), common)
        out.append(nd)
    return out


def build(ctx: Context) -> tuple[list[NodeDeployment], str, list[str]]:
    plan = layout.plan(ctx.inventory, ctx.resolved)
    ranks = plan.ranks
    ctx.engine_groups = [[n.name for n in ranks]]
    out = engine(ctx, ranks, plan.tp, plan.pp)
    return out, f"http://{ranks[0].url_host}:{ctx.cluster.vllm_port}/v1", []
