"""Fast tests of what `up` says per node after a Ctrl-C or a failure, and of the hold hook the lab matrix uses."""

from __future__ import annotations

import threading
import time

from sparkdeploy.deploy.plan import CHANGED, FAILED, SKIPPED, plan_deployment
from sparkdeploy.deploy.up import _node_lines
from sparkdeploy.deploy.up_result import Phase, Progress
from sparkdeploy.runtime.holds import HOLD_ENV, HOLD_UNTIL_ENV, hold_point
from sparkdeploy.runtime.interrupts import Interrupt
from tests.deploy.deploy_helpers import empty_facts, make_deployment


def _plan():
    dep = make_deployment("cluster")
    return dep, plan_deployment(dep, {n.name: empty_facts(n.name) for n in dep.inventory.nodes})


def test_before_any_change_every_node_says_nothing_changed():
    dep, _ = _plan()
    lines = _node_lines(dep.inventory, Progress(), "interrupted (Ctrl-C)")
    assert lines == [
        "spark1 (192.0.2.1): interrupted (Ctrl-C); nothing changed here",
        "spark2 (192.0.2.2): interrupted (Ctrl-C); nothing changed here",
    ]


def test_unreachable_node_is_named_with_its_error():
    dep, _ = _plan()
    facts = {"spark1": empty_facts("spark1"), "spark2": OSError("No route to host")}
    lines = _node_lines(dep.inventory, Progress(Phase.PREFLIGHT, facts=facts), "preflight failed")
    assert lines[0] == "spark1 (192.0.2.1): preflight failed; nothing changed here"
    assert lines[1] == "spark2 (192.0.2.2): UNREACHABLE, nothing changed here: No route to host"


def test_a_failed_step_and_the_steps_not_done_are_counted_per_node():
    dep, plan = _plan()
    head, worker = plan.nodes
    head.changes[0].status = CHANGED
    for s in head.changes[1:]:
        s.status = SKIPPED
    worker.changes[0].status, worker.changes[0].detail = CHANGED, ""
    worker.changes[1].status, worker.changes[1].detail = FAILED, "connection lost"
    for s in worker.changes[2:]:
        s.status = SKIPPED
    lines = _node_lines(dep.inventory, Progress(Phase.APPLY, plan=plan), "the run failed")
    assert lines[0].startswith("spark1 (192.0.2.1): the run failed: 1 change(s) made, ")
    assert f"not done (next: {head.changes[1].label})" in lines[0]
    assert lines[1].startswith(
        f"spark2 (192.0.2.2): FAILED at {worker.changes[1].label}: connection lost; 1 change(s) made before it"
    )


def test_hold_point_waits_for_ctrl_c_or_the_release_file(monkeypatch, tmp_path, capsys):
    interrupt = Interrupt()
    hold_point("write", interrupt)  # not asked for: returns at once
    monkeypatch.setenv(HOLD_ENV, "write")
    monkeypatch.setenv(HOLD_UNTIL_ENV, str(tmp_path / "go"))
    threading.Timer(0.3, (tmp_path / "go").touch).start()
    t0 = time.monotonic()
    hold_point("write", interrupt)
    assert 0.25 < time.monotonic() - t0 < 5
    assert "hold: at write" in capsys.readouterr().err
    monkeypatch.setenv(HOLD_UNTIL_ENV, str(tmp_path / "never"))
    threading.Timer(0.3, interrupt.event.set).start()
    t0 = time.monotonic()
    hold_point("write", interrupt)
    assert 0.25 < time.monotonic() - t0 < 5


def test_lock_release_skips_a_node_lost_mid_run_and_says_its_lock_stays():
    """Pure logic of NodeLocks' release (the lab matrix shows it against real nodes): no wait on a dead node."""
    from sparkdeploy.runtime.locks import NodeLocks
    from tests.support.doubles import RecordingConn, recording_session

    dep = make_deployment("cluster")
    spark1, spark2 = dep.inventory.nodes
    session = recording_session(dep.inventory, spark1=RecordingConn(spark1), spark2=RecordingConn(spark2, lost=True))
    said = []
    locks = NodeLocks(session, said.append)
    locks.taken = list(dep.inventory.nodes)
    locks.__exit__()
    assert [n for n, c in session.conns.items() if c.commands] == ["spark1"]
    assert len(said) == 1 and said[0].startswith("spark2 (192.0.2.2): the node lock ~/.sparkdeploy.lock stays")
    assert "rm -r ~/.sparkdeploy.lock" in said[0]
