"""Run the selected checks: in parallel across nodes and checks, each under its own timeout.

Order: the inventory and recipe are loaded first (no network); then one SSH connection per node is opened
in parallel (the `access.ssh` rows); then every other (check, node) pair runs at once on worker threads,
sharing the node's connection. A check that runs past its timeout is reported as failed, naming the check
and the node, and the run goes on without it (its thread is a daemon and is abandoned; the SSH command
under it has its own timeout too).
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from dataclasses import dataclass, field

from sparkdeploy.checks import FAIL, PASS, SKIP, WARN, Check, Result, fail
from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.errors import ConfigError, Problem, SparkdeployError
from sparkdeploy.runtime.remote import HostKeyError, NodeConnection, fingerprint
from sparkdeploy.runtime.thread_imports import preload
from sparkdeploy.topologies.deployment import Deployment

from .check_context import SessionContext
from .doctor_run import DoctorRun, NodeSession, Options

MAX_PARALLEL = 24  # threads per node: most wait on a node's memoized facts, and remote.py caps each
# connection's open sessions below sshd's MaxSessions; a cap per node keeps one node's checks from queueing
# behind another's, so N nodes take about as long as two.
CONNECT_TIMEOUT_S = 6
ACCESS_CHECK = "access.ssh"
AFTER_OTHERS = frozenset({"nccl"})  # opt-ins that load the nodes and the link: run once the other checks are done
RECIPE_CHECK = "inventory.recipe"  # runs once the recipe is rendered (after connect when read from the nodes)


@dataclass
class Report:
    results: list[Result] = field(default_factory=list)
    seconds: float = 0.0
    run: DoctorRun | None = None

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys((PASS, WARN, FAIL, SKIP), 0)
        for r in self.results:
            out[r.status] += 1
        return out

    def exit_code(self, strict: bool = False) -> int:
        statuses = {r.status for r in self.results}
        if FAIL in statuses or (strict and WARN in statuses):
            return 1
        return 0


def select(checks: list[Check], only: tuple[str, ...] | list[str] = (), options: Options | None = None) -> list[Check]:
    """--only prefixes (`network`, `network.mtu`, `gpu.mem`); opt-in checks only with their option."""
    options = options or Options()
    enabled = [c for c in checks if c.opt_in is None or getattr(options, c.opt_in, False)]
    if not only:
        return enabled
    # inventory.* always runs (no network, and every other row may point at it)
    chosen = [c for c in checks if c.group == "inventory" or any(c.id == p or c.id.startswith(p) for p in only)]
    unknown = [p for p in only if not any(c.id == p or c.id.startswith(p) for c in checks)]
    if unknown:
        raise ConfigError(
            [Problem("--only", p, "matches no check", "known: " + ", ".join(c.id for c in checks)) for p in unknown]
        )
    # Asking for an opt-in check by name turns it on.
    return chosen


def _tcp_probe(ip: str, port: int, timeout: float) -> str:
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            return ""
    except TimeoutError:
        return f"no answer on {ip}:{port} within {timeout:g} s"
    except OSError as exc:
        return f"{ip}:{port}: {exc.strerror or exc}"


def connect(run: DoctorRun, node: Node) -> Result:
    """Open the node's one SSH connection; the result is the `access.ssh` row."""
    session = run.session(node)
    port = node.ssh.port or 22
    started = time.monotonic()
    problem = _tcp_probe(node.mgmt_ip, port, CONNECT_TIMEOUT_S)
    if problem and node.ssh.port is None:
        problem = ""  # ~/.ssh/config may name another port: let the SSH client decide (it retries, then fails)
    if problem:
        session.connect_error = ConnectionError(problem)
        return fail(
            problem,
            "sshd answers on the management IP",
            f"check that {node.name} is powered on and sshd runs (sudo systemctl start ssh), "
            f"and that mgmt_ip {node.mgmt_ip} is right",
        )
    try:
        session.conn.open()
    except SparkdeployError as exc:
        session.connect_error = exc
        text = str(exc)
        if isinstance(exc, HostKeyError):
            measured, sep, rest = text.partition(". If ")
            return fail(
                measured,
                "a known host key (never added automatically)",
                ("If " + rest) if sep else f"sparkdeploy trust {node.name}",
            )
        if "authentication" in text:
            return fail(
                text,
                "key authentication as the inventory's user",
                f"check ssh.user/ssh.key for {node.name}; test with: ssh {node.ssh.user or ''}"
                f"{'@' if node.ssh.user else ''}{node.mgmt_ip}",
            )
        return fail(text, "SSH reachable", f"check {node.name}'s sshd and network")
    session.connected = True
    key = session.conn.open().client.get_transport().get_remote_server_key()
    return Result(
        PASS,
        f"connected in {time.monotonic() - started:.2f} s; host key {key.get_name()} {fingerprint(key)} known",
        "reachable, known host key",
    )


