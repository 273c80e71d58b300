"""`status` as a library: per node our containers, image, uptime, health (asked of each endpoint), restarts and
last exit, and the deployment the nodes' manifests describe."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any, cast

from sparkdeploy.config.inventory import Inventory, Node, load_inventory
from sparkdeploy.daytwo import crashes
from sparkdeploy.deploy import health
from sparkdeploy.deploy.stack import converge as stack
from sparkdeploy.deploy.stack import members as stack_members
from sparkdeploy.facts import NodeFacts, gather_facts
from sparkdeploy.guard import state as guard_state
from sparkdeploy.labels import DEPLOYMENT_LABEL, GROUP_LABEL
from sparkdeploy.runtime.remote import on_nodes
from sparkdeploy.runtime.session import Session


def cluster_status(inventory: str | None = None, deployment: str | None = None) -> dict[str, Any]:
    """What runs on every node of the inventory (the `status --json` contract); a node that cannot be reached is
    listed with `reachable: false` and its error. deployment: only that deployment of a stack."""
    inv = load_inventory(inventory)
    with Session.open(inv) as session:
        facts = gather_facts(session, inv.nodes)
        stack.check_deployment(facts, deployment)
        ports = stack.health_ports(session, inv, facts)
        histories = _histories(session, inv, facts)
        if deployment is not None:
            facts = {n: stack.only(f, deployment) if isinstance(f, NodeFacts) else f for n, f in facts.items()}
        guards = guard_state.read_all(session, inv, facts)  # each guard's state (sparkdeploy/guard, #29)
        watched = guard_state.watched_groups(guards)  # each group as its watcher sees it (#43)
        nodes = [node_status(n, facts[n.name], histories.get(n.name), ports.get(n.name), watched) for n in inv.nodes]
        members = stack_members.read_members(session, inv, facts, deployment, watched)  # cold .. warm, last request
        for entry in nodes:
            if entry["name"] in guards:
                entry["guard"] = guards[entry["name"]]
    deployments = [n["deployment"] for n in nodes if n.get("deployment")]
    head = next((n for n in nodes if n["role"] == "head" and n.get("deployment")), None)
    dep_info = (head or {}).get("deployment") or (deployments[0] if deployments else None)
    all_containers = [c for n in nodes for c in n["containers"]]
    cold = {m["deployment"] for m in members if m["on_demand"] and m["state"] == "cold"}  # stopped on purpose
    data = {
        "inventory": inv.source,
        "deployed": bool(all_containers),
        "recipe": dep_info.get("recipe") if dep_info else None,
        "topology": dep_info.get("topology") if dep_info else None,
        "backend": dep_info.get("backend") if dep_info else None,
        "model": dep_info.get("model") if dep_info else None,
        "endpoint": dep_info.get("endpoint") if dep_info else None,
        "metrics_url": _metrics_url(inv, facts),
        "healthy": bool(all_containers)
        and all(
            c["running"] and (c["health"] is None or c["health"]["ok"])
            for c in all_containers
            if c.get("deployment") not in cold
        ),
        "nodes": nodes,
    }
    if members:
        data["members"] = members
    return data


def _probe(url: str) -> dict[str, Any]:
    try:
        code, _ = health.http_get(url, time.monotonic() + 3.0)
        return {"url": url, "ok": code == 200, "detail": f"HTTP {code}"}
    except health.HTTP_ERRORS as exc:  # unreachable endpoint: report it, never fail status on it
        reason = getattr(exc, "reason", exc)
        return {"url": url, "ok": False, "detail": f"{reason.__class__.__name__}: {reason}"}


def node_status(
    node: Node,
    f: NodeFacts | Exception,
    history: crashes.NodeHistory | None = None,
    stack_ports: dict[str, tuple[Any, Any]] | None = None,
    watched: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """history: the node's crashes.NodeHistory (restarts, last exit, health), when it could be read.
    stack_ports: container name -> (health port, role) of a stack's containers (their own manifests).
    watched: group -> its watcher's view (guard/state.watched_groups): restarts, and the exact first failure."""
    entry: dict[str, Any] = {"name": node.name, "mgmt_ip": node.mgmt_ip, "role": node.role}
    if not isinstance(f, NodeFacts):
        entry.update(reachable=False, error=str(f), containers=[], files=[])
        return entry
    manifest = f.manifest or {}
    health_ports = {
        c.get("name"): (c.get("health_port"), c.get("role"))
        for c in manifest.get("containers") or []
        if isinstance(c, dict)
    } | (stack_ports or {})
    containers = []
    for c in f.containers:
        port, role = health_ports.get(c.name, (None, c.role))
        probe = None
        if port and c.running:
            path = "/health/liveliness" if (role or c.role) == "proxy" else "/health"
            probe = _probe(f"http://{node.url_host}:{port}{path}")
        uptime = c.uptime_s()
        group = c.labels.get(GROUP_LABEL)
        watch = (watched or {}).get(group or "")
        containers.append(
            {
                "name": c.name,
                "role": c.role,
                "recipe": c.recipe,
                "topology": c.topology,
                "backend": c.label("backend") or None,
                "deployment": c.labels.get(DEPLOYMENT_LABEL),  # a stack's deployment; None: the single one
                "state": c.status,
                "running": c.running,
                "started_at": c.started_at,
                "uptime_s": None if uptime is None else round(uptime, 1),
                "restarts": c.restarts,
                "image": c.image_ref,
                "image_id": c.image_id,
                "config_hash": c.config_hash,
                "health": probe,
                "group": group,  # the engine group its watcher restarts as a whole (None: not an engine)
                "watch": watch,  # that group as its rank 0's watcher sees it (None: no watcher)
                **_crash_fields(history, c.name, watch),
            }
        )
    entry.update(
        reachable=True,
        docker=f.docker_ok,
        error=f.docker_error or None,
        containers=containers,
        files=list(f.manifest_files),
        deployment={k: manifest.get(k) for k in ("recipe", "topology", "backend", "model", "endpoint")}
        if manifest
        else None,
    )
    return entry


