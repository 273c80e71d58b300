"""The fabric gate's decision and refusal (sparkdeploy/deploy/fabric_gate.py), from pure inputs: hand-built
deployments, facts and plans (no node). The lab tests (test_fabric_gate_lab.py) run it for real."""

from __future__ import annotations

import pytest

from sparkdeploy.checks import FAIL, PASS, Result
from sparkdeploy.deploy import fabric_gate
from sparkdeploy.deploy.plan import plan_deployment
from sparkdeploy.deploy.preflight import PreflightRun
from sparkdeploy.deploy.progress import Reporter
from sparkdeploy.deploy.up_result import UpResult
from sparkdeploy.doctor import gpu, image
from sparkdeploy.errors import ConfigError, StepFailed
from sparkdeploy.facts import GpuFact
from tests.deploy.deploy_helpers import IMAGE, IMAGE_ID, converged_facts, empty_facts, make_deployment
from tests.support.doubles import recording_session


class Lines(Reporter):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def line(self, message: str, style: str | None = None) -> None:
        self.lines.append(message)

    def progress(self, message: str) -> None:
        self.lines.append(message)


def _plan(topology: str, facts_of, value: str = "1"):
    dep = make_deployment(topology, value=value)
    before = make_deployment(topology)
    facts = {
        n.name: (facts_of(before, n.name) if facts_of is converged_facts else facts_of(n.name))
        for n in dep.inventory.nodes
    }
    return dep, facts, plan_deployment(dep, facts)


def test_decide_runs_only_for_gated_topologies_with_changed_engines():
    assert fabric_gate.decide("cluster", True, ["spark1: sparkdeploy-head"]).runs
    assert fabric_gate.decide("replicas", True, ["spark3: sparkdeploy-head"]).runs
    assert fabric_gate.decide("solo", True, ["spark1: sparkdeploy-vllm"]).action == fabric_gate.NOT_APPLICABLE
    assert fabric_gate.decide("2xsolo", True, ["spark1: sparkdeploy-vllm"]).action == fabric_gate.NOT_APPLICABLE
    off = fabric_gate.decide("cluster", False, ["spark1: sparkdeploy-head"])
    assert off.action == fabric_gate.SKIPPED and "--no-fabric-gate" in off.reason
    same = fabric_gate.decide("cluster", True, [])
    assert same.action == fabric_gate.SKIPPED and "unchanged" in same.reason


def test_engine_changes_from_the_plan_fresh_changed_and_unchanged():
    _dep, _facts, fresh = _plan("cluster", empty_facts)
    assert sorted(fabric_gate.engine_changes(fresh)) == ["spark1: sparkdeploy-vllm", "spark2: sparkdeploy-vllm"]
    _dep, _facts, same = _plan("cluster", converged_facts)
    assert fabric_gate.engine_changes(same) == []
    _dep, _facts, changed = _plan("cluster", converged_facts, value="2")
    assert len(fabric_gate.engine_changes(changed)) == 2


def _gate(topology: str, facts_of, enabled: bool = True, dry_run: bool = False, value: str = "1"):
    dep, facts, plan = _plan(topology, facts_of, value)
    out, result = Lines(), UpResult()
    fabric_gate.gate(dep, None, facts, plan, out, result, dry_run, enabled, True)  # type: ignore[arg-type]  # no session: these paths connect nowhere
    return out.lines, result.fabric_gate


def test_unchanged_deployment_skips_and_says_so():
    lines, report = _gate("cluster", converged_facts)
    assert report["status"] == "skipped" and "unchanged" in report["reason"]
    assert lines == ["fabric gate: skipped: the deployment is unchanged (no engine container changes)"]


def test_no_fabric_gate_skips_and_says_so():
    lines, report = _gate("cluster", empty_facts, enabled=False)
    assert report["status"] == "skipped"
    assert len(lines) == 1 and "--no-fabric-gate" in lines[0]


def test_dry_run_shows_the_plan_line_and_runs_nothing():
    lines, report = _gate("cluster", empty_facts, dry_run=True)
    assert report["status"] == "planned"
    assert len(lines) == 1 and lines[0].startswith("fabric gate: will run before any engine starts")


def test_solo_has_no_gate_line():
    lines, report = _gate("solo", empty_facts)
    assert report["status"] == fabric_gate.NOT_APPLICABLE and lines == []


