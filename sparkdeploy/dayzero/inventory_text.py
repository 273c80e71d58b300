"""The inventory `init` writes: the data dumped by the YAML serializer, with comments added deliberately.

Each block (cluster, each node) is dumped by yaml.safe_dump, so every value is quoted as YAML needs; the
comments are our own sentences, and the values in them that come from a node (its hostname, its GPU's name) are
cut to printable characters first, so nothing a node says can add a line to the file. The text is loaded back
and checked against the schema before anything is written.
"""

from __future__ import annotations

import re
import time
from typing import Any

import yaml
from pydantic import ValidationError

from sparkdeploy.config.inventory import Inventory
from sparkdeploy.config.schema import problems_from_validation
from sparkdeploy.config.userfile import parse_yaml
from sparkdeploy.dayzero.discover import Port
from sparkdeploy.dayzero.proposal import FABRIC_MTU, InitPlan
from sparkdeploy.errors import StepFailed

PRINTABLE = re.compile(r"[^\x20-\x7e]")
# The comment lines `render` writes (a re-run regenerates them; any other comment is the owner's).
OURS = re.compile(
    r"^(# (Written by `sparkdeploy init |on every command|The first node is the head|These nodes are the sparkdeploy"
    r" lab|SIMULATED engine, hf_endpoint|The GPUs, RDMA devices|Fabric: )|  # [^ ].*: hostname |  #   )"
)


def _clean(text: str, limit: int = 80) -> str:
    return PRINTABLE.sub("?", text)[:limit]


def _port_words(p: Port) -> str:
    state = "up" if p.up else "down"
    speed = f" {p.speed_mbps // 1000} Gb/s" if p.up and p.speed_mbps else ""
    mtu = f" MTU {p.mtu}" if p.mtu else ""
    addrs = f" {', '.join(p.addresses)}" if p.addresses else " no address"
    return _clean(f"{'/'.join(p.names)} ({', '.join(p.hcas) or 'no RDMA device'}) {state}{speed}{mtu}{addrs}", 160)


def ours(line: str) -> bool:
    """Whether a comment line of an inventory is one `render` writes."""
    return bool(OURS.match(line))


def node_comments(result: InitPlan, index: int) -> list[str]:
    d = result.drafts[index]
    f = d.facts
    sim = f" SIMULATED ({', '.join(f.simulated)}: lab stand-ins)" if f.simulated else ""
    gpu = ", ".join(f.gpus) or f.gpu_error or "no GPU"
    lines = [
        f"{d.name}: hostname {_clean(f.hostname) or '?'}, GPU {_clean(gpu)}"
        + (f" (driver {_clean(f.driver, 20)})" if f.driver else "")
        + sim,
        f"  SSH host key {f.host_key}" + (f", machine-id {_clean(f.machine_id, 12)}..." if f.machine_id else ""),
    ]
    lines += [f"  ConnectX-7 port {p.key}: {_port_words(p)}" for p in f.ports]
    if d.proposed:
        lines.append("  fabric_ip is PROPOSED (the link has no address yet): `sparkdeploy setup network` sets it")
    if d.ports and any((p.mtu or 0) < FABRIC_MTU for p in d.ports):
        lines.append(f"  MTU below {FABRIC_MTU} on the fabric port: `sparkdeploy setup network` sets {FABRIC_MTU}")
    if d.ports and d.ports[0].gid_index is None:
        lines.append(
            "  gid_index unknown until the port has its address: run `sparkdeploy init` again after setup network "
            "(it keeps your edits)"
        )
    return lines


def render(result: InitPlan, data: dict[str, Any], hosts: list[str], lab: str | None = None) -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out = [
        f"# Written by `sparkdeploy init --hosts {','.join(hosts)}` on {when}. Edit freely: sparkdeploy checks it",
        "# on every command, and `init` run again keeps your edits (it shows the diff).",
        "# The first node is the head (it runs the API proxy and rank 0).",
    ]
    if lab:
        out.append(
            f"# These nodes are the sparkdeploy lab `{_clean(lab)}`: its settings are in cluster (image_override: the"
        )
        out.append("# SIMULATED engine, hf_endpoint: its model hub, secrets_file: its secrets).")
    if any(d.facts.simulated for d in result.drafts):
        out.append("# The GPUs, RDMA devices and link speeds below are SIMULATED (the sparkdeploy lab's stand-ins).")
    if result.subnet:
        fabric = "direct cable" if len(result.drafts) == 2 else ("switch" if len(result.drafts) > 2 else "solo")
        out.append(f"# Fabric: {result.subnet} over the ConnectX-7 ports ({fabric}).")
    out.append(yaml.safe_dump({"cluster": data["cluster"]}, sort_keys=False).rstrip())
    out.append("nodes:")
    for i, node in enumerate(data["nodes"]):
        out += ["  # " + line for line in node_comments(result, i)]
        block = yaml.safe_dump([node], sort_keys=False).rstrip()
        out += ["  " + line for line in block.splitlines()]
    rest = {k: v for k, v in data.items() if k not in ("cluster", "nodes")}  # the owner's other keys (a merge)
    if rest:
        out.append(yaml.safe_dump(rest, sort_keys=False).rstrip())
    text = "\n".join(out) + "\n"
    check(text, data)
    return text


def check(text: str, data: dict[str, Any]) -> None:
    """The text loads back to the same data, and the data is a valid inventory."""
    if parse_yaml(text, "the inventory init writes") != data:
        raise StepFailed("init: the inventory text does not load back to its data (a bug: please report it)")
    try:
        Inventory.model_validate(data)
    except ValidationError as exc:  # what the nodes said makes no valid inventory: one line each, no pydantic text
        lines = "; ".join(str(p) for p in problems_from_validation(exc, "the inventory init writes", Inventory))
        raise StepFailed(f"init: {lines}") from None
