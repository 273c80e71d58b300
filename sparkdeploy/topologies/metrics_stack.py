"""`up --metrics` (or `cluster.metrics: true`): a real Prometheus on the head node, scraping every engine.

Prometheus is Debian bookworm's package in an image built like the others (images/prometheus, pinned). Its
config lists each serving container's /metrics on its node's management IP (vLLM's metric names) and, for
2xsolo, the LiteLLM proxy's /metrics, which needs the master key: Prometheus reads it from a 0600 file in
the state dir (`credentials_file`), never from its command line or its config. It is one more container
of the deployment (role `metrics`), so `up` plans it, `status` shows its URL and `down` removes it.
"""

from __future__ import annotations

from typing import Any

from sparkdeploy.topologies.base import Context
from sparkdeploy.topologies.deployment import FileSpec, Listen, NodeDeployment

PROMETHEUS_CONTAINER = "sparkdeploy-prometheus"
PROMETHEUS_IMAGE = "prometheus"
KEY_FILE = "prometheus-litellm.key"
SCRAPE_INTERVAL = "5s"
RETENTION = "15d"
ENGINE_ROLES = ("solo", "head", "backend")


def prometheus_config(nodes: list[NodeDeployment], with_key: bool) -> dict[str, Any]:
    engines, proxies = [], []
    for nd in nodes:
        for c in nd.containers:
            if c.health_port is None:
                continue
            target = {
                "targets": [f"{nd.node.url_host}:{c.health_port}"],
                "labels": {"node": nd.node.name, "container": c.name},
            }
            if c.role in ENGINE_ROLES:
                engines.append(target)
            elif c.role == "proxy":
                proxies.append(target)
    jobs: list[dict[str, Any]] = [{"job_name": "vllm", "static_configs": engines}]
    if proxies and with_key:
        jobs.append(
            {
                "job_name": "litellm",
                "authorization": {"type": "Bearer", "credentials_file": f"/sparkdeploy/{KEY_FILE}"},
                "static_configs": proxies,
            }
        )
    return {"global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": "15s"}, "scrape_configs": jobs}


def add_prometheus(ctx: Context, nodes: list[NodeDeployment]) -> str:
    """Add the Prometheus container to the head node's part of the deployment; returns its URL."""
    head = ctx.inventory.head
    nd = next((n for n in nodes if n.node.name == head.name), None)
    if nd is None:  # solo on another node: the head gets only Prometheus
        nd = NodeDeployment(node=head, state_dir=ctx.cluster.state_dir, files=ctx.common_files(head))
        nodes.append(nd)
    key = ctx.secrets.get("LITELLM_MASTER_KEY")
    proxied = any(c.role == "proxy" for n in nodes for c in n.containers)
    config = ctx.rendered("prometheus.yml", "prometheus.yml.j2", config=prometheus_config(nodes, bool(key)))
    extra = [config]
    if proxied and key:
        extra.append(FileSpec(KEY_FILE, key + "\n", mode=0o600, secret=True))
    elif proxied:
        ctx.warnings.append("metrics: no LITELLM_MASTER_KEY, so Prometheus cannot scrape the proxy")
    port = ctx.cluster.metrics_port
    ctx.side_container(
        nd,
        role="metrics",
        name=PROMETHEUS_CONTAINER,
        entry="prometheus",
        image=PROMETHEUS_IMAGE,
        listen=Listen(port, "Prometheus", "cluster.metrics_port"),
        health_port=None,
        files=tuple(extra),
        retention=RETENTION,
    )
    return f"http://{head.url_host}:{port}"
