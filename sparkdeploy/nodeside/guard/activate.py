"""The activator (issue 40, docs/stack.md "On-demand members"): the watcher's sibling on each node, standard
library only. The gateway's hook publishes each on-demand engine group's demand (GET /sparkdeploy/demand on the
gateway, read-only: requests held for its start, requests in flight, the last request's time); the watcher of the
group's rank 0 reads it once a look and asks `choose` what to do with the group:

- `start`: its rank is not running and a request is held for it: the watcher publishes a decision `start`, starts
  its rank, the other ranks' watchers follow (the same decisions as a restart's), and the gateway routes the model
  once this watcher says `ok` (healthy);
- `stop`: it runs, nothing is in flight and its last request (or its start, when none came yet) is older than its
  idle timeout: the decision `stop` (every rank stopped, restart policy `no`: a stopped container holds no memory).

Nothing here accepts a command from the network: the activator only reads the gateway's JSON and acts on its own
node's Docker engine through the watcher.
"""

from __future__ import annotations

import json
import urllib.request
from typing import TYPE_CHECKING, Any

from .ondemand import _why_kept, idle_due, make_room

if TYPE_CHECKING:  # annotations only
    from .ondemand import Member

DEMAND_TIMEOUT_S = 1.0


def poll(url: str) -> dict[str, Any] | None:
    """The gateway's demand: {"groups": watcher group -> {"model", "deployment", "idle_timeout", "waiting",
    "in_flight", "last_request"}, "members": deployment -> {"model", "on_demand", "shares", "room", "waiting",
    "in_flight", "last_request"}}; None when the gateway does not answer (then nothing is started or stopped)."""
    try:
        with urllib.request.urlopen(url, timeout=DEMAND_TIMEOUT_S) as resp:
            data = json.loads(resp.read(1 << 20))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("groups"), dict):
        return None
    return {"groups": data["groups"], "members": data.get("members") if isinstance(data.get("members"), dict) else {}}


def room_for(gid: str, demand: dict[str, Any], node: str | None, running: set[str]) -> tuple[list[str], str]:
    """What must stop on `node` before group `gid` starts there: (deployments to stop, least recently used first;
    the decision with its figures). running: the deployments whose engine runs on this node. ondemand.NoRoom when
    stopping every idle on-demand member there is not enough. Without the budget's figures (no room recorded for
    this node), nothing is stopped."""
    members = demand.get("members") or {}
    name = ((demand.get("groups") or {}).get(gid) or {}).get("deployment")
    want = members.get(name) or {}
    if not isinstance(name, str) or node is None or node not in (want.get("room") or {}):  # (JSON keys: str)
        return [], "no budget figures for this node"
    room = {node: float(want["room"][node])}

    def member(n: str) -> Member:
        m = members[n]
        return {
            "name": n,
            "on_demand": bool(m.get("on_demand")),
            "shares": {node: float((m.get("shares") or {}).get(node, 0.0))},
            "last_request": m.get("last_request"),
            "in_flight": int(m.get("in_flight") or 0) + int(m.get("waiting") or 0),
        }

    stop, why = make_room(member(name), [member(n) for n in sorted(running) if n in members and n != name], room)
    return [m["name"] for m in stop], why


def choose(demand: object, rank: dict[str, Any], now: float) -> tuple[str, str] | None:
    """("start" | "stop", why) for an on-demand group whose rank 0 is `rank` (watch.rank_state), or None.
    demand: the group's entry of the gateway's demand (None: not an on-demand group, or no word from the gateway)."""
    if not isinstance(demand, dict):
        return None
    waiting = int(demand.get("waiting") or 0)
    if not rank["running"]:
        if waiting > 0:
            return "start", f"on demand: {waiting} request(s) held at the gateway for {demand.get('model')}"
        return None
    last = max(float(demand.get("last_request") or 0.0), float(rank.get("started") or 0.0))
    member: Member = {
        "on_demand": True,
        "idle_timeout": demand.get("idle_timeout"),
        "in_flight": int(demand.get("in_flight") or 0) + waiting,
        "last_request": last or None,
    }
    if idle_due(member, now):
        return "stop", (
            f"on demand: idle for {now - last:.0f} s (idle timeout {demand.get('idle_timeout')} s): "
            "stopped, its memory freed"
        )
    return None


# -- what `status` and the gateway's log show of the activator (issue 40 items 2 and 3) ------------------------


def demand_seen(entry: object, rank: dict[str, Any], now: float) -> dict[str, Any] | None:
    """An on-demand group's demand as this look saw it (the gateway's entry for the group; rank 0's container as
    watch.rank_state reads it), for `status`: its last request, what is held or in flight, its idle timeout, and
    since when it is idle as `choose` counts it (its last request or its start, the later; None when it does not
    run). None: not an on-demand group, or no word from the gateway (the last one seen stays)."""
    if not isinstance(entry, dict):
        return None
    last = entry.get("last_request")
    since = max(float(last or 0.0), float(rank.get("started") or 0.0)) if rank.get("running") else 0.0
    return {
        "last_request": float(last) if last else None,
        "waiting": int(entry.get("waiting") or 0),
        "in_flight": int(entry.get("in_flight") or 0),
        "idle_timeout": entry.get("idle_timeout"),
        "idle_from": since or None,
        "at": now,
    }


def figures(gid: str, demand: dict[str, Any], node: str | None, running: set[str]) -> dict[str, Any]:
    """The budget's figures of a start of group `gid` on `node` (its rank 0's), as room_for weighs them: the
    member's share there, the room there, and each member running there with its share and why it is kept
    (always on, requests in flight) or may be stopped (idle); {} without the budget's figures for this node."""
    members = demand.get("members") or {}
    name = ((demand.get("groups") or {}).get(gid) or {}).get("deployment")
    want = members.get(name) if isinstance(name, str) else None
    room = ((want or {}).get("room") or {}).get(node) if node is not None else None
    if not isinstance(want, dict) or room is None:
        return {}
    beside = []
    for n in sorted(running - {name}):
        m = members.get(n)
        share = ((m or {}).get("shares") or {}).get(node) if isinstance(m, dict) else None
        if isinstance(m, dict) and share is not None:
            busy = int(m.get("in_flight") or 0) + int(m.get("waiting") or 0)
            kept = _why_kept({"name": n, "on_demand": bool(m.get("on_demand")), "in_flight": busy})
            beside.append({"deployment": n, "share": float(share), "kept": kept})
    return {
        "member": name,
        "node": node,
        "room": float(room),
        "needs": float((want.get("shares") or {}).get(node, 0.0)),
        "running": beside,
    }


def decision(action: str, why: str, now: float, **details: Any) -> dict[str, Any]:
    """The last on-demand decision of a group, as its watcher publishes it (`activation` in /watch and status.json):
    action start, stop (idle, or evicted for another member: `evicted_for`), evict (this start stops `stopped`
    first) or refuse (nothing can make room); why, the activator's own words with the figures; when; and the
    figures as data (`figures`, `stopped`, `idle_s` / `idle_timeout`). `status` shows it, the gateway logs it once."""
    return {"action": action, "why": why, "at": now, **details}
