"""The guard as part of the deployment: one `sparkdeploy-guard` per engine node with the managed labels (so `down`
removes it and `status` sees it), its least-privilege run options, and bad input refused with one line, exit 2."""

from __future__ import annotations

import copy

import pytest

from sparkdeploy.config.guard_settings import GUARD_FOLDER
from sparkdeploy.deploy.plan import plan_removal
from sparkdeploy.errors import ConfigError
from sparkdeploy.guard.lines import check_lines
from sparkdeploy.topologies.guard import GUARD_CONTAINER
from tests.conftest import TWO_NODES
from tests.deploy.deploy_helpers import empty_facts
from tests.test_render import deployment


def _with_guard(**settings):
    inv = copy.deepcopy(TWO_NODES)
    inv["cluster"]["guard"] = settings
    return inv


def test_every_engine_node_gets_one_guard_with_the_managed_labels():
    for topology, engine_nodes in (
        ("solo", {"spark1"}),
        ("2xsolo", {"spark1", "spark2"}),
        ("cluster", {"spark1", "spark2"}),
    ):
        dep = deployment(topology, "ray" if topology == "cluster" else None)
        guarded = {nd.node.name for nd in dep.nodes if any(c.name == GUARD_CONTAINER for c in nd.containers)}
        assert guarded == engine_nodes, topology
    nd = deployment("2xsolo").node("spark2")
    run = nd.file("guard.run.sh").content
    assert "--label io.sparkdeploy.managed=true" in run and "--label io.sparkdeploy.role=guard" in run
    assert "--volume /var/run/docker.sock:/var/run/docker.sock" in run
    assert "--volume /proc/sys/vm/drop_caches:/host/drop_caches" in run
    assert "--privileged" not in run and "secrets.env" not in run  # neither privileged nor given the secrets
    assert '"grace_s":5' in nd.file("guard.entry.sh").content


def test_the_guard_can_be_turned_off():
    dep = deployment("2xsolo", inventory=_with_guard(enabled=False))
    assert not any(c.name == GUARD_CONTAINER for nd in dep.nodes for c in nd.containers)


def test_down_removes_the_black_box_folder():
    facts = empty_facts("spark1")
    facts.state_dir_mode = 0o700
    facts.other_entries = [GUARD_FOLDER]
    plan = plan_removal(deployment().node("spark1").node, facts, ".sparkdeploy")
    assert [(s.kind, s.target) for s in plan.steps][-2:] == [
        ("remove-folder", "guard"),
        ("rmdir", "/home/spark/.sparkdeploy"),
    ]
    assert plan.steps[-1].change


def test_a_guard_line_above_the_nodes_memory_is_refused_with_one_line():
    dep = deployment("2xsolo", inventory=_with_guard(hard_available_gib=200))
    facts = {n: empty_facts(n) for n in ("spark1", "spark2")}  # 122570 MiB each
    with pytest.raises(ConfigError) as exc:
        check_lines(dep, facts)
    problems = exc.value.problems
    assert [p.field for p in problems] == ["cluster.guard.hard_available_gib"] * 2
    assert "200 GiB is not below spark1's memory (119.7 GiB)" in str(problems[0])
    check_lines(deployment("2xsolo", inventory=_with_guard(hard_available_gib=2, soft_available_gib=6)), facts)


def test_a_hard_line_above_the_soft_line_is_refused(write_inventory, cli):
    inv = write_inventory(_with_guard(soft_available_gib=2, hard_available_gib=3))
    code, out, err = cli(
        "render", "openai-gpt-oss-120b", "-i", str(inv), "-t", "solo", "--out", str(inv.parent / "out")
    )
    assert code == 2, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "cluster.guard.hard_available_gib" in lines[0] and "Traceback" not in err, err


def test_an_unknown_guard_field_is_refused(write_inventory, cli):
    inv = write_inventory(_with_guard(hard_line=3))
    code, _, err = cli("render", "openai-gpt-oss-120b", "-i", str(inv), "-t", "solo", "--out", str(inv.parent / "out"))
    assert code == 2 and "guard" in err and "hard_line" in err, err


def test_a_recipe_sets_its_own_lines_over_the_inventorys():
    dep = deployment("solo", sets=("guard.hard_available_gib=6", "guard.grace_s=20"), inventory=_with_guard(grace_s=9))
    entry = dep.node("spark1").file("guard.entry.sh").content
    assert '"hard_bytes":6442450944' in entry and '"grace_s":20' in entry
    assert (
        '"grace_s":9'
        in deployment("solo", inventory=_with_guard(grace_s=9)).node("spark1").file("guard.entry.sh").content
    )
    with pytest.raises(ConfigError) as exc:
        check_lines(deployment("solo", sets=("guard.soft_available_gib=500",)), {"spark1": empty_facts("spark1")})
    assert exc.value.problems[0].field == "cluster.guard.soft_available_gib"


def test_the_nodeside_guard_skips_the_same_roles_as_the_deployment():
    """nodeside/guard/run.py is stdlib only (it runs in the guard's image), so it keeps its own copy of the roles
    that hold no engine: the guard must stop exactly what `up` counts as an engine."""
    from sparkdeploy import labels
    from sparkdeploy.nodeside.guard import run

    assert run.NOT_ENGINES == labels.NOT_ENGINES
