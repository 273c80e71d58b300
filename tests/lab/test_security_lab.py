"""The node lock (issue 19), against the lab's real sshd: a run from elsewhere holding the nodes stops `down`
before anything changes; a lock left by a dead local process is taken over; a finished run leaves nothing."""

from __future__ import annotations

import os
import socket

import pytest

from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.errors import StepFailed
from sparkdeploy.runtime.locks import NODE_LOCK_DIR, NodeLocks
from sparkdeploy.runtime.session import Session

pytestmark = pytest.mark.lab


def _plant(lab, node, holder: str) -> None:
    lab.ssh(node, f"mkdir -m 0700 ~/{NODE_LOCK_DIR} && printf '%s\\n' '{holder}' > ~/{NODE_LOCK_DIR}/holder")


def _has_lock(lab, node) -> bool:
    return lab.ssh(node, f"test -d ~/{NODE_LOCK_DIR}", check=False).returncode == 0


def test_node_lock_held_elsewhere_stops_a_run_and_a_dead_local_one_is_taken_over(lab, cli):
    inv = load_inventory(str(lab.spec.inventory_path))
    first, second = lab.nodes[0], lab.nodes[-1]
    try:
        # Another machine's run holds the last node: `down` stops before any change, naming the holder.
        _plant(lab, second, "t0ken otherhost pid 4242 since 2026-01-01T00:00:00Z")
        code, _, err = cli("down", "-i", str(lab.spec.inventory_path))
        assert code == 1 and "otherhost pid 4242 since 2026-01-01T00:00:00Z" in err and second.name in err, err
        assert _has_lock(lab, second), "another run's lock must never be removed"
        assert not _has_lock(lab, first), "the locks taken on the other nodes must be given back"
        lab.ssh(second, f"rm -r ~/{NODE_LOCK_DIR}")

        # A lock of a process of this machine that is gone (killed -9): taken over, then released at the end.
        _plant(lab, first, f"d3ad {socket.gethostname()} pid 999999 since 2026-01-01T00:00:00Z")
        with Session.open(inv) as session, NodeLocks(session) as locks:
            for node in lab.nodes:
                holder = lab.ssh(node, f"cat ~/{NODE_LOCK_DIR}/holder").stdout
                assert holder.startswith(locks.token) and f"pid {os.getpid()}" in holder
            # The same nodes from a second run (a copy of the inventory elsewhere): refused.
            with Session.open(inv) as other, pytest.raises(StepFailed, match="holds the node lock"):
                with NodeLocks(other):
                    pass
        assert not any(_has_lock(lab, n) for n in lab.nodes)
    finally:
        for node in lab.nodes:
            lab.ssh(node, f"rm -rf ~/{NODE_LOCK_DIR}", check=False)
