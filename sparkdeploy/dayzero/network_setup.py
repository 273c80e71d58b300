"""`sparkdeploy setup network`: the fabric's netplan file on every node, applied safely, then verified.

Per node: its facts (discover.read_node: facts/ set DAYZERO) and, as root through `sudo -n`, its netplan files and
NetworkManager's view of the ports (nodeside/netguard.py inspect). The file is rendered (netplan.py) and the bad
input refused before anything changes. A file sparkdeploy did not write that configures the fabric's interfaces
stops the run with its diff; --replace takes it over (netguard keeps the files as they were: --restore puts them
back). A file already as rendered is left alone. Applying is netguard's: the node starts its own rollback timer
first, and this command confirms only from a NEW SSH connection; one that cannot reconnect waits for the node to
undo the change and says so. Then every pair of nodes pings at the full MTU with don't-fragment set, and each
node's RDMA devices and the RoCE v2 GID of its fabric address are read again.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.dayzero import netplan
from sparkdeploy.dayzero.discover import DiscoveredNode, read_node
from sparkdeploy.dayzero.proposal import FABRIC_MTU
from sparkdeploy.errors import StepFailed
from sparkdeploy.nodeside import ship
from sparkdeploy.runtime.remote import CommandTimeout, ConnectionLost, NodeConnection, on_nodes

ROLLBACK_S = 45  # the node undoes an unconfirmed change after this long
RECONNECT_TIMEOUT_S = 5
ICMP_OVERHEAD = 28  # IPv4 + ICMP headers: `ping -s MTU-28` fills one frame

# $1 interface, $2 payload, $3... peers: one DF ping line per peer
PING_SCRIPT = r"""
iface=$1; size=$2; shift 2
for peer in "$@"; do
  if ping -M do -s "$size" -c 2 -i 0.2 -W 1 -I "$iface" "$peer" >/dev/null 2>&1; then echo "$peer ok"
  else echo "$peer fail"; fi
done
"""


@dataclass
class NodeNet:
    node: str
    text: str = ""  # the rendered file
    renderer: str = ""
    foreign: dict[str, str] = field(default_factory=dict)  # path -> content of files we did not write
    state: str = ""  # dry-run | unchanged | confirmed | rolled-back | refused | restored | failed
    standin: bool = False  # applied by the lab's stand-in for systemd-networkd (SIMULATED)
    detail: str = ""
    pings: dict[str, str] = field(default_factory=dict)  # peer fabric IP -> ok | fail
    rdma_up: bool | None = None
    gid_index: int | None = None

    def diffs(self) -> str:
        out: list[str] = []
        for path, content in self.foreign.items():
            out += difflib.unified_diff(
                content.splitlines(keepends=True),
                self.text.splitlines(keepends=True),
                fromfile=f"{self.node}:{path} (not sparkdeploy's)",
                tofile=f"{self.node}:{netplan.PATH} (sparkdeploy setup network)",
            )
        return "".join(out)

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "state": self.state,
            "renderer": self.renderer or "networkd",
            "standin": self.standin,
            "foreign": sorted(self.foreign),
            "detail": self.detail,
            "pings": self.pings,
            "rdma_up": self.rdma_up,
            "gid_index": self.gid_index,
            "config": self.text,
        }


def _netguard(conn: NodeConnection, *args: str, stdin: str | None = None, timeout: float = 60) -> dict[str, Any]:
    res = conn.run(["sudo", "-n", *ship.argv("netguard", *args)], check=False, stdin=stdin, timeout=timeout)
    if res.exit_code != 0 and "password is required" in res.stderr:
        raise StepFailed(
            f"{conn.node.name}: no passwordless sudo for python3, which setup network runs as root "
            "(fix: sparkdeploy setup ssh --ask-password --grant-sudo)"
        )
    try:
        return dict(json.loads(res.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        raise conn.failed(res, f"{conn.node.name}: netguard {args[0]} exited {res.exit_code}") from None


def _owned(files: dict[str, str | None], names: set[str]) -> tuple[str | None, dict[str, str]]:
    """Our file's content (None: not there), and the files that are not ours but name a fabric interface."""
    ours = None
    foreign = {}
    for path, content in files.items():
        text = content or ""
        if path == netplan.PATH and text.startswith(netplan.MARKER):
            ours = text
        elif path == netplan.PATH or any(n in text for n in names):
            foreign[path] = text
    return ours, foreign


@dataclass
class Prepared:
    node: Node
    facts: DiscoveredNode
    inspect: dict[str, Any]
    result: NodeNet
    ours: str | None


