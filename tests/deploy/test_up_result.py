"""`up`'s typed seams (deploy/up_result.py): the --json object keeps its keys and their order, only what was
reached, masked; a failure's per-node lines follow the phase the run reached (a field, not guessed from keys)."""

from __future__ import annotations

import pytest

from sparkdeploy.deploy import health
from sparkdeploy.deploy.plan import CHANGED, plan_deployment
from sparkdeploy.deploy.progress import Reporter
from sparkdeploy.deploy.up import failure_lines
from sparkdeploy.deploy.up_result import Deployed, Phase, Progress, UpResult
from sparkdeploy.errors import StepFailed
from tests.deploy.deploy_helpers import SECRET_KEY, empty_facts, make_deployment

# The order `up` wrote its result dict in before UpResult (deploy/up.py's writes, in flow order): --json keeps it.
KEYS = [
    "rolled_back_to",
    "recipe",
    "topology",
    "backend",
    "image",
    "endpoint",
    "backends",
    "metrics_url",
    "dry_run",
    "ok",
    "registry_image",
    "replaces",
    "pushed",
    "preflight",
    "fabric_gate",
    "steps",
    "changes",
    "changed",
    "counts",
    "health",
    "history_id",
]


def _deployed() -> Deployed:
    return Deployed("r", "solo", None, "img:1", "http://192.0.2.1:8000/v1", [], None)


def test_nothing_reached_is_an_empty_object_so_no_json_is_printed():
    assert UpResult().as_dict() == {}
    assert UpResult(rolled_back_to="7").as_dict() == {"rolled_back_to": "7"}  # rollback, before the recipe loads


def test_keys_in_flow_order_only_when_reached_and_masked():
    r = UpResult(rolled_back_to="3", deployed=_deployed(), dry_run=False)
    r.mask = lambda s: s.replace(SECRET_KEY, "***")
    r.history_id, r.health, r.counts, r.changed = "9", {"ok": True}, {"changed": 1}, 1  # set out of order
    r.steps, r.fabric_gate, r.preflight = [], {"status": "not applicable"}, [{"detail": f"key {SECRET_KEY}"}]
    r.pushed, r.replaces, r.registry_image, r.changes = [], "x / solo on spark1", {"reference": "r"}, 2
    r.ok = True
    data = r.as_dict()
    assert list(data) == KEYS
    assert data["ok"] is True and data["backend"] is None and data["metrics_url"] is None  # None: reached, shown
    assert data["preflight"] == [{"detail": "key ***"}]  # masked like every message
    assert SECRET_KEY not in repr(data)


def test_a_dry_run_refused_by_preflight_shows_what_it_reached():
    r = UpResult(deployed=_deployed(), dry_run=True)
    r.preflight, r.steps = [{"ok": False}], []
    assert list(r.as_dict()) == ["recipe", "topology", "backend", "image", "endpoint", "backends"] + [
        "metrics_url",
        "dry_run",
        "ok",
        "preflight",
        "steps",
    ]


class Lines(Reporter):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def line(self, message: str, style: str | None = None) -> None:
        self.lines.append(message)


def _lines(seen: Progress, exc: BaseException) -> list[str]:
    dep = make_deployment("solo")
    out = Lines()
    failure_lines(dep.inventory, seen, exc, out)
    return out.lines


@pytest.mark.parametrize(
    "phase,why",
    [
        (Phase.CONNECT, "the run failed; nothing changed here"),
        (Phase.PREFLIGHT, "preflight failed; nothing changed here"),
        (Phase.FABRIC_GATE, "the fabric gate refused; nothing changed here"),
    ],
)
def test_before_apply_the_phase_says_why_nothing_changed(phase, why):
    dep = make_deployment("solo")
    facts = {n.name: empty_facts(n.name) for n in dep.inventory.nodes}
    lines = _lines(Progress(phase, facts=facts), StepFailed("no"))
    assert lines == [f"spark1 (192.0.2.1): {why}", f"spark2 (192.0.2.2): {why}"]


def test_a_ctrl_c_before_apply_is_an_interruption_whatever_the_phase():
    lines = _lines(Progress(Phase.PREFLIGHT), KeyboardInterrupt())
    assert lines[0] == "spark1 (192.0.2.1): interrupted (Ctrl-C); nothing changed here"


def test_after_apply_each_node_says_what_its_steps_did_and_the_gate():
    dep = make_deployment("solo")
    facts = {n.name: empty_facts(n.name) for n in dep.inventory.nodes}
    plan = plan_deployment(dep, facts)
    for s in plan.steps:
        s.status = CHANGED
    seen = Progress(Phase.APPLY, facts=facts, plan=plan)
    assert _lines(seen, StepFailed("no"))[0].endswith(f"every step applied ({len(plan.nodes[0].steps)} changed)")
    seen.gate = health.GateResult(False, 1.0, [], "timeout")
    seen.reach(Phase.HEALTH)
    assert _lines(seen, StepFailed("gate"))[0].endswith("; health gate failed")
    assert _lines(seen, KeyboardInterrupt())[0].endswith("; interrupted during the health gate")
