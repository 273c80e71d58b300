"""doctor's model.present (issue 39): the recipe's model AND its speculative draft read on each engine node through
the one reading of a node's HF cache (models/listing.py `presence`: the nodeside `models status` program, run here
as the node runs it, each node's cache its own folder), with the pull that fixes each as its fix and in --json."""

from __future__ import annotations

from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.doctor.api import render
from sparkdeploy.doctor.doctor_run import DoctorRun, NodeSession
from sparkdeploy.doctor.registry import BY_ID
from sparkdeploy.doctor.runner import _run_tasks, _Task
from tests.support.doubles import local_shell

RECIPE = "openai-gpt-oss-120b-eagle3"
DRAFT = "nvidia/gpt-oss-120b-Eagle3-long-context"


def doctor_run(inventory_file, tmp_path, simulated: bool) -> DoctorRun:
    run = DoctorRun(inventory=load_inventory(str(inventory_file)))
    render(run, RECIPE, "solo", None, "given with --recipe", None)
    assert run.deployment is not None, run.deployment_error
    run.simulated_image = simulated
    for node in run.nodes:
        home = tmp_path / node.name
        home.mkdir(exist_ok=True)
        run.sessions[node.name] = NodeSession(node, local_shell(node, home), connected=True)  # type: ignore[arg-type]
    return run


def checked(run: DoctorRun):
    """The doctor runner's rows of model.present, one task per node (as `doctor --only model` runs it)."""
    rows = _run_tasks(run, [_Task(BY_ID["model.present"], n) for n in run.nodes])
    assert {r.check for r in rows} == {"model.present"}
    return rows


def test_doctor_checks_the_model_and_its_draft_on_each_engine_node(inventory_file, tmp_path):
    run = doctor_run(inventory_file, tmp_path, simulated=False)
    rows = checked(run)
    # solo: the engine runs on spark1 only; spark2 starts no engine and needs no weights
    assert [r.status for r in rows if r.node == "spark2"] == ["skip"]
    rows = [r for r in rows if r.node == "spark1"]
    assert [r.data.get("role") for r in rows] == ["model", "draft"], [r.measured for r in rows]
    assert all(r.status == "fail" and r.data["state"] == "absent" for r in rows)
    draft = [r for r in rows if r.data["role"] == "draft"]
    for r in draft:
        assert DRAFT in r.measured and r.data["ref"] == DRAFT
        assert f"sparkdeploy models pull {RECIPE} --inventory {inventory_file}" in r.fix
        assert r.to_dict()["data"]["pull"] in r.fix  # --json carries the command too
    model = next(r for r in rows if r.data["role"] == "model")
    assert "sparkdeploy models pull openai/gpt-oss-120b" in model.fix


def test_a_simulated_engine_passes_a_model_and_draft_absent_everywhere(inventory_file, tmp_path):
    run = doctor_run(inventory_file, tmp_path, simulated=True)
    rows = checked(run)
    assert [(r.node, r.status) for r in rows] == [("spark1", "pass")] * 2 + [("spark2", "skip")]
    assert all("the simulated engine reads no weights" in r.measured for r in rows if r.status == "pass")
