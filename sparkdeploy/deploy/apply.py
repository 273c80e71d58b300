"""Run a plan on the nodes: phase 1 on every node, then phase 2; per-node results, never stop at the first error.

One handler per step kind (HANDLERS). Around a run, what it needs lives in sparkdeploy/runtime/: the session
(one connection per node), the locks, the interrupt (steps under way finish, the rest are skipped, temp files are
removed: `clean_temp_files`) and the lab's hold points.

Nothing here retries a step: a failed step stops that node's remaining steps (reported `skipped`) and the run
exits 1 naming the node and the step; the next `up` or `down` reads the facts again and converges.
"""

from __future__ import annotations

from collections.abc import Callable

from sparkdeploy.config.inventory import Node
from sparkdeploy.deploy.plan import (
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
from sparkdeploy.errors import StepFailed
from sparkdeploy.facts import TEMP_SUFFIX
from sparkdeploy.runtime.holds import hold_point
from sparkdeploy.runtime.interrupts import Interrupt
from sparkdeploy.runtime.remote import NodeConnection, on_nodes
from sparkdeploy.runtime.session import Session

START_TIMEOUT_S = 300  # `docker run --detach` returns once the container started


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


def _remove_old(conn: NodeConnection, step: Step) -> None:
    """The container this step replaces, removed first (already gone is fine)."""
    if step.container_id:
        r = conn.run(["docker", "rm", "--force", step.container_id], check=False)
        if not r.ok and not _no_such_container(r.stderr):
            raise conn.failed(r, f"could not remove the old container: {r.stderr.strip()[-300:]}")


def _new_id(stdout: str) -> str:
    """The short id Docker printed last (`docker run --detach` / `docker create`)."""
    return (stdout.strip().splitlines()[-1] if stdout.strip() else "")[:12]


def _start_container(conn: NodeConnection, step: Step, state_dir: str) -> str:
    assert step.container is not None
    _remove_old(conn, step)
    r = conn.run(["bash", f"{state_dir}/{step.container.run_script}"], check=False, timeout=START_TIMEOUT_S)
    if not r.ok:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-4:])
        raise conn.failed(r, f"`bash {step.container.run_script}` exited {r.exit_code}: {tail}")
    return f"started {_new_id(r.stdout)}"


# Runs a container's own run script with `docker run --detach` turned into `docker create`: the same container
# (name, volumes, labels, health check), created and not started (an on-demand stack member, docs/stack.md; the
# node's watcher starts it). $1: the run script. No value of the step is in this text.
_CREATE_SHIM = r"""real=$(command -v docker); d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
printf '#!/bin/sh\nif [ "$1" = run ] && [ "$2" = --detach ]; then shift 2; exec "%s" create "$@"; fi\n' "$real" \
  > "$d/docker"
printf 'exec "%s" "$@"\n' "$real" >> "$d/docker"
chmod +x "$d/docker"
PATH="$d:$PATH" bash "$1"
"""


def _create_container(conn: NodeConnection, step: Step, state_dir: str) -> str:
    assert step.container is not None
    _remove_old(conn, step)
    script = f"{state_dir}/{step.container.run_script}"
    r = conn.run(["bash", "-c", _CREATE_SHIM, "create", script], check=False, timeout=START_TIMEOUT_S)
    if not r.ok:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-4:])
        raise conn.failed(r, f"`docker create` of {step.container.run_script} exited {r.exit_code}: {tail}")
    return f"created {_new_id(r.stdout)}, not started"


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
    StepKind.CREATE_CONTAINER: _create_container,
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
