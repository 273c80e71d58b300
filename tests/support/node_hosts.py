"""testinfra hosts over sparkdeploy's pinned SSH, for the lab tests: a second reader of a node's state.

The fact layer (sparkdeploy/facts) is how sparkdeploy reads a node; a lab test that asserts a node's state
through facts alone would pass if a fact's command or parser were wrong in the same way as the code under test.
These helpers read the same things with testinfra's own modules (`host.file`, `host.interface`, `host.docker`)
over sparkdeploy's `NodeConnection` (sparkdeploy/doctor/testinfra_backend.py: pinned host keys, never auto-added).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sparkdeploy.config.inventory import Inventory, load_inventory
from sparkdeploy.doctor.testinfra_backend import host_for
from sparkdeploy.labels import MANAGED_LABEL
from sparkdeploy.runtime.remote import NodeConnection


@contextlib.contextmanager
def node_hosts(inventory: str | Path | Inventory) -> Iterator[dict[str, Any]]:
    """node name -> a testinfra Host over that node's pinned SSH connection (closed on exit)."""
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(str(inventory))
    conns = [NodeConnection(n, inv) for n in inv.nodes]
    try:
        yield {c.node.name: host_for(c) for c in conns}
    finally:
        for c in conns:
            c.close()


def our_containers(host: Any) -> dict[str, bool]:
    """sparkdeploy's containers on the node (label io.sparkdeploy.managed=true) -> running, read by testinfra."""
    return {c.name: c.is_running for c in host.docker.get_containers(label=f"{MANAGED_LABEL}=true")}


def state_files(host: Any, state_dir: str) -> dict[str, int]:
    """The regular files in the node's state dir -> their mode (testinfra's host.file), {} when it is gone."""
    home = host.check_output('printf %s "$HOME"')
    folder = host.file(f"{home}/{state_dir}")
    if not folder.exists:
        return {}
    out = {}
    for name in folder.listdir():
        f = host.file(f"{home}/{state_dir}/{name}")
        if f.is_file:
            out[name] = f.mode
    return out
