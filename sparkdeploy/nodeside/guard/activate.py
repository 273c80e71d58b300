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
    """What must stop on `node` alone before group `gid` starts there (room_across with one node's view)."""
    return room_across(gid, demand, {node: running} if node is not None else {})


def _busy(m: dict[str, Any]) -> int:
    return int(m.get("waiting") or 0) + int(m.get("in_flight") or 0)


def room_across(
    gid: str, demand: dict[str, Any], seen: dict[str, set[str]], started: set[str] | frozenset[str] = frozenset()
) -> tuple[list[str], str]:
    """What must stop before group `gid`'s member starts on EVERY node it needs (a tensor-parallel member spans
    several): (deployments to stop, least recently used first, wherever they are led from; the decision with each
    node's figures), as `weigh` reads the demand. ondemand.NotYet when on-demand members busy there hold what is
    lacking (the start waits for them to go idle); ondemand.NoRoom, naming the node(s) and figures, when stopping
    every on-demand member there is not enough. Without the budget's figures, nothing stops."""
    weighed = weigh(gid, demand, seen, started)
    if isinstance(weighed, str):
        return [], weighed
    stop, why = make_room(*weighed)
    return [m["name"] for m in stop], why


def weigh(
    gid: str, demand: dict[str, Any], seen: dict[str, set[str]], started: set[str] | frozenset[str] = frozenset()
) -> tuple[Member, list[Member], dict[str, float]] | str:
    """The one reading of the demand that a start of group `gid` is budgeted by (room_across decides on it, the
    decision's `figures` show it): (its member, the others holding memory on its nodes, the room on each node), or
    why there is nothing to weigh (no budget figures). seen: node -> the deployments whose engine runs there, for
    each node of the member (its own node's containers, the other ranks' watchers); started: the members with
    requests held whose rank 0 runs on a node not in `seen` (its watcher says so: `unseen_starts`).

    Two members waiting at once never both take the same room, and never evict each other: a member with
    requests held or in flight is never a victim (the requests that start a member are held until it serves), and
    one started (seen running on a node of it, or in `started`) holds its share on every node of it; of two members
    not started yet, the one first in name order starts first: the later one counts the earlier one's share as
    taken (the same order on every node, whenever each reads the demand), the earlier one ignores the later one
    until it runs."""
    members = demand.get("members") or {}
    name = ((demand.get("groups") or {}).get(gid) or {}).get("deployment")
    want = members.get(name) or {} if isinstance(name, str) else {}
    room = {n: float(v) for n, v in (want.get("room") or {}).items() if n in seen}  # (JSON keys: str)
    if not isinstance(name, str) or not room:
        return "no budget figures for " + (", ".join(sorted(seen)) or "this node")
    nodes = sorted(room)
    others: list[Member] = []
    for n, m in sorted(members.items()):
        shares = {x: float(v) for x, v in (m.get("shares") or {}).items() if x in room}
        on = [x for x in nodes if x in shares and n in seen[x]]
        starting = not on and bool(m.get("on_demand")) and _busy(m) > 0 and (n < name or n in started)
        if n == name or not (on or starting):
            continue
        if _busy(m) or starting:  # starting or serving with requests: its share is taken on every node of it
            on = [x for x in nodes if x in shares]
        others.append(
            {
                "name": n,
                "on_demand": bool(m.get("on_demand")),
                "shares": {x: shares[x] for x in on},
                "last_request": m.get("last_request"),
                "in_flight": _busy(m),
                "starting": starting,
            }
        )
    mine: Member = {
        "name": name,
        "on_demand": True,
        "shares": {x: float((want.get("shares") or {}).get(x, 0.0)) for x in nodes},
    }
    return mine, others, room


