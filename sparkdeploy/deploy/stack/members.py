"""Each member of a running stack as `status` shows it (issue 40): cold, starting, warm or stopping, read back
from the nodes through the fact layer: the gateway's routes (the `routes` fact of its state dir on the head node:
each member, its engines, its idle timeout when it is on demand, and why it is out) and each node's containers
(the `containers` fact), and what each group's rank 0 watcher publishes in its guard's status.json (the
`guard_status` fact, guard/state.py's watched_groups): an on-demand member's last request, what is held or in
flight, since when it is idle, and its activator's last decision with its figures (nodeside/guard/activate.py).
Pure: it judges facts read by the caller."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from sparkdeploy.config.inventory import Inventory
from sparkdeploy.deploy.stack.routes import Routes, read_gateway
from sparkdeploy.errors import StepFailed
from sparkdeploy.facts import NodeFacts
from sparkdeploy.labels import DEPLOYMENT_LABEL, GROUP_LABEL, NOT_ENGINES, ROLE_LABEL
from sparkdeploy.runtime.session import Session
from sparkdeploy.topologies.running_stack import deployments_on

COLD, STARTING, WARM, STOPPING = "cold", "starting", "warm", "stopping"
STOPPING_WHY = "stopping"  # a routes `out` reason that starts so: the member leaves the routes before it stops


def member_state(
    name: str,
    routes: Routes,
    facts: Mapping[str, NodeFacts | Exception],
    watched: Mapping[str, dict[str, Any]] | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """One member's row: its state and why, its engines running / listed, on demand or not; from its groups'
    watchers (watched: group -> rank 0's watcher entry), its last request, idle time and last decision."""
    engines = [
        c
        for f in facts.values()
        if isinstance(f, NodeFacts)
        for c in f.containers
        if c.labels.get(DEPLOYMENT_LABEL) == name and c.labels.get(ROLE_LABEL) not in NOT_ENGINES
    ]
    running = [c for c in engines if c.running]
    seen = [w for gid in sorted({c.labels.get(GROUP_LABEL) or "" for c in engines}) if (w := (watched or {}).get(gid))]
    stopping = next((w["decision"] for w in seen if _stopping(w.get("decision"))), None)
    out = routes.out.get(name, "")
    if not running:
        state, why = COLD, out.removeprefix(f"{COLD}: ") or "no engine runs"  # up says `cold: WHY`
    elif out.startswith(STOPPING_WHY):
        state, why = STOPPING, out
    elif stopping is not None:  # its activator stops it (idle, or evicted for another member)
        state, why = STOPPING, str(stopping.get("reason") or "stopped by its activator")
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
        **usage(seen, state, time.time() if now is None else now),
    }


def _stopping(d: object) -> bool:
    """A watcher's decision that stops the group, not carried out yet (phase stop or stopping)."""
    return isinstance(d, dict) and d.get("action") == "stop" and d.get("phase") in ("stop", "stopping")


def usage(seen: list[dict[str, Any]], state: str, now: float) -> dict[str, Any]:
    """An on-demand member's last request (epoch s), requests held or in flight, idle time as its activator counts
    it (since its last request or its start, the later; only while it runs, 0 while requests are held or in
    flight) and its last decision (the latest of its groups'); None where its watchers published none."""
    demand = [w["on_demand"] for w in seen if isinstance(w.get("on_demand"), dict)]
    decisions = [w["activation"] for w in seen if isinstance(w.get("activation"), dict)]
    last = max((float(d["last_request"]) for d in demand if d.get("last_request")), default=None)
    busy = sum(int(d.get("waiting") or 0) + int(d.get("in_flight") or 0) for d in demand) if demand else None
    since = max((float(d["idle_from"]) for d in demand if d.get("idle_from")), default=None)
    idle = None
    if state in (WARM, STOPPING) and busy is not None:
        idle = 0.0 if busy else (round(max(0.0, now - since), 1) if since is not None else None)
    return {
        "last_request": last,
        "idle_s": idle,
        "busy": busy,
        "decision": max(decisions, key=lambda d: float(d.get("at") or 0)) if decisions else None,
    }


