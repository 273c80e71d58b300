"""The one memory budget (sparkdeploy/recipes/budget.py) and the one check model (preflight = a subset of doctor's
registry). Pure logic: figures worked out by hand in the comments, never read back from the code."""

from __future__ import annotations

import ast
import inspect
import re

import pytest

from sparkdeploy.config.inventory import Inventory
from sparkdeploy.config.secrets import Secrets
from sparkdeploy.deploy import preflight
from sparkdeploy.doctor import gpu
from sparkdeploy.doctor.registry import CHECKS, PREFLIGHT
from sparkdeploy.errors import ConfigError
from sparkdeploy.facts import NodeFacts
from sparkdeploy.recipes import budget
from sparkdeploy.recipes.recipe import resolve
from sparkdeploy.topologies import build_deployment
from sparkdeploy.topologies.fit import fit
from sparkdeploy.topologies.lint import synthetic_inventory
from tests.deploy.deploy_helpers import empty_facts, make_deployment

GIB = 2**30
SPARK = 122570 * 2**20  # the nominal DGX Spark total


def gpt_oss(topology: str):
    return resolve("openai-gpt-oss-120b-bench", topology, None, (), None).recipe  # the seeds' 4K context


def test_gpt_oss_120b_on_two_nodes_cluster():
    b = budget.nominal(gpt_oss("cluster"), 2)
    # 65 GB of weights over 2 nodes; KV per token and node: 2 x 18 full-attention layers x 8/2 KV heads x 64 x
    # 1 byte (fp8) = 9216 B; x 4096 tokens = 36 MiB a sequence; x 256 (vLLM's default max_num_seqs) = 9 GiB.
    assert b.weights == 32_500_000_000
    assert b.kv_per_token == 9216 and b.kv_per_seq == 9216 * 4096 and b.kv_full == 9 * GIB
    assert b.max_num_seqs == 256 and b.util == 0.70
    assert b.reserve == int(0.70 * SPARK)  # 83.8 GiB
    assert b.need == int(0.70 * SPARK) + 8 * GIB  # + the OS reserve: 91.8 GiB
    assert b.starts and b.fits and not b.estimated and b.suggestion == ""


def test_gpt_oss_120b_solo_and_a_node_short_of_memory():
    r = gpt_oss("solo")
    b = budget.nominal(r, 1)
    assert b.weights == 65_000_000_000 and b.kv_per_token == 2 * 18 * 8 * 64  # every KV head on one node
    assert b.fits
    # A live node with 60 GiB free: vLLM would reserve 83.8 GiB, so it does not fit; the largest utilization
    # that leaves the OS reserve: floor((60 - 8) / 119.7, 2) = 0.43, and 0.43 x 119.7 = 51.5 GiB still holds
    # 30.3 GiB of weights (cluster share) + the 4 GiB peak + one sequence.
    short = budget.estimate(gpt_oss("cluster"), 2, "spark2", SPARK, 60 * GIB, "test")
    assert short.node_fits is False and not short.fits and short.starts
    assert short.suggestion.startswith("lower vllm.gpu_memory_utilization to 0.43")
    # solo: 0.43 x 119.7 = 51.5 GiB cannot hold 60.5 GiB of weights: no utilization helps
    solo_short = budget.estimate(r, 1, "spark1", SPARK, 60 * GIB, "test")
    assert not solo_short.fits and "cluster" in solo_short.suggestion


def test_engine_that_cannot_start_inside_its_reservation():
    r = resolve("qwen3-coder-30b-int4", "solo", None, ("vllm.gpu_memory_utilization=0.2",), None).recipe
    b = budget.nominal(r, 1)
    # 17 GB weights + 4 GiB peak + 65536 tokens x 2 x 48 x 4 x 128 x 2 B (6 GiB) = 25.8 GiB > 0.2 x 119.7 = 23.9
    assert b.kv_per_seq == 6 * GIB
    assert not b.starts and not b.fits
    assert b.suggestion == "raise vllm.gpu_memory_utilization to 0.22"


def test_recipe_without_architecture_is_an_estimate():
    r = resolve("glm-4.7-flash-int4", "solo", None, (), None).recipe
    assert r.architecture is None
    b = budget.nominal(r, 1)
    assert b.estimated and b.kv_per_token is None and b.kv_full is None
    assert any("ESTIMATE" in n and "architecture" in n for n in b.notes)
    assert b.as_dict()["estimated"] is True


