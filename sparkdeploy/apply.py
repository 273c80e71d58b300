"""Run a plan on the nodes: phase 1 on every node, then phase 2; per-node results, never stop at the first error.

Also what a run needs around that: one SSH connection per node (remote.NodeConnection, host keys checked),
reading facts on all nodes in parallel, a lock per inventory that refuses a second concurrent run, and a
SIGINT handler that lets the steps under way finish, skips the rest, and removes temp files on the nodes.

Nothing here retries a step: a failed step stops that node's remaining steps (reported `skipped`) and the run
exits 1 naming the node and the step; the next `up` or `down` reads the facts again and converges.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from sparkdeploy import interrupts, paths
from sparkdeploy.errors import StepFailed
from sparkdeploy.facts import TEMP_SUFFIX, NodeFacts, read_facts
from sparkdeploy.inventory import Inventory, Node
from sparkdeploy.plan import (
    CHANGED,
    FAILED,
    GATEWAY_KEPT,
    OK,
    OUR_FOLDERS,
    PENDING,
    SKIPPED,
    NodePlan,
    Plan,
    Step,
    StepKind,
)
from sparkdeploy.remote import NodeConnection, on_nodes

START_TIMEOUT_S = 300  # `docker run --detach` returns once the container started


# -- interrupt and lock ---------------------------------------------------------------------------------


class Interrupt:
    """First stop signal (Ctrl-C, SIGTERM): set `event` (steps under way finish, the rest are skipped, temp files
    are cleaned). Second: KeyboardInterrupt at once. `immediate()`: a part with nothing under way to finish, where
    the first signal raises at once (sparkdeploy/interrupts.py: the one handler of every command)."""

    def __init__(self, say: Callable[[str], None] | None = None):
        self.event = threading.Event()
        self._section: AbstractContextManager[None] | None = None
        self._say = say or (lambda m: print(m, file=sys.stderr, flush=True))

    def _notify(self, signum: int) -> None:
        self.event.set()
        self._say(
            f"interrupted ({interrupts.name(signum)}): finishing the commands under way, then cleaning up "
            f"({interrupts.name(signum)} again to stop at once)"
        )

    def __enter__(self) -> Interrupt:
        self._section = interrupts.graceful(self._notify)
        self._section.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        section, self._section = self._section, None
        if section is not None:
            section.__exit__(None, None, None)

    def immediate(self) -> AbstractContextManager[None]:
        return interrupts.immediate()

    @property
    def set(self) -> bool:
        return self.event.is_set()


# Fault-injection hook for the lab tests (tests/faults): with SPARKDEPLOY_HOLD_AT=PHASE a run stops at that point
# of PHASE (connect, preflight, write, start, health), says so on stderr and waits for Ctrl-C or for the file
# SPARKDEPLOY_HOLD_UNTIL names to exist (at most HOLD_MAX_S), so a test hits every phase deterministically
# (a Ctrl-C, or a fault injected while the run waits) instead of sleeping and hoping. Unset for users.
HOLD_ENV, HOLD_UNTIL_ENV = "SPARKDEPLOY_HOLD_AT", "SPARKDEPLOY_HOLD_UNTIL"
HOLD_PHASES = ("connect", "preflight", "write", "start", "health")
HOLD_MAX_S = 120.0
_held: set[str] = set()  # phases already announced (every node's thread holds; one line says so)
_hold_lock = threading.Lock()


def hold_point(phase: str, interrupt: Interrupt | None) -> None:
    if os.environ.get(HOLD_ENV) != phase or interrupt is None:
        return
    with _hold_lock:
        first = phase not in _held
        _held.add(phase)
    if first:
        print(f"hold: at {phase} (waiting for Ctrl-C)", file=sys.stderr, flush=True)
    release = os.environ.get(HOLD_UNTIL_ENV, "")
    deadline = time.monotonic() + HOLD_MAX_S
    while time.monotonic() < deadline and not interrupt.event.wait(0.1):
        if release and os.path.exists(release):
            return


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


# -- connections and facts ------------------------------------------------------------------------------


@dataclass
class Session:
    """One connection per node of the inventory, opened lazily, closed at the end of the run."""

    inventory: Inventory
    conns: dict[str, NodeConnection]

    @classmethod
    def open(
        cls, inventory: Inventory, connect_timeout: float | None = None, mask: Callable[[str], str] | None = None
    ) -> Session:
        """mask: the run's secrets mask, applied to what a failed command's error carries."""
        kwargs = {"connect_timeout": connect_timeout} if connect_timeout else {}
        return cls(inventory, {n.name: NodeConnection(n, inventory, mask=mask, **kwargs) for n in inventory.nodes})

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()  # a dead connection closes quietly (NodeConnection.close)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def conn(self, node: Node | str) -> NodeConnection:
        return self.conns[node if isinstance(node, str) else node.name]


def gather_facts(
    session: Session,
    nodes: list[Node],
    images_for: Callable[[Node], list[str]] = lambda n: [],
    hf_cache: str = "~",
    model: str = "",
    what: str = "state",
    state_dir: str | None = None,
) -> dict[str, NodeFacts | Exception]:
    """Facts of every node in parallel: the node's NodeFacts, or the exception that stopped the reading.
    state_dir: another state dir than the inventory's (a stack's deployment has its own)."""
    state_dir = state_dir or session.inventory.cluster.state_dir

    def one(node: Node) -> NodeFacts:
        return read_facts(session.conn(node), state_dir, images_for(node), hf_cache, model, what)

    return {o.node.name: cast("NodeFacts | Exception", o.value if o.ok else o.error) for o in on_nodes(nodes, one)}


def add_resources(
    session: Session, facts: dict[str, NodeFacts | Exception], names: set[str], hf_cache: str, model: str
) -> None:
    """Read memory, disk and the model cache on the named nodes (those where something starts)."""
    have = {name: f for name, f in facts.items() if name in names and isinstance(f, NodeFacts)}
    nodes = [n for n in session.inventory.nodes if n.name in have]
    for name, res in gather_facts(session, nodes, hf_cache=hf_cache, model=model, what="resources").items():
        if isinstance(res, NodeFacts):
            have[name].add_resources(res)
        else:
            facts[name] = res


# -- steps ----------------------------------------------------------------------------------------------


class _Unchanged(Exception):
    """A step that found nothing to do after all (reported ok, with the reason)."""


def _no_such_container(text: str) -> bool:
    return "No such container" in text or "no such container" in text


def _remove_container(conn: NodeConnection, step: Step, state_dir: str) -> str:
    r = conn.run(["docker", "rm", "--force", step.container_id or step.target], check=False)
    if not r.ok and not _no_such_container(r.stderr):
        raise conn.failed(r, f"docker rm exited {r.exit_code}: {r.stderr.strip()[-300:]}")
    return "removed"


def _state_dir(conn: NodeConnection, step: Step, state_dir: str) -> str:
    conn.run(["mkdir", "-p", "-m", "0700", state_dir])
    conn.run(["chmod", "0700", state_dir])
    return "0700"


def _remove_file(conn: NodeConnection, step: Step, state_dir: str) -> str:
    conn.run(["rm", "-f", "--", f"{state_dir}/{step.target}"])
    return "removed"


def _write(conn: NodeConnection, step: Step, state_dir: str) -> str:
    assert step.file is not None
    conn.put(step.file.content, f"{state_dir}/{step.target}", mode=step.file.mode)
    if step.file.secret:  # a hash of a secret file is a way to test guesses: never shown
        return f"{step.file.mode:04o}"
    return f"{step.file.mode:04o} sha256 {step.file.sha256[:12]}"


def _chmod(conn: NodeConnection, step: Step, state_dir: str) -> str:
    conn.run(["chmod", f"{step.mode:04o}", f"{state_dir}/{step.target}"])
    return f"{step.mode:04o}"


def _remove_folder(conn: NodeConnection, step: Step, state_dir: str) -> str:
    if step.target not in OUR_FOLDERS and step.target not in GATEWAY_KEPT:  # ours (plan.OUR_FOLDERS, GATEWAY_KEPT)
        raise StepFailed(f"refusing to remove {step.target}: not a folder sparkdeploy writes")
    conn.run(["rm", "-rf", "--", f"{state_dir}/{step.target}"])
    return "removed"


def _rmdir(conn: NodeConnection, step: Step, state_dir: str) -> str:
    r = conn.run(["rmdir", "--", state_dir], check=False)
    if not r.ok:
        raise _Unchanged("kept: not empty (holds something this tool did not write)")
    return "removed"


def _start_container(conn: NodeConnection, step: Step, state_dir: str) -> str:
    assert step.container is not None
    if step.container_id:
        r = conn.run(["docker", "rm", "--force", step.container_id], check=False)
        if not r.ok and not _no_such_container(r.stderr):
            raise conn.failed(r, f"could not remove the old container: {r.stderr.strip()[-300:]}")
    r = conn.run(["bash", f"{state_dir}/{step.container.run_script}"], check=False, timeout=START_TIMEOUT_S)
    if not r.ok:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-4:])
        raise conn.failed(r, f"`bash {step.container.run_script}` exited {r.exit_code}: {tail}")
    new_id = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    return f"started {new_id[:12]}"


# One handler per step kind: (connection, step, the state dir's absolute path) -> a short detail.
HANDLERS: dict[StepKind, Callable[[NodeConnection, Step, str], str]] = {
    StepKind.REMOVE_CONTAINER: _remove_container,
    StepKind.STATE_DIR: _state_dir,
    StepKind.REMOVE_FILE: _remove_file,
    StepKind.WRITE: _write,
    StepKind.MANIFEST: _write,
    StepKind.CHMOD: _chmod,
    StepKind.RMDIR: _rmdir,
    StepKind.REMOVE_FOLDER: _remove_folder,
    StepKind.START_CONTAINER: _start_container,
}


def run_step(conn: NodeConnection, step: Step, state_dir: str) -> str:
    """Do one step; return a short detail. Raises StepFailed (CommandFailed, ConnectionLost, CommandTimeout) or
    OSError (an SFTP write the node refused) when it fails."""
    handler = HANDLERS.get(step.kind)
    if handler is None:
        raise StepFailed(f"unknown step {step.kind}")
    return handler(conn, step, state_dir)


def _run_node(
    conn: NodeConnection,
    node_plan: NodePlan,
    phase: int,
    interrupt: Interrupt | None,
    mask: Callable[[str], str],
    say: Callable[[str], None] | None,
) -> None:
    steps = node_plan.phase(phase)
    for i, step in enumerate(steps):
        if not step.change:
            step.status = OK
            continue
        if interrupt is not None and interrupt.set:
            step.status, step.detail = SKIPPED, "interrupted"
            continue
        if step.kind == StepKind.START_CONTAINER:
            hold_point("start", interrupt)  # the files are written; no container (re)started yet
            if interrupt is not None and interrupt.set:
                step.status, step.detail = SKIPPED, "interrupted"
                continue
        try:
            if say:
                say(f"{step.node}: {step.label}")
            step.detail = mask(run_step(conn, step, node_plan.state_dir))
            step.status = CHANGED
            if step.kind == StepKind.WRITE:
                hold_point("write", interrupt)  # one file written, the rest not yet
        except _Unchanged as exc:
            step.status, step.detail = OK, mask(str(exc))
        except (StepFailed, OSError) as exc:  # reported per node; nothing else on this node runs after a failure
            step.status, step.detail = FAILED, mask(f"{exc}" or exc.__class__.__name__)
            for rest in steps[i + 1 :]:
                rest.status, rest.detail = (OK, "") if not rest.change else (SKIPPED, f"after the failed {step.kind}")
            return


def apply_plan(
    session: Session,
    plan: Plan,
    interrupt: Interrupt | None = None,
    mask: Callable[[str], str] = lambda s: s,
    say: Callable[[str], None] | None = None,
) -> None:
    """Run phase 1 on every node, then (if every node succeeded) phase 2. Step statuses are set in place.
    Phase 2 starts the nodes whose steps (re)start a multi-node engine's rank 0 (role head) first, then the others:
    a group restarts head first, its workers joining it (a Ray head, a torchrun or vLLM master)."""
    for phase, todo in ((1, _with_steps(plan, 1)), *((2, wave) for wave in _phase2_waves(plan))):
        if phase == 2 and (plan.failed() or (interrupt is not None and interrupt.set)):
            why = "interrupted" if not plan.failed() else f"{plan.failed()[0].node} failed before it"
            for n in todo:
                for s in n.phase(2):
                    if s.status == PENDING:
                        s.status, s.detail = (OK, "") if not s.change else (SKIPPED, why)
            continue
        by_node = {n.node.name: n for n in todo}
        outcomes = on_nodes(
            [n.node for n in todo],  # on_nodes returns before the loop moves on
            lambda node: _run_node(session.conn(node), by_node[node.name], phase, interrupt, mask, say),  # noqa: B023
        )
        for o in outcomes:  # _run_node catches step errors; anything else is a bug, still reported per node
            if not o.ok:
                for s in by_node[o.node.name].phase(phase):
                    if s.status == PENDING:
                        s.status, s.detail = FAILED, mask(str(o.error))


def _with_steps(plan: Plan, phase: int) -> list[NodePlan]:
    return [n for n in plan.nodes if n.phase(phase)]


def _phase2_waves(plan: Plan) -> list[list[NodePlan]]:
    """Phase 2's nodes in the order they run: first those (re)starting a head rank, then the rest (each wave's
    nodes in parallel); one wave when no head starts."""
    todo = _with_steps(plan, 2)
    heads = [
        n
        for n in todo
        if any(
            s.change and s.kind == StepKind.START_CONTAINER and s.container and s.container.role == "head"
            for s in n.steps
        )
    ]
    rest = [n for n in todo if n not in heads]
    return [w for w in (heads, rest) if w] if heads else [todo]


def clean_temp_files(session: Session, nodes: list[Node]) -> None:
    """Remove `.NAME.sparkdeploy-tmp` files a put interrupted mid-way left in the state dir (best effort)."""
    state_dir = session.inventory.cluster.state_dir
    script = 'cd "$HOME/$1" 2>/dev/null || exit 0; for f in .*"$2"; do [ -f "$f" ] && rm -f -- "$f"; done; exit 0'

    def one(node: Node) -> None:
        session.conn(node).run(
            ["bash", "-c", script, "sparkdeploy-clean", state_dir, TEMP_SUFFIX], check=False, timeout=20
        )

    on_nodes(nodes, one)
