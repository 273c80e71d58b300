"""Long-running commands end within a second of SIGINT or SIGTERM wherever they wait (issue 44, item 3).

Each test runs the real CLI in a subprocess against a real SSH server on 127.0.0.1 that stalls
(tests/support/stall_ssh.py: paramiko's server side on a real socket, not a mock of the SSH layer), waits until
the command is blocked in that read (or in a connect, or in a scrape of an endpoint that never answers), sends
the signal and times the exit: 130 for SIGINT, 143 for SIGTERM, within STOP_S. Before the one stop mechanism
(sparkdeploy/runtime/interrupts.py) a stalled SSH read held the exit until the command's own timeout (the pool thread
was joined at exit), SIGTERM killed the process with the cursor hidden, and `top` and `logs -f` exited 0.
"""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import textwrap
import threading
import time
from types import ModuleType

import pytest

from tests.conftest import REPO
from tests.support.cli_process import cli_argv, spawn_cli
from tests.support.processes import spawn
from tests.support.stall_ssh import StallingHTTP, StallingSSH

STOP_S = 1.0  # the promise: a stopped command has exited within this
EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
SIGNALS = pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
SHOW_CURSOR, HIDE_CURSOR = b"\x1b[?25h", b"\x1b[?25l"


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    return {**os.environ, "HOME": str(tmp_path), "SPARKDEPLOY_STATE": str(tmp_path / "state"), "COLUMNS": "160"}


def _targets_answer(port: int) -> dict[str, str]:
    """What the stalling server answers to `top`: one engine whose /metrics is on `port`, no memory guard."""
    manifest = {"containers": [{"name": "sparkdeploy-vllm", "health_port": port}]}
    return {
        "__f_running()": (  # top's facts (the set TOP), in the facts script's framing
            "@@sparkdeploy-facts@@ home\n/home/spark\n"
            "@@sparkdeploy-facts@@ running\nsparkdeploy-vllm\tsolo\t\n"
            f"@@sparkdeploy-facts@@ manifests\n@@manifest .sparkdeploy\n{json.dumps(manifest)}\n"
        ),
        "__f_guard_status()": "@@sparkdeploy-facts@@ home\n/home/spark\n@@sparkdeploy-facts@@ guard_status\n",
    }


def _stop(proc: subprocess.Popen, sig: int, waiting: threading.Event, what: str) -> tuple[float, str]:
    """Wait until the command blocks (`waiting`), signal it; (seconds to its exit, its stderr)."""
    assert waiting.wait(20), (
        f"the command never reached {what}: {proc.stderr.read() if proc.poll() is not None else ''}"
    )
    time.sleep(0.2)  # inside the blocking call, not on its way to it
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        proc.wait(10)
    finally:
        took = time.monotonic() - t0
    return took, proc.stderr.read() if proc.stderr else ""


def _assert_stopped(proc: subprocess.Popen, sig: int, took: float, err: str) -> None:
    assert proc.returncode == EXIT[sig], f"exit {proc.returncode}, stderr:\n{err[-3000:]}"
    assert took < STOP_S, f"{took:.2f} s after {signal.Signals(sig).name}, stderr:\n{err[-3000:]}"
    assert "Traceback" not in err, err[-3000:]
    assert f"stopped ({'Ctrl-C' if sig == signal.SIGINT else 'SIGTERM'})" in err, err[-3000:]


@SIGNALS
def test_top_stalled_in_an_ssh_read_stops_at_once(sig, tmp_path, env):
    with StallingSSH() as node:  # the endpoints read (on a worker thread) never answers
        proc = spawn_cli("top", "-i", str(node.inventory(tmp_path)), env=env)
        took, err = _stop(proc, sig, node.stalled, "the SSH read")
    _assert_stopped(proc, sig, took, err)


def test_top_stalled_connecting_stops_at_once(tmp_path, env):
    with StallingSSH(stall_at_banner=True) as node:  # TCP accepted, no SSH banner ever comes
        proc = spawn_cli("top", "-i", str(node.inventory(tmp_path)), env=env)
        took, err = _stop(proc, signal.SIGINT, node.stalled, "the connect")
    _assert_stopped(proc, signal.SIGINT, took, err)


