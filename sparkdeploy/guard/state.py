"""The guard's state as `status`, `top` and `logs` show it: each node's guard/status.json (nodeside/guard/run.py
writes it once a second), read over the node's SSH connection, and one line that says it."""

from __future__ import annotations

import time
from typing import Any

from sparkdeploy.config.guard_settings import GUARD_FOLDER, STACK_UNIT
from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.config.userfile import parse_json
from sparkdeploy.errors import ConfigError
from sparkdeploy.facts import FactArgs, NodeFacts, gather
from sparkdeploy.facts.catalog import GUARD, GUARD_STATUS_FILES
from sparkdeploy.nodeside.guard.run import STATUS
from sparkdeploy.runtime.remote import NodeConnection, on_nodes

STALE_S = 10.0  # a status.json older than this: the guard is not reporting (stopped, or the node is stalling)


def guard_folder(home: str, inv: Inventory, conn: NodeConnection | None = None) -> str:
    """The node's guard folder: in the single deployment's state dir, or where a stack's guard runs (its own
    unit, deploy/stack/converge.py) in `<state_dir>-guard`; with `conn`, the one holding a status.json (the single's
    first)."""
    base = f"{home.rstrip('/')}/{inv.cluster.state_dir}"
    single, stack = f"{base}/{GUARD_FOLDER}", f"{base}-{STACK_UNIT}/{GUARD_FOLDER}"
    if conn is not None and conn.read(f"{single}/{STATUS}") is None and conn.read(f"{stack}/{STATUS}") is not None:
        return stack
    return single


def read_status(conn: NodeConnection, folder: str) -> dict[str, Any] | None:
    """The node's guard status (None: no guard has written one)."""
    raw = conn.read(f"{folder}/{STATUS}")
    try:
        return _status(raw.decode("utf-8") if raw is not None else None, f"{folder}/{STATUS}")
    except UnicodeDecodeError:
        return {"state": "unreadable", "reason": f"{folder}/{STATUS} is not JSON"}


def _status_file(f: NodeFacts, inv: Inventory) -> str:
    """The guard's status.json from the home, as guard_folder picks it: the single deployment's guard folder
    first, else a stack's guard unit's (from the fact `guard_status`)."""
    single, stack = (f"{inv.cluster.state_dir}{rel}" for rel in ("/" + GUARD_STATUS_FILES[0], GUARD_STATUS_FILES[1]))
    return stack if single not in f.guard_status and stack in f.guard_status else single


def guard_dir(f: NodeFacts, inv: Inventory) -> str:
    """The node's guard folder (absolute), from its facts `home` and `guard_status` (guard_folder without a read)."""
    return f"{f.home.rstrip('/')}/{_status_file(f, inv).rsplit('/', 1)[0]}"


def status_of(f: NodeFacts, inv: Inventory) -> dict[str, Any] | None:
    """The node's guard status from its fact `guard_status` (the set GUARD; doctor's DOCTOR): None: no guard has
    written one."""
    rel = _status_file(f, inv)
    return _status(f.guard_status.get(rel), f"{f.home.rstrip('/')}/{rel}")


def _status(raw: str | None, where: str) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        data = parse_json(raw, where)
    except ConfigError:  # the node's file, read like every file handed to us (userfile.py)
        return {"state": "unreadable", "reason": f"{where} is not JSON"}
    if isinstance(data, dict) and time.time() - float(data.get("updated") or 0) > STALE_S:
        data["stale_s"] = round(time.time() - float(data.get("updated") or 0), 1)
    return data if isinstance(data, dict) else None


def line(g: dict[str, Any] | None) -> str:
    """One line: the guard's state, why, and the memory it sees."""
    if not g:
        return "guard: none"
    state = g.get("state", "?")
    parts = [f"guard {state.upper() if state != 'ok' else 'ok'}"]
    if g.get("reason"):
        parts.append(str(g["reason"]))
    if g.get("available_mb") is not None:
        parts.append(f"available {g['available_mb']} of {g['total_mb']} MiB (soft {g['soft_mb']}, hard {g['hard_mb']})")
    if g.get("memory_source") == "cgroup":
        parts.append("SIMULATED memory (lab cgroup limit)")
    if g.get("psi"):
        parts.append(f"PSI some {g['psi']['some10']:.1f}% full {g['psi']['full10']:.1f}%")
    elif g.get("psi_note"):
        parts.append(str(g["psi_note"]))
    if g.get("stale_s"):
        parts.append(f"NOT REPORTING for {g['stale_s']:.0f} s")
    if state != "held" and g.get("last_stop"):
        parts.append(f"last stop: {g['last_stop']['reason']}")
    if "watch" in g and g["watch"] is None:
        parts.append("watcher off (cluster.guard.watch.enabled: false): a group that stops serving waits for `up`")
    elif (g.get("watch") or {}).get("error"):
        parts.append(f"watcher: {g['watch']['error']}")
    if g.get("previous_end"):
        parts.append(f"previous record ended: {g['previous_end']['kind']} (see `sparkdeploy postmortem`)")
    return "; ".join(parts)