def _prepare(inv: Inventory, node: Node) -> Prepared:
    facts = read_node(node, inv, "", None)
    names = {n for i in node.fabric_ifaces for n in (i, netplan.twin(i)) if n}
    with NodeConnection(node, inv) as conn:
        seen = _netguard(conn, "inspect", json.dumps(sorted(names)))
    nm = {dev: state for dev, state in (seen.get("networkmanager") or {}).items() if "unmanaged" not in state}
    renderer = "NetworkManager" if nm else None
    result = NodeNet(node.name, netplan.render_node(inv, node, facts, renderer), renderer or "")
    ours, result.foreign = _owned(seen.get("files") or {}, names)
    return Prepared(node, facts, seen, result, ours)


def _reconnect_and_confirm(inv: Inventory, node: Node, token: str, deadline: float) -> dict[str, Any]:
    """Confirm from a NEW connection; past the deadline, wait for the node's own rollback and report it."""
    while time.monotonic() < deadline:
        try:
            with NodeConnection(node, inv, connect_timeout=RECONNECT_TIMEOUT_S) as conn:
                return _netguard(conn, "confirm", token, timeout=30)
        except (ConnectionLost, CommandTimeout):
            time.sleep(1)
    time.sleep(5)  # the node's watcher undoes the change at its deadline: then it is reachable again
    for _ in range(10):
        try:
            with NodeConnection(node, inv, connect_timeout=RECONNECT_TIMEOUT_S) as conn:
                return dict(_netguard(conn, "confirm", token, timeout=30), lost=True)
        except (ConnectionLost, CommandTimeout):
            time.sleep(3)
    return {"state": "unreachable", "lost": True}


def apply_node(inv: Inventory, p: Prepared, takeover: list[str], rollback_s: int) -> None:
    token = secrets.token_hex(8)
    cfg = {
        "path": netplan.PATH,
        "content": p.result.text,
        "takeover": takeover,
        "timeout_s": rollback_s,
        "token": token,
    }
    start = time.monotonic()
    try:
        with NodeConnection(p.node, inv) as conn:
            answer = _netguard(conn, "apply", stdin=json.dumps(cfg), timeout=30)
    except (ConnectionLost, CommandTimeout):
        answer = {"token": token, "lost": True}  # the change may have cut this very connection
    if "error" in answer:
        p.result.state, p.result.detail = "failed", str(answer["error"])
        return
    p.result.standin = bool(answer.get("standin"))
    done = _reconnect_and_confirm(inv, p.node, token, start + rollback_s - 2)
    state = done.get("state")
    if state in ("confirmed", "confirmed-late"):
        p.result.state = "confirmed"
    elif state == "rolled-back":
        p.result.state = "rolled-back"
        p.result.detail = (
            f"the change cut {p.node.name} off the management network (no new SSH connection within "
            f"{rollback_s} s); the node undid it itself ({done.get('reason', '')})"
        )
    else:
        p.result.state, p.result.detail = "failed", f"{p.node.name} is unreachable after the change and its rollback"


def verify(inv: Inventory, results: dict[str, NodeNet]) -> None:
    """DF pings at the MTU from every node to every other; RDMA devices up and the GID of the fabric address."""

    def one(node: Node) -> tuple[dict[str, str], DiscoveredNode]:
        pings: dict[str, str] = {}
        with NodeConnection(node, inv) as conn:
            for iface, peers in ping_targets(inv, node):
                res = conn.run(
                    ["bash", "-c", PING_SCRIPT, "ping", iface, str(FABRIC_MTU - ICMP_OVERHEAD), *peers],
                    check=False,
                    timeout=60,
                )
                for line in res.stdout.splitlines():
                    if len(parts := line.split()) == 2:
                        pings[parts[0]] = parts[1]
        return pings, read_node(node, inv, "", None)

    for o in on_nodes(inv.nodes, one):
        r = results[o.node.name]
        if not o.ok:
            r.detail = (r.detail + "; " if r.detail else "") + f"verification failed: {o.error}"
            continue
        r.pings, facts = o.value
        names = [iface for iface, _ in ping_targets(inv, o.node)]
        ports = [next((p for p in facts.ports if name in p.names), None) for name in names]
        r.rdma_up = all(p is not None and p.up and p.hcas for p in ports)
        r.gid_index = ports[0].gid_index if ports[0] else None


def ping_targets(inv: Inventory, node: Node) -> list[tuple[str, list[str]]]:
    """Which port pings which addresses: a direct cable or switch, the first fabric port every other node's
    fabric address; a mesh or ring, every cabled port the other end of its own cable (DF pings per cable)."""
    if inv.cables:
        return [
            (end.port, [str(ipaddress.ip_interface(c.other(node.name).address).ip)])
            for c in inv.cables
            if (end := c.end(node.name)) is not None
        ]
    return [(node.fabric_ifaces[0], [n.fabric_address for n in inv.nodes if n.name != node.name])]