def test_top_into_a_pipe_stalled_in_a_scrape_stops_at_once(tmp_path, env):
    with StallingHTTP(answered=1) as metrics, StallingSSH(_targets_answer(metrics.port)) as node:
        proc = spawn_cli("top", "-i", str(node.inventory(tmp_path)), "--interval", "0.2", env=env)
        took, err = _stop(proc, signal.SIGTERM, metrics.stalled, "a scrape of /metrics")
        out = proc.stdout.read()
    _assert_stopped(proc, signal.SIGTERM, took, err)
    assert "sparkdeploy top (" in out and "\x1b[" not in out, out  # the pipe fallback: plain tables


@SIGNALS
def test_live_top_on_a_terminal_stops_at_once_and_gives_the_terminal_back(sig, tmp_path, env):
    with StallingHTTP(answered=1) as metrics, StallingSSH(_targets_answer(metrics.port)) as node:
        master, slave = pty.openpty()
        proc = spawn_cli("top", "-i", str(node.inventory(tmp_path)), "--interval", "0.2", stdout=slave, env=env)
        os.close(slave)
        screen = bytearray()

        def read() -> None:
            while True:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the last writer closed the terminal
                    return
                if not chunk:
                    return
                screen.extend(chunk)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            took, err = _stop(proc, sig, metrics.stalled, "a scrape of /metrics under the live display")
        finally:
            reader.join(5)
            os.close(master)
    _assert_stopped(proc, sig, took, err)
    assert HIDE_CURSOR in screen, bytes(screen[-2000:])  # the live display was on
    assert SHOW_CURSOR in screen[screen.rindex(HIDE_CURSOR) :], "the cursor stayed hidden: " + repr(
        bytes(screen[-500:])
    )


def test_top_started_with_sigint_ignored_keeps_ignoring_it_and_stops_on_sigterm(tmp_path, env):
    """`nohup` or `cmd &` in a script asks for SIGINT to be ignored: the handler honours it."""
    with StallingSSH() as node:
        ignoring = (
            "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); os.execv(sys.argv[1], sys.argv[1:])"
        )
        argv = [sys.executable, "-c", ignoring, *cli_argv("top", "-i", str(node.inventory(tmp_path)))]
        proc = spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert node.stalled.wait(20), proc.stderr.read() if proc.poll() is not None else ""
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert proc.poll() is None, "an inherited SIG_IGN was overridden"
        took, err = _stop(proc, signal.SIGTERM, node.stalled, "the SSH read")
    _assert_stopped(proc, signal.SIGTERM, took, err)


@SIGNALS
def test_logs_follow_stalled_in_an_ssh_read_stops_at_once(sig, tmp_path, env):
    with StallingSSH() as node:  # the node's log stream (on its thread) stays silent
        proc = spawn_cli("logs", "-f", "-i", str(node.inventory(tmp_path)), env=env)
        took, err = _stop(proc, sig, node.stalled, "the log stream")
    _assert_stopped(proc, sig, took, err)


@SIGNALS
def test_bench_stalled_reading_the_deployment_stops_at_once(sig, tmp_path, env):
    with StallingSSH() as node:  # bench reads what is deployed (status' facts) before it measures anything
        proc = spawn_cli("bench", "-i", str(node.inventory(tmp_path)), "--out", str(tmp_path / "out"), env=env)
        took, err = _stop(proc, sig, node.stalled, "the status read")
    _assert_stopped(proc, sig, took, err)