def _crash_fields(
    history: crashes.NodeHistory | None, name: str, watch: dict[str, Any] | None = None
) -> dict[str, Any]:
    h = history.containers.get(name) if history is not None else None
    if h is None or history is None:
        return {"last_exit": None, "crashes": "-"}
    if watch and watch.get("failing_since") and h.health == "unhealthy":  # the watcher saw the first failure itself
        h.failing_since = datetime.fromtimestamp(float(watch["failing_since"]), UTC)
    return {**h.as_dict(), "restarts": h.restarts, "crashes": crashes.summary(h, history.now)}


def _metrics_url(inv: Inventory, facts: dict[str, NodeFacts | Exception]) -> str | None:
    """Prometheus' URL when its container (role metrics) runs: the head node's management IP and its port."""
    for node in inv.nodes:
        f = facts.get(node.name)
        if not isinstance(f, NodeFacts):
            continue
        listed = (f.manifest or {}).get("containers") or []
        ports: dict[Any, Any] = {c.get("name"): c.get("ports") for c in listed if isinstance(c, dict)}
        for c in f.containers:
            if c.role == "metrics" and c.running and ports.get(c.name):
                return f"http://{node.url_host}:{ports[c.name][0]}"
    return None


def _histories(
    session: Session, inv: Inventory, facts: dict[str, NodeFacts | Exception]
) -> dict[str, crashes.NodeHistory]:
    """Each reachable node's container history (crashes.read); a node where it fails just shows none."""
    nodes = [n for n in inv.nodes if isinstance(f := facts.get(n.name), NodeFacts) and f.containers]
    return {
        o.node.name: cast(crashes.NodeHistory, o.value)
        for o in on_nodes(nodes, lambda n: crashes.read(session.conn(n)))
        if o.ok
    }
