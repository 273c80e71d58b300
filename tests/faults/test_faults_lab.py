"""Faults during `up`, as a matrix on the shared lab (issue 17): Ctrl-C at each phase, the worker paused and then
stopped mid-apply, its management link dropped mid-apply, two runs at once from two machines, the worker's
Docker root full when its container starts, and a slow management network.

Every case is one entry of CASES on ONE deployment (a 2-node cluster, reused; cases that need work for `up` to
do change one recipe value). A run is stopped at a phase deterministically with the hold hook
(runtime/holds.py: SPARKDEPLOY_HOLD_AT / SPARKDEPLOY_HOLD_UNTIL): the run says `hold: at PHASE` and waits while
the test sends Ctrl-C or injects the fault, then releases it. After each case, with the fault removed:
`status` matches what Docker on each node says, no temp file or secrets.env with the wrong mode or content,
every file is listed in the manifest, no container without sparkdeploy's label, no secret in any output,
no node lock left, and a plain `up` converges to healthy (its time kept for docs/reliability.md).
Faults go into the lab nodes as root with `docker exec` (tc, ip, mount) or into the node containers (pause,
stop), the slow link with tests/faults/latency.py; each case puts the lab back, so the modules after this one
find it as they left it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sparkdeploy.config.secrets import parse_env_file
from sparkdeploy.runtime.holds import HOLD_ENV, HOLD_UNTIL_ENV
from sparkdeploy.runtime.locks import NODE_LOCK_DIR
from tests.support.cli_process import cli_argv, spawn_cli

pytestmark = pytest.mark.lab

RECIPE = "openai-gpt-oss-120b"
# --no-fabric-gate: the gate (tests/deploy/test_fabric_gate_lab.py) is no phase of these faults; ~8 s per changed up
BASE = ["--recipe", RECIPE, "-t", "cluster", "-b", "native", "--timeout", "180", "--no-fabric-gate"]
CHANGED = [*BASE, "--set", "vllm.max_model_len=8192"]  # one value: new files and a restart on both nodes
STATE = "/home/spark/.sparkdeploy"
RERUN_TIMES: dict[str, float] = {}
DEPLOYED = {"args": BASE}  # what runs on the lab now: a case that needs work for `up` switches to the other


@dataclass
class Run:
    """A CLI run in the background; its stderr is read as it comes, to see the `hold: at PHASE` marker."""

    proc: subprocess.Popen
    err_lines: list[str] = field(default_factory=list)
    held: threading.Event = field(default_factory=threading.Event)
    out: str = ""

    def _read(self, phase: str) -> None:
        for line in self.proc.stderr:
            self.err_lines.append(line)
            if line.startswith(f"hold: at {phase}"):
                self.held.set()

    def wait_held(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not self.held.wait(0.2):
            if self.proc.poll() is None and time.monotonic() < deadline:
                continue
            self.proc.kill()
            self.reader.join(5)
            raise AssertionError(f"the run never reached its hold point:\n{''.join(self.err_lines)}")

    def finish(self, timeout: float = 240) -> subprocess.CompletedProcess:
        out = self.proc.stdout.read()  # not communicate(): it would race the reader thread for stderr
        self.proc.wait(timeout)
        self.reader.join(10)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, "".join(self.err_lines))


def start(args: list[str], phase: str, release: Path, env: dict | None = None) -> Run:
    """`up ARGS` held at PHASE (see the module doc)."""
    env = {**os.environ, **(env or {}), HOLD_ENV: phase, HOLD_UNTIL_ENV: str(release)}
    proc = spawn_cli("up", *args, env=env)  # SIGINT at its default, however the suite was started (issue 44)
    run = Run(proc)
    run.reader = threading.Thread(target=run._read, args=(phase,), daemon=True)
    run.reader.start()
    return run


def sd(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        cli_argv(*args), capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def _fail(r: subprocess.CompletedProcess) -> str:
    return f"exit {r.returncode}\nstdout:\n{r.stdout[-5000:]}\nstderr:\n{r.stderr[-5000:]}"


# -- what a node says, read as root from outside (not through sparkdeploy): one docker exec per node -------

SNAPSHOT = (
    f"echo '## ps'; docker ps -a --no-trunc --format "
    "'{{.Names}}\t{{.State}}\t{{.ID}}\t{{.Label \"io.sparkdeploy.managed\"}}'; "
    f"echo '## files'; (cd {STATE} 2>/dev/null && for f in .* *; do [ -f \"$f\" ] && "
    "stat -c '%a %n' -- \"$f\"; done); "
    f"echo '## manifest'; cat {STATE}/manifest.json 2>/dev/null; "
    f"echo '## secrets'; cat {STATE}/secrets.env 2>/dev/null; "
    f"echo '## lock'; test -e /home/spark/{NODE_LOCK_DIR} && echo held && "
    f"cat /home/spark/{NODE_LOCK_DIR}/holder; true"
)


@dataclass
class Snapshot:
    containers: dict[str, tuple[bool, str, str]]  # name -> (running, ID, our managed label)
    files: dict[str, str]  # name -> mode
    manifest: str
    secrets: str
    locked: bool
    lock_text: str = ""


def snapshot(lab, node) -> Snapshot:
    text = lab.docker_exec(node, "sh", "-c", SNAPSHOT).stdout
    parts = dict(chunk.split("\n", 1) if "\n" in chunk else (chunk, "") for chunk in text.split("## ")[1:])
    containers = {}
    for line in parts["ps"].splitlines():
        name, state, cid, managed = line.split("\t")
        containers[name] = (state == "running", cid, managed)
    files = dict(reversed(line.split(" ", 1)) for line in parts["files"].splitlines())
    return Snapshot(
        containers, files, parts["manifest"], parts["secrets"], parts["lock"].startswith("held"), parts["lock"]
    )


def check_node(node, snap: Snapshot, secrets: dict[str, str], lock_may_stay: bool) -> None:
    """No orphan container, no temp file, secrets.env 0600 and whole, every file in the manifest, no lock."""
    for name, (_, _, managed) in snap.containers.items():
        assert managed == "true", f"{node.name}: container {name} without sparkdeploy's label (orphan)"
    files = snap.files
    assert not [n for n in files if n.endswith(".sparkdeploy-tmp")], f"{node.name}: temp files left: {files}"
    if files:
        unlisted = set(files) - set(json.loads(snap.manifest)["files"]) - {"manifest.json"}
        assert not unlisted, f"{node.name}: files not in the manifest: {unlisted}"
    if "secrets.env" in files:
        assert files["secrets.env"] == "600", f"{node.name}: secrets.env mode {files['secrets.env']}"
        assert f"HF_TOKEN={secrets['HF_TOKEN']}\n" in snap.secrets, f"{node.name}: secrets.env is not whole"
    assert lock_may_stay or not snap.locked, f"{node.name}: the node lock was left: {snap.lock_text}"


def check_after(lab, inv: str, secrets: dict[str, str], outputs: list[str]) -> dict:
    """`status` says what each node's engine says; the node checks; no secret, no traceback in any output.
    A node lock may stay only on a node whose connection died, and only where the run said so."""
    r = sd("status", "-i", inv, "--json")
    assert r.returncode == 0, _fail(r)
    st = json.loads(r.stdout)
    said = "\n".join(outputs)
    for n in st["nodes"]:
        node = next(x for x in lab.nodes if x.name == n["name"])
        snap = snapshot(lab, node)
        status_says = {c["name"]: c["running"] for c in n["containers"]}
        assert status_says == {k: v[0] for k, v in snap.containers.items()}, (
            f"{node.name}: status says {status_says}, the engine {snap.containers}"
        )
        stays = f"{node.name} ({node.mgmt_ip}): the node lock ~/{NODE_LOCK_DIR} stays there" in said
        try:
            check_node(node, snap, secrets, stays)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- what the run printed:\n{said[-4000:]}") from None
    for value in secrets.values():
        assert value not in said + r.stdout + r.stderr, "a secret value appeared in the output"
    assert "Traceback" not in said
    return st


def per_node_lines(lab, r: subprocess.CompletedProcess, *words: str) -> dict[str, str]:
    """The one line per node the run printed (`NAME (IP): ...`); each must hold one of `words`."""
    lines = {}
    for node in lab.nodes:
        mine = [ln for ln in r.stdout.splitlines() if ln.startswith(f"{node.name} ({node.mgmt_ip}): ")]
        assert len(mine) == 1, f"{node.name}: expected one line, got {mine}\n{_fail(r)}"
        lines[node.name] = mine[0]
    return lines


# -- the faults ------------------------------------------------------------------------------------------


def sigint_at(phase: str, changed: bool):
    def case(ctx) -> subprocess.CompletedProcess:
        run = start(ctx.use(changed), phase, ctx.release)
        run.wait_held()
        run.proc.send_signal(signal.SIGINT)
        r = run.finish()
        assert r.returncode == 130, _fail(r)
        lines = per_node_lines(ctx.lab, r)
        if phase in ("connect", "preflight"):
            assert all("interrupted (Ctrl-C); nothing changed here" in ln for ln in lines.values()), lines
            assert ctx.containers() == ctx.before, "a container changed although nothing was to change"
        elif phase == "health":
            assert all("every step applied" in ln and "health gate" in ln for ln in lines.values()), lines
        else:
            assert all("interrupted (Ctrl-C):" in ln and "not done" in ln for ln in lines.values()), lines
            assert ctx.containers() == ctx.before, "a container was restarted after the Ctrl-C"
        return r

    return case


def worker_paused_then_stopped(ctx) -> subprocess.CompletedProcess:
    worker = ctx.lab.nodes[-1]
    name = ctx.lab.spec.container_name(worker.name)
    run = start(ctx.use(True), "write", ctx.release)
    run.wait_held()
    subprocess.run(["docker", "pause", name], check=True, capture_output=True)
    try:
        ctx.release.touch()  # the worker's next command now waits on a frozen node
        time.sleep(1.0)
        subprocess.run(["docker", "stop", "-t", "1", name], check=True, capture_output=True)
        r = run.finish()
    finally:
        ctx.restore_lab()
    assert r.returncode == 1, _fail(r)
    lines = per_node_lines(ctx.lab, r)
    assert "FAILED" in lines[worker.name], lines
    # where the worker died decides the head's line: its files only (phase 2 skipped), or every step when the
    # worker's phase 1 got through before it went down; `status` afterwards must say which
    assert "FAILED" not in lines[ctx.lab.nodes[0].name], lines
    return r


def worker_mgmt_link_down(ctx) -> subprocess.CompletedProcess:
    worker = ctx.lab.nodes[-1]
    iface = ctx.iface(worker)
    run = start(ctx.use(True), "write", ctx.release)
    run.wait_held()
    ctx.lab.docker_exec(worker, "ip", "link", "set", iface, "down")
    try:
        ctx.release.touch()
        r = run.finish()
    finally:
        ctx.lab.docker_exec(worker, "ip", "link", "set", iface, "up")
        # a link taken down loses its default route, which coming back up does not restore: put it back, as the
        # node had it (tests/lab/test_network.py checks it on the shared lab after this module)
        ctx.lab.docker_exec(
            worker,
            "ip",
            "route",
            "replace",
            "default",
            "via",
            ctx.lab.spec.gateway(ctx.lab.spec.mgmt_subnet),
            "dev",
            iface,
        )
    assert r.returncode == 1, _fail(r)
    lines = per_node_lines(ctx.lab, r)
    assert "FAILED" in lines[worker.name] and "connection lost" in lines[worker.name], lines
    return r


def two_runs_at_once(ctx) -> subprocess.CompletedProcess:
    args = ctx.use(False)
    first = start(args, "connect", ctx.release)
    first.wait_held()  # holds the lock on every node
    try:
        # the second from "another machine": its own state folder, so only the nodes' lock can stop it
        other = sd("up", *args, env={"SPARKDEPLOY_STATE": str(ctx.tmp / "other-machine")})
        # and a second terminal of this machine: stopped by the local lock already
        local = sd("up", *args)
    finally:
        ctx.release.touch()
    r = first.finish()
    assert r.returncode == 0, _fail(r)
    assert local.returncode == 1 and "another sparkdeploy run (pid" in local.stderr and " since " in local.stderr, (
        _fail(local)
    )
    assert other.returncode == 1, _fail(other)
    lines = per_node_lines(ctx.lab, other)
    assert all(
        "held by another sparkdeploy run" in ln and f"pid {first.proc.pid} since 20" in ln for ln in lines.values()
    ), lines
    assert "holds the node lock" in other.stderr
    return other


def worker_docker_root_full(ctx) -> subprocess.CompletedProcess:
    """Full between preflight and the start: a tiny full tmpfs over the worker engine's containers folder
    (the host's disk is shared: never fill the real one)."""
    worker = ctx.lab.nodes[-1]
    run = start(ctx.use(True), "start", ctx.release)
    run.wait_held()
    root = "/var/lib/docker/containers"
    ctx.lab.docker_exec(
        worker,
        "sh",
        "-c",
        f"mount -t tmpfs -o size=64k tmpfs {root} && {{ dd if=/dev/zero of={root}/fill bs=4k 2>/dev/null; true; }}",
    )
    try:
        ctx.release.touch()
        r = run.finish()
    finally:
        # what a container made while the tmpfs hid the folder is gone with it: drop what the engine no longer knows
        ctx.lab.docker_exec(
            worker,
            "sh",
            "-c",
            f"umount {root} || umount -l {root}; for d in {root}/*; do "
            'docker inspect "${d##*/}" >/dev/null 2>&1 || rm -rf -- "$d"; '
            "done; true",
        )
    assert r.returncode == 1, _fail(r)
    lines = per_node_lines(ctx.lab, r)
    assert "FAILED at start-container" in lines[worker.name] and "no space left" in lines[worker.name], lines
    return r


def slow_management_network(ctx) -> subprocess.CompletedProcess:
    """300 ms more on every packet the nodes send on the management network: an idempotent `up` still works."""
    from tests.faults.latency import add_delay, remove_delay

    nodes = [(ctx.lab.spec.container_name(n.name), ctx.iface(n)) for n in ctx.lab.nodes]
    try:
        for container, iface in nodes:
            add_delay(container, iface, 300)
        t0 = time.monotonic()
        r = sd("up", *ctx.use(False), "--json")
        seconds = time.monotonic() - t0
    finally:
        for container, iface in nodes:
            remove_delay(container, iface)
    assert r.returncode == 0, _fail(r)
    data = json.loads(r.stdout)
    assert data["ok"] and data["changed"] == 0
    assert seconds > 1.5, f"{seconds:.1f} s: was the delay there at all?"  # several round trips at 300 ms
    print(f"idempotent up with 300 ms on the management network: {seconds:.1f} s")
    return r


CASES = {
    "sigint-connect": sigint_at("connect", changed=False),
    "sigint-preflight": sigint_at("preflight", changed=False),
    "sigint-write": sigint_at("write", changed=True),
    "sigint-start": sigint_at("start", changed=True),
    "sigint-health": sigint_at("health", changed=True),
    "worker-paused-then-stopped": worker_paused_then_stopped,
    "worker-mgmt-link-down": worker_mgmt_link_down,
    "two-runs-at-once": two_runs_at_once,
    "worker-docker-root-full": worker_docker_root_full,
    "slow-management-network": slow_management_network,
}


# -- fixtures and the one test -------------------------------------------------------------------------------


@dataclass
class Ctx:
    lab: object
    inv: str
    tmp: Path
    release: Path
    before: dict = field(default_factory=dict)
    args: list[str] = field(default_factory=list)

    def use(self, changed: bool) -> list[str]:
        """The `up` arguments of this case: those deployed now, or (changed) the other recipe value, so that
        `up` has files to write and containers to restart. The re-run after the fault uses the same."""
        now = DEPLOYED["args"]
        self.args = (CHANGED if now is BASE else BASE) if changed else now
        return self.args

    def containers(self) -> dict[str, dict[str, str]]:
        """node -> running container name -> ID, from each node's engine."""
        return {
            node.name: {name: cid for name, (running, cid, _) in snapshot(self.lab, node).containers.items() if running}
            for node in self.lab.nodes
        }

    def iface(self, node) -> str:
        """The node's management interface (the one holding its management IP)."""
        r = self.lab.docker_exec(node, "ip", "-o", "-4", "addr", "show")
        for line in r.stdout.splitlines():
            if f" {node.mgmt_ip}/" in line:
                return line.split()[1]
        raise AssertionError(f"{node.name}: no interface holds {node.mgmt_ip}")

    def restore_lab(self) -> None:
        """The node containers back up (a stopped one started, its engine and sshd ready)."""
        from sparkdeploy.lab import LabSpec, up

        for node in self.lab.nodes:
            name = self.lab.spec.container_name(node.name)
            subprocess.run(["docker", "unpause", name], capture_output=True)
        up(LabSpec())


@pytest.fixture(scope="module")
def deployed(lab, tmp_path_factory):
    inv = str(lab.spec.inventory_path)
    r = sd("up", *BASE, "-i", inv)  # converges from whatever the modules before left
    DEPLOYED["args"] = BASE
    assert r.returncode == 0, _fail(r)
    yield inv
    sd("down", "-i", inv)
    for name, seconds in RERUN_TIMES.items():
        print(f"re-run after {name}: {seconds:.1f} s")


@pytest.fixture(scope="module")
def secrets(lab) -> dict[str, str]:
    return parse_env_file(lab.spec.directory / "secrets.env")


@pytest.mark.parametrize("name", list(CASES))
def test_fault_during_up(lab, deployed, secrets, tmp_path, monkeypatch, name):
    monkeypatch.setenv("SPARKDEPLOY_INVENTORY", deployed)
    if DEPLOYED["args"] is None:  # a case before failed: start from a known deployment
        r = sd("up", *BASE)
        assert r.returncode == 0, _fail(r)
        DEPLOYED["args"] = BASE
    ctx = Ctx(lab, deployed, tmp_path, tmp_path / "release")
    ctx.before = ctx.containers()
    r = CASES[name](ctx)
    DEPLOYED["args"] = None  # unknown until the re-run converged

    check_after(lab, deployed, secrets, [r.stdout, r.stderr])
    t0 = time.monotonic()
    again = sd("up", *ctx.args, "--json")  # the same command, the fault removed
    RERUN_TIMES[name] = time.monotonic() - t0
    assert again.returncode == 0, _fail(again)
    DEPLOYED["args"] = ctx.args
    result = json.loads(again.stdout)
    assert result["ok"] and result["health"]["ok"], result
    st = check_after(lab, deployed, secrets, [again.stdout, again.stderr])
    assert st["healthy"] and st["deployed"], st