def test_fit_without_inventory_per_topology():
    cluster = fit("openai-gpt-oss-120b", "cluster")
    assert [b.node for b in cluster.budgets] == ["spark1", "spark2"] and cluster.fits and not cluster.live
    assert {b.engine_size for b in cluster.budgets} == {2}
    assert [b.engine_size for b in fit("openai-gpt-oss-120b", "2xsolo").budgets] == [1, 1]
    assert len(fit("openai-gpt-oss-120b", "solo").budgets) == 1
    assert not fit("qwen3-coder-30b-int4", "solo", ("vllm.gpu_memory_utilization=0.2",)).fits


def test_fit_cli_bad_input_is_one_line_exit_2(cli):
    code, out, err = cli("recipes", "fit", "no-such-recipe")
    assert code == 2 and "no such recipe" in (out + err) and "Traceback" not in (out + err)
    code, _, err = cli("recipes", "fit", "openai-gpt-oss-120b", "-t", "bogus")
    assert code == 2
    code, out, _ = cli("recipes", "fit", "glm-4.7-flash-int4", "-t", "solo")
    assert code == 0 and "ESTIMATE" in out


@pytest.mark.parametrize(
    "topology,nodes,sets,why",
    [
        ("cluster", 1, (), "--nodes 1: the cluster topology needs at least 2 nodes"),
        ("2xsolo", 1, (), "--nodes 1: the 2xsolo topology needs at least 2 nodes"),
        ("cluster", None, ("tensor_parallel=64",), "TP=64 does not split 2 nodes into whole groups"),
        ("cluster", 4, ("tensor_parallel=3",), "TP=3 does not split 4 nodes into whole groups"),
        ("cluster", 3, (), "openai/gpt-oss-120b cannot run TP=3 x PP=1: TP=3 does not divide its 64 attention heads"),
    ],
)
def test_fit_refuses_what_up_refuses(cli, topology, nodes, sets, why):
    """Issue 35 item 5: `recipes fit -t cluster --nodes 1` said it fits, and tensor_parallel=64 on two nodes was
    ignored; `fit` now renders the deployment with `up`'s own code on that many nodes."""
    with pytest.raises(ConfigError) as exc:
        fit("openai-gpt-oss-120b", topology, tuple(f for f in sets), nodes=nodes)
    assert why in str(exc.value), str(exc.value)
    args = ["recipes", "fit", "openai-gpt-oss-120b", "-t", topology]
    args += [a for s in sets for a in ("--set", s)] + (["--nodes", str(nodes)] if nodes else [])
    code, out, err = cli(*args)
    assert code == 2 and why in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (out, err)
    # `up`'s judge on an inventory of that many nodes refuses the same
    inv = Inventory.model_validate(synthetic_inventory(nodes or 2))
    with pytest.raises(ConfigError, match=re.escape(why.split(": ", 1)[-1])):
        build_deployment(inv, resolve("openai-gpt-oss-120b", topology, None, sets), Secrets())


# -- one check model ---------------------------------------------------------------------------------------------


def test_preflight_checks_are_registry_entries():
    """Every preflight check IS a doctor registry entry (same object, same function): a check only preflight
    runs, or a formula of its own in preflight.py, fails this test."""
    assert PREFLIGHT and all(any(c is r for r in CHECKS) for c in PREFLIGHT)
    names = {c.preflight for c in PREFLIGHT}
    assert names == {"ssh", "docker", "state-dir", "names", "image", "ports", "memory", "disk"}
    by_name = {c.preflight: c for c in PREFLIGHT if c.preflight == "memory"}
    assert by_name["memory"].fn is gpu.memory
    # preflight.py defines no check of its own: only the runner and the context
    tree = ast.parse(inspect.getsource(preflight))
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert functions == {"_ssh_fix", "_call", "run", "failures"}
    # every row up shows comes from a registry entry
    dep = make_deployment("2xsolo")
    rows = preflight.run(dep, {n.name: empty_facts(n.name) for n in dep.inventory.nodes})
    assert rows and {r.check for r in rows} <= names


@pytest.mark.parametrize("free_gib,fails", [(60, True), (92, False)])
def test_preflight_and_doctor_memory_are_one_formula(free_gib, fails):
    """The memory check gives the same verdict whoever runs it: it is budget.for_node's `need`."""
    dep = make_deployment("cluster")
    facts: dict[str, NodeFacts | Exception] = {n.name: empty_facts(n.name) for n in dep.inventory.nodes}
    facts["spark2"].mem_available_mb = free_gib * 1024  # type: ignore[union-attr]
    failed = [(r.node, r.check) for r in preflight.run(dep, facts) if not r.ok]
    assert (("spark2", "memory") in failed) is fails
    b = budget.for_node(dep.recipe.recipe, dep.engine_size("spark2"), facts["spark2"])  # type: ignore[arg-type]
    assert b is not None and (not b.fits) is fails