def unseen_starts(gid: str, demand: dict[str, Any], seen: dict[str, set[str]]) -> dict[str, str]:
    """The groups whose watcher must say whether they started, before group `gid` is budgeted (room_across's
    `started`): of the on-demand members after it in name order with requests held and a share on a node of it,
    not seen running there, each group led from a node not in `seen` -> its rank 0's watcher URL."""
    groups, members = demand.get("groups") or {}, demand.get("members") or {}
    name = (groups.get(gid) or {}).get("deployment")
    if not isinstance(name, str):
        return {}
    out = {}
    for o, g in sorted(groups.items()):
        dep = g.get("deployment") if isinstance(g, dict) else None
        m = members.get(dep) or {}
        if not isinstance(dep, str) or dep <= name or not _busy(m) or not g.get("watch"):
            continue
        mine = [x for x in seen if x in (m.get("shares") or {})]
        if mine and not any(dep in seen[x] for x in mine) and o.rpartition(":")[2] not in seen:
            out[o] = str(g["watch"])
    return out


def asked_to_stop(gid: str, demand: dict[str, Any], views: dict[str, Any]) -> tuple[str, str] | None:
    """("stop", why) when another node's activator named this on-demand group's member as a victim of its start
    (its group's `evict` in its watcher's view: `views`, group -> that watcher's entry of it, for the groups of
    `wanted`) and the member is still idle by this look's demand (nothing held, nothing in flight); else None. The
    victim's own activator acts: nothing on a node takes a command from the network, it reads its peers."""
    groups, members = demand.get("groups") or {}, demand.get("members") or {}
    name = (groups.get(gid) or {}).get("deployment")
    if not isinstance(name, str) or _busy(members.get(name) or groups.get(gid) or {}):
        return None
    for other, entry in sorted(views.items()):
        ev = (entry or {}).get("evict") if isinstance(entry, dict) else None
        if isinstance(ev, dict) and name in (ev.get("stop") or []) and _busy(groups.get(other) or {}):
            by = f"decided by its activator on {ev.get('node')}"
            return "stop", f"on demand: evicted for {ev.get('for')} ({by}): {ev.get('why')}"
    return None


def wanted(gid: str, demand: dict[str, Any]) -> dict[str, str]:
    """The other on-demand groups with requests held whose member shares a node with this group's (group -> its
    rank 0's watcher URL): whose published eviction a running on-demand group's activator reads (asked_to_stop)."""
    groups, members = demand.get("groups") or {}, demand.get("members") or {}
    mine = set((members.get((groups.get(gid) or {}).get("deployment")) or {}).get("shares") or {})
    return {
        o: str(g["watch"])
        for o, g in sorted(groups.items())
        if o != gid
        and isinstance(g, dict)
        and g.get("watch")
        and int(g.get("waiting") or 0) > 0
        and mine & set((members.get(g.get("deployment")) or {}).get("shares") or {})
    }


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


def figures(
    gid: str, demand: dict[str, Any], seen: dict[str, set[str]], started: set[str] | frozenset[str], node: str | None
) -> dict[str, Any]:
    """The budget's figures of a start of group `gid` on `node` (its rank 0's), from the reading room_across
    decides on (`weigh`): the member's share there, the room there, and each member holding memory there with its
    share and why it is kept (always on, starting, requests in flight) or may be stopped (idle); {} without the
    budget's figures for this node."""
    weighed = weigh(gid, demand, seen, started)
    if isinstance(weighed, str) or node not in weighed[2]:
        return {}
    mine, others, room = weighed
    return {
        "member": mine["name"],
        "node": node,
        "room": room[node],
        "needs": mine["shares"][node],
        "running": [
            {"deployment": m["name"], "share": m["shares"][node], "kept": _why_kept(m)}
            for m in others
            if node in m["shares"]
        ],
    }


def decision(action: str, why: str, now: float, **details: Any) -> dict[str, Any]:
    """The last on-demand decision of a group, as its watcher publishes it (`activation` in /watch and status.json):
    action start, stop (idle, or evicted for another member: `evicted_for`), evict (this start stops `stopped`
    first), wait (only members busy now hold the room it lacks: `busy`) or refuse (nothing can make room); why,
    the activator's own words with the figures; when; and the figures as data (`figures`, `stopped`, `idle_s` /
    `idle_timeout`). `status` shows it, the gateway logs it once."""
    return {"action": action, "why": why, "at": now, **details}
