"""2xsolo: one vLLM per node (TP=1 each) behind a LiteLLM proxy on the head; on N nodes, N engines (the name
stays: "four Sparks as 2xsolo" is 4xsolo).

Wins at high concurrency and for prefill-heavy load: each engine batches its own prefills (seed 002:
+211% prefill and -39% TTFT at c64 against cluster TP=2). The proxy reaches the engines over the management
network: 2xsolo does not need the fabric link at all.
"""

from __future__ import annotations

from typing import Any

from sparkdeploy.recipes.recipe import FAILOVER_ALLOWED_FAILS
from sparkdeploy.topologies.base import PROXY_CONTAINER, Context
from sparkdeploy.topologies.deployment import Listen, NodeDeployment

PROXY_IMAGE = "litellm-proxy"


def litellm_config(ctx: Context, backends: list[tuple[str, str]]) -> dict[str, Any]:
    name = ctx.recipe.public_name
    return {
        "model_list": [
            {
                "model_name": name,
                "litellm_params": {"model": f"hosted_vllm/{name}", "api_base": url, "api_key": "EMPTY"},
                "model_info": {"id": node_name, "allowed_fails": FAILOVER_ALLOWED_FAILS},
            }
            for node_name, url in backends
        ],
        "router_settings": ctx.recipe.litellm.router_settings(),
        # /metrics (needs the master key): per-backend request counts for `sparkdeploy top` and Prometheus.
        "litellm_settings": {"callbacks": ["prometheus"]},
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
    }


def add_proxy(ctx: Context, nodes: list[NodeDeployment], backends: list[tuple[str, str]]) -> str:
    """The LiteLLM proxy on the head node, in front of `backends` ((engine id, base URL)); returns the endpoint.
    In a stack the stack's one gateway routes to the engines instead: no proxy, the first engine's URL."""
    if ctx.deployment:
        return backends[0][1]
    if not ctx.secrets.get("LITELLM_MASTER_KEY"):
        ctx.warnings.append(
            f"LITELLM_MASTER_KEY is not set: `up` will refuse {ctx.resolved.topology} until the secrets file has it"
        )
    proxy_port = ctx.cluster.proxy_port
    head = next(nd for nd in nodes if nd.node.role == "head")
    config_file = ctx.rendered(
        "litellm-config.yaml",
        "litellm-config.yaml.j2",
        config=litellm_config(ctx, backends),
        routing_strategy=ctx.recipe.litellm.routing_strategy,
    )
    ctx.side_container(
        head,
        role="proxy",
        name=PROXY_CONTAINER,
        entry="litellm",
        image=PROXY_IMAGE,
        listen=Listen(proxy_port, "the LiteLLM proxy", "cluster.proxy_port"),
        health_port=proxy_port,
        files=(config_file,),
        num_workers=ctx.recipe.litellm.num_workers,
    )
    return f"http://{head.node.url_host}:{proxy_port}/v1"


def build(ctx: Context) -> tuple[list[NodeDeployment], str, list[str]]:
    port = ctx.cluster.vllm_port
    args = ctx.engine_args(port)
    nodes = []
    backends = []
    for node in ctx.inventory.nodes:
        nd = NodeDeployment(node=node, state_dir=ctx.cluster.state_dir, files=ctx.common_files(node))
        ctx.engine_container(nd, role="backend", port=port, args=args)
        nodes.append(nd)
        backends.append((node.name, f"http://{node.url_host}:{port}/v1"))
    return nodes, add_proxy(ctx, nodes, backends), [url for _, url in backends]
