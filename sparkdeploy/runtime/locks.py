"""One run at a time per cluster: a lock on this machine (flock) and one on every node (a directory made with
mkdir), so that two runs, from this machine or from two machines, never change the same nodes at once."""

from __future__ import annotations

import fcntl
import os
import secrets
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import cast

from sparkdeploy import paths
from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.errors import StepFailed
from sparkdeploy.runtime import interrupts
from sparkdeploy.runtime.remote import on_nodes
from sparkdeploy.runtime.session import Session


def lock_path(inventory: Inventory) -> Path:
    """Keyed by the cluster (its nodes): a copy of the inventory, or another path to it, is the same lock.
    cluster.name is a validated label, so the file stays in the state folder."""
    return paths.state_dir() / "locks" / f"{inventory.cluster_id}.lock"


@contextmanager
def cluster_lock(inventory: Inventory) -> Iterator[Path]:
    """One run at a time per cluster on this machine (flock: released by the kernel however the process ends).
    Every command that changes a node takes it; NodeLocks extends it to runs from other machines."""
    path = lock_path(inventory)
    paths.state_folder(path=path.parent)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise paths.state_unwritable(path.parent, exc) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 128, 0).decode(errors="replace").strip() or "?"
            raise StepFailed(
                f"another sparkdeploy run (pid {holder}) is working on this cluster "
                f"({inventory.source}); wait for it to finish (lock: {path})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n".encode(), 0)
        try:
            yield path
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


inventory_lock = cluster_lock  # the name the commands used first


# -- the lock on the nodes --------------------------------------------------------------------------------
# A directory made with mkdir (atomic on every filesystem) in the SSH user's home on each node, holding who took
# it and when: two machines (or two checkouts) that run against the same nodes cannot both change them.
NODE_LOCK_DIR = ".sparkdeploy.lock"
STALLED_AFTER_STOP_S = 0.3  # after a stop, how long a command still under way on a node may take to end
_ACQUIRE = (
    f'd="$HOME/{NODE_LOCK_DIR}"; if mkdir -m 0700 "$d" 2>/dev/null; then printf "%s\\n" "$1" > "$d/holder"; '
    'echo TAKEN; else echo HELD; cat "$d/holder" 2>/dev/null; fi'
)
_RELEASE = (
    f'd="$HOME/{NODE_LOCK_DIR}"; read -r t _ < "$d/holder" 2>/dev/null && [ "$t" = "$1" ] && rm -rf -- "$d"; true'
)


class NodeLockHeld(StepFailed):
    """Another run holds the lock on a node; `lines`: one per node, what was found there."""

    def __init__(self, message: str, lines: list[str]):
        super().__init__(message)
        self.lines = lines


def _who(holder: str) -> str:
    """The holder line without its token: `HOST pid N since TIME`."""
    parts = holder.split(maxsplit=1)
    return parts[1] if len(parts) > 1 else holder


class NodeLocks:
    """Take the lock on every reachable node (a node that cannot be reached fails later, per node, as usual);
    if another run holds it on any node, release what was taken and stop, naming the holder and since when."""

    def __init__(self, session: Session, say: Callable[[str], None] | None = None):
        self.session = session
        self.say = say or (lambda m: print(f"warning: {m}", file=sys.stderr, flush=True))
        self.token = secrets.token_hex(8)
        self.holder = (
            f"{self.token} {socket.gethostname()} pid {os.getpid()} since "
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
        )
        self.taken: list[Node] = []

    def _take(self, node: Node) -> str | None:
        conn = self.session.conns[node.name]
        for _ in range(2):
            r = conn.run(["sh", "-c", _ACQUIRE, "sh", self.holder], timeout=30)
            lines = r.stdout.strip().splitlines()
            if lines and lines[0] == "TAKEN":
                return None
            other = lines[1] if len(lines) > 1 else ""
            if not self._stale(other):
                return other or "(being taken right now)"
            conn.run(["sh", "-c", _RELEASE, "sh", other.split()[0]], timeout=30)
        return "(could not be taken)"

    @staticmethod
    def _stale(holder: str) -> bool:
        """A lock of a process of this machine that no longer exists (killed -9, machine crashed)."""
        parts = holder.split()
        if len(parts) < 4 or parts[1] != socket.gethostname() or parts[2] != "pid" or not parts[3].isdigit():
            return False
        try:
            os.kill(int(parts[3]), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def __enter__(self) -> NodeLocks:
        outcomes = on_nodes(self.session.inventory.nodes, self._take)
        self.taken = [o.node for o in outcomes if o.ok and o.value is None]
        held = [(o.node, cast(str, o.value)) for o in outcomes if o.ok and o.value is not None]
        if held:
            self.__exit__()
            held_by = {node.name: _who(holder) for node, holder in held}
            lines = [
                f"{o.node.name} ({o.node.mgmt_ip}): "
                + (
                    f"held by another sparkdeploy run ({held_by[o.node.name]})"
                    if o.node.name in held_by
                    else f"not reachable: {o.error}"
                    if not o.ok
                    else "free (released again)"
                )
                + "; nothing changed here"
                for o in outcomes
            ]
            node, holder = held[0]
            raise NodeLockHeld(
                f"{node.name} ({node.mgmt_ip}): another sparkdeploy run holds the node lock "
                f"({_who(holder)}); wait for it to finish. If that run is gone: ssh to {node.name} "
                f"and rm -r ~/{NODE_LOCK_DIR}",
                lines,
            )
        return self

    def __exit__(self, *exc: object) -> None:
        nodes, self.taken = self.taken, []
        # A node whose connection died during the run (powered off, cable pulled) is not waited for again: its
        # lock stays, and the run says so (the next run from this machine finds its pid gone and takes it over).
        lost = [n for n in nodes if self.session.conns[n.name].lost]
        # After a stop (Ctrl-C, SIGTERM) a node still busy with the command the stop abandoned does not answer:
        # the release would wait behind it. Stalled nodes are not waited for either: their lock stays.
        deadline = time.monotonic() + STALLED_AFTER_STOP_S
        stalled = [
            n
            for n in nodes
            if n not in lost
            and interrupts.STOP.is_set()
            and not self.session.conns[n.name].idle(max(0.0, deadline - time.monotonic()))
        ]
        outcomes = on_nodes(
            [n for n in nodes if n not in lost and n not in stalled],
            lambda n: self.session.conns[n.name].run(
                ["sh", "-c", _RELEASE, "sh", self.token], timeout=30, check=False, force=True
            ),
        )
        left = [(n, "the connection was lost during the run") for n in lost]
        left += [
            (n, f"it was still busy with a command when the run was stopped ({interrupts.name()})") for n in stalled
        ]
        left += [(o.node, str(o.error)) for o in outcomes if not o.ok]
        for node, why in left:
            self.say(
                f"{node.name} ({node.mgmt_ip}): the node lock ~/{NODE_LOCK_DIR} stays there ({why}); the next "
                f"run from this machine takes it over; from another machine remove it first: ssh to "
                f"{node.name} and rm -r ~/{NODE_LOCK_DIR}"
            )


def node_locks(
    session: Session, dry_run: bool = False, say: Callable[[str], None] | None = None
) -> AbstractContextManager[NodeLocks | None]:
    """The node lock for a run that changes nodes; a dry run changes nothing and takes none."""
    return nullcontext() if dry_run else NodeLocks(session, say)