class _Task:
    def __init__(self, check: Check, node: Node | None):
        self.check = check
        self.node = node
        self.started: float | None = None
        self.done = threading.Event()
        self.results: list[Result] = []


def _call(run: DoctorRun, task: _Task, gate: threading.Semaphore) -> None:
    ctx: SessionContext = run  # what doctor offers every check: the facts and a session per node
    with gate:
        task.started = time.monotonic()
        try:
            out = task.check.fn(ctx, task.node) if task.check.scope == "node" else task.check.fn(ctx)
            results = out if isinstance(out, list) else [out]
        except SparkdeployError as exc:
            results = [fail(str(exc), "", f"see the error above; rerun with --only {task.check.id}")]
        except Exception as exc:  # noqa: BLE001 - a check's bug is reported as its failure, not a crash
            results = [
                fail(
                    f"check crashed: {exc.__class__.__name__}: {exc}",
                    "",
                    "this is a sparkdeploy bug: report it with the output of --json",
                )
            ]
        elapsed = time.monotonic() - task.started
        for r in results:
            r.check = r.check or task.check.id
            r.node = r.node if r.node is not None else (task.node.name if task.node else None)
            r.seconds = round(elapsed, 3)
        task.results = results
        task.done.set()


def _run_tasks(run: DoctorRun, tasks: list[_Task]) -> list[Result]:
    preload()  # nothing is first imported on a check's thread (CPython 3.11 compile race: see thread_imports)
    gate = threading.Semaphore(MAX_PARALLEL * max(1, len(run.nodes)))
    for task in tasks:
        threading.Thread(
            target=_call,
            args=(run, task, gate),
            daemon=True,
            name=f"doctor-{task.check.id}-{task.node.name if task.node else 'cluster'}",
        ).start()
    pending = list(tasks)
    while pending:
        now = time.monotonic()
        still = []
        for task in pending:
            if task.done.is_set():
                continue
            if task.started is not None and now - task.started > task.check.timeout_s:
                where = f" on {task.node.name}" if task.node else ""
                task.results = [
                    Result(
                        FAIL,
                        f"check {task.check.id} timed out after {task.check.timeout_s:g} s{where}",
                        f"done within {task.check.timeout_s:g} s",
                        f"rerun with --only {task.check.id}; a hung command or endpoint on "
                        f"{task.node.name if task.node else 'the cluster'} is the usual cause",
                        check=task.check.id,
                        node=task.node.name if task.node else None,
                        seconds=round(now - task.started, 3),
                    )
                ]
                task.done.set()
                continue
            still.append(task)
        pending = still
        if pending:
            pending[0].done.wait(0.02)
    out: list[Result] = []
    for task in tasks:
        out.extend(task.results)
    return out


def _recipe_bound(check: Check) -> bool:
    return check.needs_recipe or check.id == RECIPE_CHECK


def _for_deployment(run: DoctorRun, name: str, dep: Deployment, checks: list[Check]) -> list[Result]:
    """The recipe checks (image present, memory, ports, ...) against one deployment of a stack, over the run's
    connections; its own facts (its images); each row says which deployment it is about."""
    sessions = {k: NodeSession(s.node, s.conn, s.connect_error, s.connected) for k, s in run.sessions.items()}
    mine = dataclasses.replace(run, deployment=dep, deployment_error=None, stack=[], sessions=sessions)
    tasks = [
        _Task(c, n)
        for c in checks
        for n in (run.nodes if c.scope == "node" else [None])
        if n is None or run.reachable(n)
    ]
    rows = _run_tasks(mine, tasks)
    for r in rows:
        r.measured = f"{name}: {r.measured}"
    return rows


