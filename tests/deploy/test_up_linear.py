"""`up` is one linear pass (issue 37 item 2): the nodes' facts read once, one plan made from them, preflight judging
those facts and that plan (never planning again), the gate, apply. A missing image is the image step: pushed, then
only the nodes that got it read again. Pure logic: the node reads are recorded, nothing connects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from sparkdeploy.deploy import fabric_gate, plan, preflight
from sparkdeploy.deploy import up as up_pipeline
from sparkdeploy.deploy.progress import Reporter
from sparkdeploy.deploy.up_result import Progress, UpResult
from tests.deploy.deploy_helpers import PROXY_IMAGE, converged_facts, empty_facts, make_deployment


@dataclass
class NoInterrupt:
    set: bool = False


@dataclass
class NoSession:
    """Nothing connects: every read of a node is the recorded gather_facts below."""

    conns: dict[str, Any]


class Applied(Exception):
    """Raised where apply would start: the test has seen the flow up to there."""


@pytest.fixture
def flow(monkeypatch):
    """Records every read of the nodes' state (gather_facts: which nodes, which set) and every node planned."""
    reads: list[tuple[str, list[str]]] = []
    planned: list[str] = []
    pushed: list[list[str]] = []
    have: dict[str, set[str]] = {}  # node -> images it holds after a push

    def gather(session, nodes, images_for=lambda n: [], hf_cache="~", model="", what="state", state_dir=None):
        reads.append((what, [n.name for n in nodes]))
        out: dict[str, Any] = {}
        for n in nodes:
            f = empty_facts(n.name)
            for ref in have.get(n.name, ()):
                f.images[ref] = "sha256:" + "c" * 64
            out[n.name] = f
        return out

    def resources(session, facts, names, hf_cache, model):
        reads.append(("resources", sorted(n for n in facts if n in names)))

    real_plan_node = plan.plan_node

    def plan_node(dep, nd, facts):
        planned.append(nd.node.name)
        return real_plan_node(dep, nd, facts)

    def push(dep, failed, out, into=None):
        names = sorted({c.node for c in failed if c.missing_image})
        pushed.append(names)
        for n in names:
            have.setdefault(n, set()).add(PROXY_IMAGE)
        return True

    monkeypatch.setattr(up_pipeline, "gather_facts", gather)
    monkeypatch.setattr(up_pipeline, "add_resources", resources)
    monkeypatch.setattr(up_pipeline, "push_missing", push)
    monkeypatch.setattr(up_pipeline.up_check, "checks", lambda *a, **k: [])  # the model: its own tests
    monkeypatch.setattr(plan, "plan_node", plan_node)
    monkeypatch.setattr(preflight, "plan_node", plan_node)
    monkeypatch.setattr(fabric_gate, "gate", lambda *a, **k: None)

    def apply(session, p, *a, **k):
        raise Applied(p)

    monkeypatch.setattr(up_pipeline, "apply_phase", apply)
    return {"reads": reads, "planned": planned, "pushed": pushed}


def _run(dep, dry_run: bool) -> tuple[UpResult, Any]:
    result = UpResult()
    try:
        up_pipeline._deploy_steps(dep, NoSession({}), NoInterrupt(), Reporter(), result, dry_run, 1.0, True, Progress())
    except Applied as exc:
        return result, exc.args[0]
    return result, None


@pytest.mark.parametrize("topology", ["solo", "cluster", "2xsolo"])
def test_up_reads_the_facts_once_and_plans_once(flow, topology):
    dep = make_deployment(topology)
    nodes = [n.name for n in dep.inventory.nodes]
    result, applied = _run(dep, dry_run=False)
    assert [r for r in flow["reads"] if r[0] == "state"] == [("state", nodes)]  # one read of every node
    assert sorted(flow["planned"]) == sorted(nd.node.name for nd in dep.nodes)  # each node planned once: one plan
    assert applied is not None and result.preflight and flow["pushed"] == []


def test_a_missing_image_is_pushed_then_only_its_nodes_are_read_again(flow, monkeypatch):
    dep = make_deployment("2xsolo")
    real = up_pipeline.gather_facts

    def without_proxy_image(session, nodes, *a, **k):  # spark1 lacks the proxy image until the push
        out = real(session, nodes, *a, **k)
        if "spark1" in out and not flow["pushed"]:
            out["spark1"].images[PROXY_IMAGE] = None
        return out

    monkeypatch.setattr(up_pipeline, "gather_facts", without_proxy_image)
    result, applied = _run(dep, dry_run=False)
    assert flow["pushed"] == [["spark1"]]
    assert [r for r in flow["reads"] if r[0] == "state"] == [("state", ["spark1", "spark2"]), ("state", ["spark1"])]
    assert result.preflight and all(r["ok"] for r in result.preflight) and applied is not None
    assert applied.node("spark1").deployment is not None  # the plan applied is the one made after the push


def test_dry_run_plans_once_and_changes_nothing(flow):
    dep = make_deployment("cluster")
    result, applied = _run(dep, dry_run=True)
    assert applied is None and result.ok and result.steps
    assert [r for r in flow["reads"] if r[0] == "state"] == [("state", ["spark1", "spark2"])]
    assert sorted(flow["planned"]) == ["spark1", "spark2"]


def test_preflight_reads_what_starts_from_the_plan_and_a_group_restart_is_not_the_nodes_own():
    """The memory check counts a node whose own engine changes (as when preflight planned each node itself): a
    rank that restarts only with its group holds its memory already."""
    old = make_deployment("cluster", value="1")
    facts = {n.name: converged_facts(old, n.name) for n in old.inventory.nodes}
    new = make_deployment("cluster", value="2", worker_value="1")  # only the head's engine changes
    the_plan = plan.plan_deployment(new, facts)
    starts = {s.node for s in the_plan.steps if s.kind == plan.StepKind.START_CONTAINER and s.change}
    assert starts == {"spark1", "spark2"}  # the ranks restart together
    run = preflight.PreflightRun(new, dict(facts), plan=the_plan)
    nodes = {n.name: n for n in new.inventory.nodes}
    assert run.starts_engine(nodes["spark1"]) and not run.starts_engine(nodes["spark2"])
    assert [run.starts_engine(n) for n in nodes.values()] == [
        preflight.PreflightRun(new, dict(facts)).starts_engine(n) for n in nodes.values()
    ]