def member_states(
    routes: Routes | None,
    facts: Mapping[str, NodeFacts | Exception],
    watched: Mapping[str, dict[str, Any]] | None = None,
    now: float | None = None,
) -> list[dict[str, Any]]:
    """Every member of the stack the gateway routes (none: no gateway, or a single deployment)."""
    if routes is None:
        return []
    return [member_state(name, routes, facts, watched, now) for name in sorted(routes.groups)]


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
    session: Session,
    inv: Inventory,
    facts: Mapping[str, NodeFacts | Exception],
    deployment: str | None = None,
    watched: Mapping[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """`status`' members: the routes read from the head node (one round trip, only where a stack runs); [] when
    no stack runs or the head cannot be read (status lists the head as unreachable already)."""
    if not deployments_on(dict(facts)) or not isinstance(facts.get(inv.head.name), NodeFacts):
        return []
    try:
        routes = read_gateway(session, inv).routes
    except StepFailed:
        return []
    return [r for r in member_states(routes, facts, watched) if deployment in (None, r["deployment"])]


# -- as `status` prints them -------------------------------------------------------------------------------------


def ago(seconds: float) -> str:
    """12 s, 5 min, 2 h 5 min: a duration as a reader takes it in."""
    s = int(max(0.0, seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h {(s % 3600) // 60} min"


def usage_text(m: dict[str, Any], now: float) -> str:
    """`last request 12 s ago, idle 12 s of 300 s` (`2 request(s) held or in flight`; `no request yet`); "" for an
    always-on member, or where its watchers published nothing."""
    if not m["on_demand"] or m.get("busy") is None:
        return ""
    last = m.get("last_request")
    parts = [f"last request {ago(now - last)} ago" if last else "no request yet"]
    if m.get("busy"):
        parts.append(f"{m['busy']} request(s) held or in flight")
    elif m.get("idle_s") is not None:
        parts.append(f"idle {ago(m['idle_s'])} of {m['idle_timeout_s']} s")
    return ", ".join(parts)


def _figures(f: dict[str, Any]) -> str:
    """`spark1: small needs 0.45, room 0.93, beside chat 0.45 (always on), coder 0.45 (idle)`."""
    if not f:
        return ""
    beside = ", ".join(f"{r['deployment']} {r['share']:g} ({r['kept']})" for r in f.get("running") or [])
    return f"{f['node']}: {f['member']} needs {f['needs']:g}, room {f['room']:g}, beside {beside or 'nothing'}"


def decision_text(d: dict[str, Any], now: float) -> str:
    """The last decision, short (`evicted 40 s ago for small (least recently used idle member): spark1: small
    needs 0.45, room 0.93, beside ...`); the activator's own words are in --json (`why`) and the logs."""
    when, fig = f"{ago(now - float(d.get('at') or now))} ago", _figures(d.get("figures") or {})
    action = d.get("action")
    if action == "start":
        stopped = f", {', '.join(d['stopped'])} stopped for it" if d.get("stopped") else ""
        return f"started {when}{stopped}: {fig or d.get('why')}"
    if action == "evict":
        return f"stopping {', '.join(d.get('stopped') or [])} {when} to make room for it: {fig or d.get('why')}"
    if action == "wait":
        return f"waiting since {when} for {', '.join(d.get('busy') or [])} to go idle (busy now): {fig or d.get('why')}"
    if action == "stop" and d.get("evicted_for"):
        return f"evicted {when} for {d['evicted_for']} (least recently used idle member): {fig or d.get('why')}"
    if action == "stop" and d.get("idle_s") is not None:
        return f"stopped {when}: idle {ago(d['idle_s'])} of {d.get('idle_timeout')} s, its memory freed"
    return f"{action} {when}: {d.get('why')}"  # refuse: the reason, with the figures of the node lacking memory