def problems(results: list[NodeNet]) -> list[str]:
    out = []
    for r in results:
        if r.state in ("failed", "rolled-back", "refused"):
            out.append(f"{r.node}: {r.detail}")
        for peer, state in r.pings.items():
            if state != "ok":
                out.append(
                    f"{r.node}: a {FABRIC_MTU}-byte frame with don't-fragment set does not reach {peer} "
                    "(fix: check the MTU on both ends and the cable; sparkdeploy doctor network)"
                )
        if r.rdma_up is False:
            out.append(f"{r.node}: the fabric port's RDMA devices are not up (fix: check the cable and `ibv_devinfo`)")
        if r.state in ("confirmed", "unchanged") and r.rdma_up and r.gid_index is None:
            out.append(f"{r.node}: no RoCE v2 GID for the fabric address yet (fix: `show_gids` on the node)")
    return out


def setup_network(
    inv: Inventory,
    dry_run: bool = False,
    replace: bool = False,
    rollback_s: int = ROLLBACK_S,
    before_change: Callable[[list[str]], None] = lambda nodes: None,
) -> list[NodeNet]:
    """before_change: called with the nodes whose netplan this run changes (or would, --dry-run), before any
    change: it may refuse (raise), e.g. when a deployment serves over their fabric (deploy/serving.py)."""
    prepared_out = on_nodes(inv.nodes, lambda n: _prepare(inv, n))
    failures = [f"{o.node.name}: {o.error}" for o in prepared_out if not o.ok]
    if failures:
        if any(not isinstance(o.error, StepFailed) for o in prepared_out if not o.ok):
            raise next(o.error for o in prepared_out if o.error and not isinstance(o.error, StepFailed))
        raise StepFailed("\n".join(failures))
    prepared = {o.node.name: o.value for o in prepared_out}
    netplan.check(inv, {name: p.facts for name, p in prepared.items()})
    results = {name: p.result for name, p in prepared.items()}
    todo = []
    for p in prepared.values():
        waiting = p.inspect.get("pending") or {}
        if waiting and waiting.get("deadline", 0) > time.time():
            p.result.state = "refused"
            p.result.detail = (
                f"an earlier change waits for its confirmation and is undone by the node within "
                f"{waiting['deadline'] - time.time():.0f} s (fix: run setup network again after that)"
            )
        elif p.result.foreign and not replace:
            p.result.state = "refused"
            p.result.detail = (
                f"{', '.join(sorted(p.result.foreign))} configures the fabric and was not written by sparkdeploy "
                "(fix: check the diff; --replace takes over and keeps the old files for --restore)"
            )
        elif p.ours == p.result.text and not p.result.foreign:
            p.result.state = "unchanged"
        elif dry_run:
            p.result.state = "dry-run"
        else:
            todo.append(p)
    if any(r.state == "refused" for r in results.values()):
        return list(results.values())
    before_change([p.node.name for p in todo] + [r.node for r in results.values() if r.state == "dry-run"])
    if dry_run:
        return list(results.values())
    for o in on_nodes(
        [p.node for p in todo],
        lambda n: apply_node(inv, prepared[n.name], sorted(prepared[n.name].result.foreign), rollback_s),
    ):
        if not o.ok:
            results[o.node.name].state, results[o.node.name].detail = "failed", str(o.error)
    if all(r.state in ("confirmed", "unchanged") for r in results.values()):
        verify(inv, results)
    return list(results.values())


def restore_network(
    inv: Inventory, dry_run: bool = False, before_change: Callable[[list[str]], None] = lambda nodes: None
) -> list[NodeNet]:
    """before_change: as setup_network's, with the nodes that have something to restore."""
    if not dry_run:
        before_change([r.node for r in restore_network(inv, dry_run=True) if r.state == "dry-run"])

    def one(node: Node) -> NodeNet:
        r = NodeNet(node.name)
        with NodeConnection(node, inv) as conn:
            if dry_run:
                seen = _netguard(conn, "inspect", "[]")
                r.state = "dry-run" if seen.get("original") else "nothing-to-restore"
                return r
            answer = _netguard(conn, "restore")
        r.state, r.standin = str(answer.get("state")), bool(answer.get("standin"))
        return r

    out = []
    for o in on_nodes(inv.nodes, one):
        out.append(o.value if o.ok else NodeNet(o.node.name, state="failed", detail=str(o.error)))
    if dry_run:
        before_change([r.node for r in out if r.state == "dry-run"])
    return out
