"""`sparkdeploy postmortem [NODE]` and doctor's `guard.crash`: the black box (nodeside/guard/ring.py) read back.

Each node's ring is read over SSH with the node's boot time (/proc/stat btime). Where the record broke off
(a new boot id, a gap ending in the guard's start, or a ring that ends before the current boot) is a crash
point; the minutes before the last one are shown: memory, PSI, GPU telemetry, engine restarts and the kernel's
messages about OOM, Xid and PCIe AER. Without a crash point it shows the last minutes and says so.
"""

from __future__ import annotations

import time
from typing import Any

from sparkdeploy.config.inventory import Inventory, Node, load_inventory
from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.facts import NodeFacts, gather_facts
from sparkdeploy.guard.state import guard_folder
from sparkdeploy.nodeside.guard.ring import FILE, crash_points, read_records, window
from sparkdeploy.runtime.remote import NodeConnection, on_nodes
from sparkdeploy.runtime.session import Session

DEFAULT_MINUTES = 5


def _boot_time(conn: NodeConnection) -> float:
    r = conn.run(["cat", "/proc/stat"], check=False)
    for text in r.stdout.splitlines():
        if text.startswith("btime "):
            return float(text.split()[1])
    return 0.0


def analyse(records: list[dict[str, Any]], boot_time: float, minutes: float, now: float) -> dict[str, Any]:
    """The crash points of one node's records and the minutes before the last one (pure: tested directly)."""
    points = crash_points(records, boot_time)
    last = points[-1] if points else None
    end = last["last"]["t"] if last else (records[-1]["t"] if records else now)
    samples = window(records, end, minutes)
    events = [r for r in samples if r.get("kind") == "e"]
    mem = [r["avail_mb"] for r in samples if r.get("kind") == "s" and r.get("avail_mb") is not None]
    return {
        "records": len(records),
        "crash": None
        if last is None
        else {
            "kind": last["kind"],
            "last_sample_at": last["last"]["t"],
            "resumed_at": last["resumed"]["t"] if last["resumed"] else None,
            "gap_s": round((last["resumed"]["t"] if last["resumed"] else now) - last["last"]["t"], 1),
        },
        "crashes": len(points),
        "window_minutes": minutes,
        "window_end": end,
        "min_available_mb": min(mem) if mem else None,
        "events": [{"t": r["t"], "ev": r.get("ev"), "msg": r.get("msg")} for r in events],
        "samples": [r for r in samples if r.get("kind") == "s"],
    }


def node_postmortem(conn: NodeConnection, folder: str, minutes: float) -> dict[str, Any]:
    raw = conn.read(f"{folder}/{FILE}")
    if raw is None:
        return {"records": 0, "crash": None, "crashes": 0, "note": f"no black box at {folder}/{FILE} (no guard ran)"}
    return analyse(read_records(raw), _boot_time(conn), minutes, time.time())


def postmortem(inventory: str | None, node: str | None = None, minutes: float = DEFAULT_MINUTES) -> dict[str, Any]:
    """Every node's (or NODE's) black box: the `postmortem --json` contract."""
    inv = load_inventory(inventory)
    nodes = _nodes(inv, node)
    with Session.open(inv) as session:
        facts = gather_facts(session, nodes)
        reachable = [n for n in nodes if isinstance(facts.get(n.name), NodeFacts)]
        homes = {n.name: facts[n.name].home for n in reachable}  # type: ignore[union-attr]  # NodeFacts: filtered
        outcomes = on_nodes(
            reachable,
            lambda n: node_postmortem(session.conn(n), guard_folder(homes[n.name], inv, session.conn(n)), minutes),
        )
    out: dict[str, Any] = {"inventory": inv.source, "nodes": []}
    for n in nodes:
        o = next((o for o in outcomes if o.node.name == n.name), None)
        if o is None:
            out["nodes"].append({"name": n.name, "reachable": False, "error": str(facts.get(n.name))})
        elif not o.ok:
            out["nodes"].append({"name": n.name, "reachable": True, "error": str(o.error)})
        else:
            out["nodes"].append({"name": n.name, "reachable": True, **o.value})
    return out


def _nodes(inv: Inventory, name: str | None) -> list[Node]:
    if name is None:
        return list(inv.nodes)
    found = [n for n in inv.nodes if n.name == name]
    if not found:
        raise ConfigError(
            Problem(inv.source, "nodes", f"no node named {name!r}", f"one of {', '.join(n.name for n in inv.nodes)}")
        )
    return found


def evidence(result: dict[str, Any]) -> str:
    """One line of a node's last crash with its evidence (doctor's guard.crash detail)."""
    crash = result.get("crash")
    if not crash:
        return "no crash in the black box"
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(crash["last_sample_at"]))
    parts = [f"{crash['kind']}: last sample {when}, silent {crash['gap_s']:.0f} s"]
    if result.get("min_available_mb") is not None:
        parts.append(
            f"lowest available memory {result['min_available_mb']} MiB in the {result['window_minutes']:g} min before"
        )
    last = (result.get("samples") or [{}])[-1]
    if last.get("psi"):
        parts.append(f"PSI some {last['psi'][0]:.1f}% full {last['psi'][1]:.1f}%")
    if (last.get("gpu") or {}).get("temp_c") is not None:
        gpu = last["gpu"]
        parts.append(f"GPU {gpu['temp_c']:.0f} C {gpu.get('power_w')} W ({gpu['source']})")
    kernel = [e["msg"] for e in result.get("events") or [] if e["ev"] in ("kmsg", "hard", "stopped")]
    if kernel:
        parts.append(f"events: {' | '.join(kernel[-3:])}")
    return "; ".join(parts)