def test_a_failed_check_refuses_with_figure_expected_and_fix(monkeypatch):
    rows = [
        Result(PASS, "ok", check="image.same_id"),
        Result(
            FAIL,
            "probe failed: spark2: exit 1: timeout",
            "busbw >= 18.4 GB/s",
            "check the rendezvous path",
            check=fabric_gate.PROBE,
        ),
    ]
    monkeypatch.setattr(fabric_gate, "run_checks", lambda ctx, timeout_s=fabric_gate.TIMEOUT_S: rows)
    dep, facts, plan = _plan("cluster", empty_facts)
    for f in facts.values():
        f.gpu = GpuFact()  # read: no extra round trip
    result = UpResult()

    with pytest.raises(StepFailed) as exc:
        fabric_gate.gate(dep, recording_session(dep.inventory), facts, plan, Lines(), result, False, True, True)
    text = str(exc.value)
    assert "fabric gate failed SIMULATED" in text
    assert "probe failed: spark2: exit 1: timeout" in text and "busbw >= 18.4 GB/s" in text
    assert "fix: check the rendezvous path" in text and "No engine was started" in text
    assert result.fabric_gate is not None
    assert result.fabric_gate["status"] == "failed" and len(result.fabric_gate["checks"]) == 2


def test_the_probe_waits_the_environments_timeout_else_its_own(monkeypatch):
    """A test that breaks the fabric on purpose sets a shorter wait (tests/deploy/test_fabric_gate_lab.py)."""
    asked: list[float] = []
    monkeypatch.setattr(fabric_gate, "run_checks", lambda ctx, timeout_s: asked.append(timeout_s) or [])
    dep, facts, plan = _plan("cluster", empty_facts)
    for f in facts.values():
        f.gpu = GpuFact()

    def gate() -> None:
        fabric_gate.gate(dep, recording_session(dep.inventory), facts, plan, Lines(), UpResult(), False, True, True)

    monkeypatch.delenv(fabric_gate.TIMEOUT_ENV, raising=False)
    gate()
    monkeypatch.setenv(fabric_gate.TIMEOUT_ENV, " 12.5 ")
    gate()
    assert asked == [fabric_gate.TIMEOUT_S, 12.5]
    for bad in ("0", "-3", "soon", "nan", "inf"):
        monkeypatch.setenv(fabric_gate.TIMEOUT_ENV, bad)
        with pytest.raises(ConfigError) as exc:
            gate()
        line = str(exc.value)
        assert fabric_gate.TIMEOUT_ENV in line and "seconds above 0" in line and "\n" not in line, line
    assert len(asked) == 2  # a refused value runs no probe


def _driver_run(versions: dict[str, str | None]) -> PreflightRun:
    dep = make_deployment("cluster")
    facts = {}
    for n in dep.inventory.nodes:
        f = empty_facts(n.name)
        v = versions.get(n.name)
        f.gpu = GpuFact(rc=0, gpus=[{"name": "NVIDIA GB10", "driver_version": v}] if v else [])
        facts[n.name] = f
    return PreflightRun(dep, facts)  # type: ignore[arg-type]


def test_same_driver_check():
    assert gpu.same_driver(_driver_run({"spark1": "580.95.05", "spark2": "580.95.05"})).status == PASS
    differ = gpu.same_driver(_driver_run({"spark1": "580.95.05", "spark2": "575.57.08"}))
    assert differ.status == FAIL
    assert "spark1 580.95.05" in differ.measured and "spark2 575.57.08" in differ.measured
    assert "580.95.05" in differ.fix
    assert gpu.same_driver(_driver_run({})).status == "skip"


def test_torch_nccl_compares_cuda_too(monkeypatch):
    """image.torch_nccl (the gate's version check): the same torch and NCCL but another CUDA on one node fails."""
    dep = make_deployment("cluster")
    facts = {}
    for n in dep.inventory.nodes:
        f = empty_facts(n.name)
        f.images = {IMAGE: IMAGE_ID}
        facts[n.name] = f
    ctx = PreflightRun(dep, facts)  # type: ignore[arg-type]
    found = {
        "spark1": {"torch": "2.9.0", "cuda": "13.0", "nccl": "2.27.7"},
        "spark2": {"torch": "2.9.0", "cuda": "12.9", "nccl": "2.27.7"},
    }
    monkeypatch.setattr(image, "versions", lambda run, node: found[node.name])  # what `docker run` would print
    row = image.torch_nccl(ctx, dep.inventory.nodes[0])
    assert row.status == FAIL and "cuda 13.0 here, 12.9 on spark2" in row.measured, row
    found["spark2"]["cuda"] = "13.0"
    assert image.torch_nccl(ctx, dep.inventory.nodes[0]).status == PASS
