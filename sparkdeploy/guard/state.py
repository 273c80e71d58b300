"""The guard's state as `status`, `top` and `logs` show it: each node's guard/status.json (nodeside/guard/run.py
writes it once a second), read over the node's SSH connection, and one line that says it."""

from __future__ import annotations

import time
from typing import Any

from sparkdeploy.errors import ConfigError
from sparkdeploy.facts import NodeFacts
from sparkdeploy.guard_settings import GUARD_FOLDER, STACK_UNIT
from sparkdeploy.inventory import Inventory, Node
from sparkdeploy.nodeside.guard.run import STATUS
from sparkdeploy.remote import NodeConnection, on_nodes
from sparkdeploy.userfile import parse_json

STALE_S = 10.0  # a status.json older than this: the guard is not reporting (stopped, or the node is stalling)


def guard_folder(home: str, inv: Inventory, conn: NodeConnection | None = None) -> str:
    """The node's guard folder: in the single deployment's state dir, or where a stack's guard runs (its own
    unit, deploy/stack.py) in `<state_dir>-guard`; with `conn`, the one holding a status.json (the single's first)."""
    base = f"{home.rstrip('/')}/{inv.cluster.state_dir}"
    single, stack = f"{base}/{GUARD_FOLDER}", f"{base}-{STACK_UNIT}/{GUARD_FOLDER}"
    if conn is not None and conn.read(f"{single}/{STATUS}") is None and conn.read(f"{stack}/{STATUS}") is not None:
        return stack
    return single


def read_status(conn: NodeConnection, folder: str) -> dict[str, Any] | None:
    """The node's guard status (None: no guard has written one)."""
    raw = conn.read(f"{folder}/{STATUS}")
    if raw is None:
        return None
    try:
        data = parse_json(raw.decode("utf-8"), f"{folder}/{STATUS}")
    except (ConfigError, UnicodeDecodeError):  # the node's file, read like every file handed to us (userfile.py)
        return {"state": "unreadable", "reason": f"{folder}/{STATUS} is not JSON"}
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
    if g.get("previous_end"):
        parts.append(f"previous record ended: {g['previous_end']['kind']} (see `sparkdeploy postmortem`)")
    return "; ".join(parts)


def attach(
    session: Any, inv: Inventory, facts: dict[str, NodeFacts | Exception], entries: list[dict[str, Any]]
) -> None:
    """Add `guard` (its status.json, or None) to each `status` node entry whose node runs a guard container."""
    nodes: list[Node] = [
        n
        for n in inv.nodes
        if isinstance(f := facts.get(n.name), NodeFacts) and any(c.role == "guard" for c in f.containers)
    ]
    homes = {n.name: facts[n.name].home for n in nodes}  # type: ignore[union-attr]  # NodeFacts: filtered above
    found = {
        o.node.name: o.value
        for o in on_nodes(
            nodes, lambda n: read_status(session.conn(n), guard_folder(homes[n.name], inv, session.conn(n)))
        )
        if o.ok
    }
    for entry in entries:
        if entry["name"] in homes:
            entry["guard"] = found.get(entry["name"])


def read_nodes(inv: Inventory, conns: dict[str, NodeConnection]) -> dict[str, dict[str, Any] | None]:
    """Each node's guard status over connections already open (`top`): node -> status.json or None."""

    def one(node: Node) -> dict[str, Any] | None:
        home = conns[node.name].run(["sh", "-c", 'printf %s "$HOME"'], check=False, timeout=20).stdout
        return read_status(conns[node.name], guard_folder(home, inv, conns[node.name])) if home else None

    return {o.node.name: o.value for o in on_nodes(list(inv.nodes), one) if o.ok}


def lines(guards: dict[str, dict[str, Any] | None]) -> list[tuple[str, str | None]]:
    """(text, style) for each node with a guard: what `top` prints under its table."""
    styles = {"held": "red", "soft": "yellow", "refused": "red"}
    return [(f"{name} {line(g)}", styles.get(g.get("state", ""))) for name, g in guards.items() if g]
