"""Each member of a running stack as `status` shows it (issue 40): cold, starting, warm or stopping, read back
from the nodes through the fact layer: the gateway's routes (the `routes` fact of its state dir on the head node:
each member, its engines, its idle timeout when it is on demand, and why it is out) and each node's containers
(the `containers` fact). Pure: it judges facts read by the caller."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sparkdeploy.config.inventory import Inventory
from sparkdeploy.deploy.stack.routes import Routes, read_gateway
from sparkdeploy.errors import StepFailed
from sparkdeploy.facts import NodeFacts
from sparkdeploy.labels import DEPLOYMENT_LABEL, NOT_ENGINES, ROLE_LABEL
from sparkdeploy.runtime.session import Session
from sparkdeploy.topologies.running_stack import deployments_on

COLD, STARTING, WARM, STOPPING = "cold", "starting", "warm", "stopping"
STOPPING_WHY = "stopping"  # a routes `out` reason that starts so: the member leaves the routes before it stops


def member_state(name: str, routes: Routes, facts: Mapping[str, NodeFacts | Exception]) -> dict[str, Any]:
    """One member's row: its state and why, its engines running / listed, on demand or not."""
    engines = [
        c
        for f in facts.values()
        if isinstance(f, NodeFacts)
        for c in f.containers
        if c.labels.get(DEPLOYMENT_LABEL) == name and c.labels.get(ROLE_LABEL) not in NOT_ENGINES
    ]
    running = [c for c in engines if c.running]
    out = routes.out.get(name, "")
    if not running:
        state, why = COLD, out.removeprefix(f"{COLD}: ") or "no engine runs"  # up says `cold: WHY`
    elif out.startswith(STOPPING_WHY):
        state, why = STOPPING, out
    elif routes.routed(name) and all(c.health in ("healthy", "") for c in running):
        state, why = WARM, "routed by the gateway"
    elif routes.groups[name].idle_timeout is not None and all(c.health == "healthy" for c in running):
        # started on a request (routes.json still says cold): the gateway routes it while its watcher says ok
        state, why = WARM, "started on demand, routed by the gateway while healthy"
    else:
        state, why = STARTING, out or ", ".join(f"{c.name} {c.health or c.status}" for c in running)
    g = routes.groups[name]
    return {
        "deployment": name,
        "model": g.model,
        "on_demand": g.idle_timeout is not None,
        "idle_timeout_s": g.idle_timeout,
        "state": state,
        "why": why,
        "engines_running": len(running),
        "engines": len(g.engines),
        # the hook's record of requests (last request, idle time) is not built yet (docs/stack.md): None here
        "last_request": None,
        "idle_s": None,
    }


def member_states(routes: Routes | None, facts: Mapping[str, NodeFacts | Exception]) -> list[dict[str, Any]]:
    """Every member of the stack the gateway routes (none: no gateway, or a single deployment)."""
    if routes is None:
        return []
    return [member_state(name, routes, facts) for name in sorted(routes.groups)]


def cold_fix(inv: Inventory, deployment: str) -> str | None:
    """What `top`/`logs --deployment D` say when nothing of D runs and D is an on-demand member (cold: started by
    a request through the gateway), not `run up first`; None otherwise (or the head cannot be read)."""
    with Session.open(inv) as session:
        try:
            routes = read_gateway(session, inv).routes
        except StepFailed:
            return None
    g = routes.groups.get(deployment) if routes is not None else None
    if g is None or g.idle_timeout is None:
        return None
    return (
        f"deployment {deployment} is on demand and cold (not running): a request for {g.model} through the gateway "
        f"starts it (stopped again after {g.idle_timeout} s idle)"
    )


def read_members(
    session: Session, inv: Inventory, facts: Mapping[str, NodeFacts | Exception], deployment: str | None = None
) -> list[dict[str, Any]]:
    """`status`' members: the routes read from the head node (one round trip, only where a stack runs); [] when
    no stack runs or the head cannot be read (status lists the head as unreachable already)."""
    if not deployments_on(dict(facts)) or not isinstance(facts.get(inv.head.name), NodeFacts):
        return []
    try:
        routes = read_gateway(session, inv).routes
    except StepFailed:
        return []
    return [r for r in member_states(routes, facts) if deployment in (None, r["deployment"])]