def execute(run: DoctorRun, checks: list[Check]) -> Report:
    """Run `checks` (already selected) against `run`; always returns every row, never stops at the first."""
    started = time.monotonic()
    run.connector = connect  # access.ssh: this run's SSH connection
    report = Report(run=run)
    # The inventory's own checks first; the recipe's once it is rendered (from the nodes' manifests, after connect).
    cluster_first = [c for c in checks if c.id.startswith("inventory.") and c.id != RECIPE_CHECK]
    for check in cluster_first:
        report.results.extend(_run_tasks(run, [_Task(check, None)]))
    if run.inventory is None:
        for check in checks:
            if check not in cluster_first:
                report.results.append(Result(SKIP, "not run: the inventory did not load", check=check.id))
        report.seconds = time.monotonic() - started
        return report

    rest = [c for c in checks if c not in cluster_first]
    # Only a selection that looks at the recipe pays for reading what the nodes run.
    render_later = run.render_later if any(c.needs_recipe or c.id == RECIPE_CHECK for c in rest) else None
    if any(c.scope in ("node", "cluster") for c in rest) or render_later:
        report.results.extend(_open_sessions(run, run.inventory, checks))
    if render_later is not None:
        render_later(run)

    per_deployment = [c for c in rest if _recipe_bound(c) and not (c.id == RECIPE_CHECK and run.deployment_error)]
    tasks, skipped = _tasks(run, rest, per_deployment)
    # Opt-in heavy checks (the NCCL probe) run after the others: they load the nodes and the link. The owner's tests
    # (--tests) run beside the others: their process starts while the facts are read.
    results = _run_tasks(run, [t for t in tasks if t.check.opt_in not in AFTER_OTHERS])
    results += _run_tasks(run, [t for t in tasks if t.check.opt_in in AFTER_OTHERS])
    for name, dep in run.stack:
        results += _for_deployment(run, name, dep, per_deployment)
    report.results.extend(_in_order(run, checks, results + skipped))
    for session in run.sessions.values():
        session.close()
    report.seconds = time.monotonic() - started
    return report


def _open_sessions(run: DoctorRun, inventory: Inventory, checks: list[Check]) -> list[Result]:
    """One session per node, connected by the access check (the selection's, or a default one): its rows."""
    for node in run.nodes:
        run.sessions[node.name] = NodeSession(node, NodeConnection(node, inventory, connect_timeout=CONNECT_TIMEOUT_S))
    access = next((c for c in checks if c.id == ACCESS_CHECK), None)
    access = access or Check(
        ACCESS_CHECK, "SSH reachable with a known host key", lambda r, n: connect(r, n), timeout_s=45
    )
    return _run_tasks(run, [_Task(access, n) for n in run.nodes])


def _tasks(run: DoctorRun, rest: list[Check], per_deployment: list[Check]) -> tuple[list[_Task], list[Result]]:
    """What runs (a check per reachable node, or once for the cluster) and a SKIP row for each that cannot: no
    recipe rendered, or a node not reachable. A stack's recipe-bound checks run per deployment instead."""
    tasks: list[_Task] = []
    skipped: list[Result] = []
    for check in rest:
        if check.id == ACCESS_CHECK:
            continue
        if run.stack and check in per_deployment:
            continue  # once per deployment of the stack (_for_deployment)
        if check.needs_recipe and run.deployment is None:
            why = "no recipe rendered" if run.deployment_error is None else "the recipe did not render"
            targets = run.nodes if check.scope == "node" else [None]
            for node in targets:  # None: a cluster-scope row
                skipped.append(
                    Result(
                        SKIP, f"not run: {why} (see inventory.recipe)", check=check.id, node=node.name if node else None
                    )
                )
            continue
        if check.scope == "cluster":
            tasks.append(_Task(check, None))
            continue
        for node in run.nodes:
            if run.reachable(node):
                tasks.append(_Task(check, node))
            else:
                skipped.append(
                    Result(
                        SKIP,
                        f"not run: {node.name} is not reachable over SSH (see access.ssh)",
                        check=check.id,
                        node=node.name,
                    )
                )
    return tasks, skipped


def _in_order(run: DoctorRun, checks: list[Check], rows: list[Result]) -> list[Result]:
    """The rows in the selection's order, each check's by node in inventory order. A row of the owner's tests
    (--tests) has its own id (tests:MODULE::TEST): after the registry's, in run order."""
    order = {c.id: i for i, c in enumerate(checks)}
    node_order = {n.name: i for i, n in enumerate(run.nodes)}
    first: dict[str, int] = {}
    for i, r in enumerate(rows):
        first.setdefault(r.check, i)
    return sorted(
        rows, key=lambda r: (order.get(r.check, len(order)), first[r.check], node_order.get(r.node or "", -1))
    )