# `up`'s health gate, where `up` runs it: inside its graceful Interrupt, the node locks and the session (as
# deploy/up.deploy), for a deployment whose container was just started; the gate's read of the container states
# stalls. Reaching the gate through the whole `up` would need facts, preflight and SFTP writes from the server.
UP_GATE = textwrap.dedent("""
    import sys
    import click
    from sparkdeploy.runtime.interrupts import Interrupt
    from sparkdeploy.runtime.locks import inventory_lock, node_locks
    from sparkdeploy.runtime.session import Session
    from sparkdeploy.cli.common import run_cli
    from sparkdeploy.topologies.context import load_deployment
    from sparkdeploy.deploy.progress import Reporter
    from sparkdeploy.deploy.up import failure_lines, health_phase
    from sparkdeploy.deploy.up_result import Phase, Progress, UpResult
    from sparkdeploy.errors import StepFailed
    from sparkdeploy.deploy.plan import CHANGED, NodePlan, Plan, StepKind

    @click.command()
    def gate():
        dep = load_deployment(sys.argv[1], None, "solo")
        inv, out, seen = dep.inventory, Reporter(), Progress(Phase.APPLY)
        plan = Plan([NodePlan(inv.nodes[0], "/state")])
        plan.nodes[0].add(phase=2, kind=StepKind.START_CONTAINER, target="sparkdeploy-vllm", change=True, reason="")
        plan.steps[0].status = CHANGED
        seen.plan = plan
        with inventory_lock(inv), Interrupt(out.progress) as interrupt, Session.open(inv) as session:
            with node_locks(session, False, out.warn):
                try:
                    health_phase(dep, session, plan, interrupt, 300, out, UpResult(), seen)
                except (KeyboardInterrupt, StepFailed) as exc:
                    failure_lines(inv, seen, exc, out)
                    raise

    sys.exit(run_cli(gate, []))
""")


@SIGNALS
def test_up_health_gate_stalled_in_an_ssh_read_stops_at_once(sig, tmp_path, env):
    with StallingSSH({"mkdir -m 0700": "TAKEN\n", "rm -rf": ""}) as node:  # the node lock: taken, released
        proc = spawn(
            [sys.executable, "-c", UP_GATE, str(node.inventory(tmp_path))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "PYTHONPATH": str(REPO)},
            cwd=tmp_path,
        )
        took, err = _stop(proc, sig, node.stalled, "the container states read")
    _assert_stopped(proc, sig, took, err)
    assert "interrupted during the health gate" in err, err
    # the node still busy with the abandoned read is not waited for: its lock stays, and the run says so
    assert "the node lock ~/.sparkdeploy.lock stays there (it was still busy with a command" in err, err


def _deliver(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.5)  # the handler runs in this (main) thread at the next bytecode: within the sleep


def test_the_handler_keeps_an_inherited_ignore_raises_and_restores_what_was_there():
    """In this process (pure logic of sparkdeploy/runtime/interrupts.py, real signals)."""
    from sparkdeploy.runtime import interrupts

    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `cmd &` starts a job
    old_term = signal.getsignal(signal.SIGTERM)
    try:
        with interrupts.handling():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            with pytest.raises(KeyboardInterrupt):
                _deliver(signal.SIGTERM)
            assert interrupts.received() == signal.SIGTERM and interrupts.exit_code() == 143
            assert interrupts.STOP.is_set() and not interrupts.STOPPING.is_set()
        assert signal.getsignal(signal.SIGTERM) is old_term
    finally:
        signal.signal(signal.SIGINT, old_int)


def test_graceful_notifies_first_raises_second_and_immediate_raises_at_once():
    from sparkdeploy.runtime import interrupts

    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)  # as an interactive shell starts a job:
    try:  # a suite started with `cmd &` (scripts/test.sh runs the fast suite so) inherits SIGINT ignored, kept so
        _graceful_then_immediate(interrupts)  # (the test above): here the SIGINT must reach the handler
    finally:
        signal.signal(signal.SIGINT, old_int)


def _graceful_then_immediate(interrupts: ModuleType) -> None:
    seen: list[int] = []
    with interrupts.handling(), interrupts.graceful(seen.append):
        _deliver(signal.SIGINT)  # steps under way finish: nothing raised
        assert seen == [signal.SIGINT] and interrupts.STOP.is_set()
        with pytest.raises(KeyboardInterrupt):
            _deliver(signal.SIGINT)
        assert interrupts.STOPPING.is_set()  # no new remote command from now on
    with interrupts.handling(), interrupts.graceful(seen.append):  # a fresh run
        assert interrupts.received() is None and not interrupts.STOPPING.is_set()
        with pytest.raises(KeyboardInterrupt), interrupts.immediate():
            _deliver(signal.SIGTERM)  # nothing under way to finish: at once
        assert seen == [signal.SIGINT] and interrupts.exit_code() == 143