def read_all(session: Any, inv: Inventory, facts: dict[str, NodeFacts | Exception]) -> dict[str, Any]:
    """node -> its guard's status.json (None: none written yet), for each node that runs a guard container."""
    nodes: list[Node] = [
        n
        for n in inv.nodes
        if isinstance(f := facts.get(n.name), NodeFacts) and any(c.role == "guard" for c in f.containers)
    ]
    homes = {n.name: facts[n.name].home for n in nodes}  # type: ignore[union-attr]  # NodeFacts: filtered above
    args = FactArgs(state_dir=inv.cluster.state_dir)
    found = {
        o.node.name: o.value
        for o in on_nodes(nodes, lambda n: status_of(gather(session.conn(n), GUARD, args, timeout=20), inv))
        if o.ok
    }
    return {name: found.get(name) for name in homes}


def attach(
    session: Any, inv: Inventory, facts: dict[str, NodeFacts | Exception], entries: list[dict[str, Any]]
) -> None:
    """Add `guard` (its status.json, or None) to each `status` node entry whose node runs a guard container."""
    found = read_all(session, inv, facts)
    for entry in entries:
        if entry["name"] in found:
            entry["guard"] = found[entry["name"]]


# -- the watcher (nodeside/guard/watch.py), which runs in the guard's container ------------------------------------


def watched_groups(guards: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """group -> what its rank 0's watcher says (state, failing_since, restarts, gave_up, last_error), from the
    guards' status.json (node -> status or None)."""
    out: dict[str, dict[str, Any]] = {}
    for node, g in guards.items():
        for name, entry in (((g or {}).get("watch") or {}).get("groups") or {}).items():
            if isinstance(entry, dict) and entry.get("rank") == 0:
                out[name] = dict(entry, node=node)
    return out


def clock(t: Any) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(float(t))) if t else "?"


def watch_line(group: str, w: dict[str, Any]) -> str:
    """One line for `status`: the group's state as its watcher sees it, its restarts and their reasons."""
    state = str(w.get("state") or "?")
    parts = [f"watch {group}: {state.upper() if state not in ('ok', 'starting') else state}"]
    if state == "gave-up" and w.get("gave_up"):
        gave = w["gave_up"]
        parts = [
            f"watch {group}: GAVE UP at {clock(gave.get('at'))} after {gave.get('restarts')} restart(s); every rank "
            "stopped (memory freed, restart policy no) until `sparkdeploy up`; last error: "
            + str(w.get("last_error") or gave.get("reason"))
        ]
    elif w.get("reason") and state not in ("ok",):
        parts.append(str(w["reason"]))
    if state != "gave-up" and w.get("failing_since"):
        parts.append(f"failing since {clock(w['failing_since'])}")
    count = int(w.get("restart_count") or 0)
    if count:
        last = (w.get("restarts") or [{}])[-1]
        outcome = (
            f"serving again in {last['took_s']} s"
            if last.get("ok")
            else ("did not come back" if last.get("ok") is False else "in progress")
        )
        parts.append(
            f"{count} restart(s) by the watcher, last at {clock(last.get('at'))}: {last.get('reason')} ({outcome})"
        )
    return "; ".join(parts)


def read_nodes(inv: Inventory, conns: dict[str, NodeConnection]) -> dict[str, dict[str, Any] | None]:
    """Each node's guard status over connections already open (`top`): node -> status.json or None."""
    args = FactArgs(state_dir=inv.cluster.state_dir)

    def one(node: Node) -> dict[str, Any] | None:
        return status_of(gather(conns[node.name], GUARD, args, timeout=20), inv)

    return {o.node.name: o.value for o in on_nodes(list(inv.nodes), one) if o.ok}


def lines(guards: dict[str, dict[str, Any] | None]) -> list[tuple[str, str | None]]:
    """(text, style) for each node with a guard: what `top` prints under its table."""
    styles = {"held": "red", "soft": "yellow", "refused": "red"}
    return [(f"{name} {line(g)}", styles.get(g.get("state", ""))) for name, g in guards.items() if g]
