"""What sparkdeploy renders for eugr's published recipes is argv the image's vLLM accepts (issue 36, item 6).

Each fixture (tests/fixtures/eugr, with its source commit) that maps onto a sparkdeploy recipe, with the --set values
that replace what has no equivalent, is rendered for as many nodes as eugr wrote it for; every `vllm serve` line of
every node goes through
- the check `up` makes (images/vllm_cli.check_args, inside build_deployment): every flag and value of the image;
- the simulator's parser (vllm_sim/flags.py: FlexibleArgumentParser's rewriting over vLLM 0.32.0's flag dump),
  which the lab's engines run;
- vLLM 0.32.0's own parser where its CPU venv exists (scripts/dump_vllm_args.py --parse): the dict options' JSON
  validated into its config classes (a `{"pass_config.fuse_allreduce_rms": "true"}` is refused there), the parser
  names checked against its registries.
"""

from __future__ import annotations

import json
import shlex
import sys

import pytest

from sparkdeploy.config.inventory import Inventory
from sparkdeploy.config.secrets import Secrets
from sparkdeploy.images.definitions import load_definition
from sparkdeploy.recipes.recipe import resolve
from sparkdeploy.topologies import build_deployment
from sparkdeploy.topologies.lint import synthetic_inventory
from tests.conftest import REPO
from tests.support.vllm_venv import run_with_vllm

FIXTURES = REPO / "tests" / "fixtures" / "eugr"
for _p in (str(REPO / "images" / "vllm-sim"), str(REPO / "images" / "launcher")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

# fixture: (the --set values that replace what has no sparkdeploy equivalent, nodes eugr wrote it for, topology, TP)
RUNNABLE = {
    "openai-gpt-oss-120b.yaml": ([], 1, "solo", None),
    "minimax-m2-awq.yaml": (["container=vllm-node"], 2, "cluster", 2),
    "glm-4.7-flash-awq.yaml": (["container=vllm-node", "build_args=[]", "mods=[]"], 1, "solo", None),
    "gemma4-26b-a4b-nvfp4-solo.yaml": (["container=vllm-node", "mods=[]"], 1, "solo", None),
    "3x-spark-cluster/mimo-v2.6-flash-pp3.yaml": (["mods=[]"], 3, "cluster", 1),
    "8x-spark-cluster/glm-5-fp8.yaml": (["build_args=[]", "container=vllm-node"], 8, "cluster", 8),
    "kimi-k2.5-nvfp4.yaml": (["container=vllm-node"], 4, "cluster", 4),
    "kimi-k2.6-native-int4.yaml": (["container=vllm-node", "mods=[]"], 8, "cluster", 8),
}


def inventory(nodes: int) -> Inventory:
    return Inventory.model_validate(synthetic_inventory(nodes, "eugr"))


def rendered(fixture: str) -> tuple[object, dict[str, list[str]]]:
    """The deployment of a fixture on its nodes, and every `vllm serve` argv it renders (node/file -> argv)."""
    sets, nodes, topology, _tp = RUNNABLE[fixture]
    resolved = resolve(str(FIXTURES / fixture), topology, None, sets)
    dep = build_deployment(inventory(nodes), resolved, Secrets({}, source="test"))
    lines = {
        f"{fixture}:{nd.node.name}/{f.name}": shlex.split(line)[3:]
        for nd in dep.nodes
        for f in nd.files
        for line in f.content.splitlines()
        if line.startswith("exec vllm serve ")
    }
    assert lines, fixture
    return dep, lines


def without_extra_flags(argv: list[str], image: str) -> list[str]:
    """The argv without the flags only the image's patches add (vLLM 0.32.0 itself has no --mxfp4-layers)."""
    extra = set(load_definition(image).extra_flags)
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
            continue
        if word.split("=", 1)[0] in extra:
            skip = "=" not in word
            continue
        out.append(word)
    return out


@pytest.mark.parametrize("fixture", sorted(RUNNABLE))
def test_rendered_argv_is_accepted_by_the_image_check_and_the_simulator(fixture):
    from vllm_sim.flags import parse_serve_args

    dep, lines = rendered(fixture)  # build_deployment ran images/vllm_cli.check_args on each line
    _sets, nodes, topology, tp = RUNNABLE[fixture]
    assert dep.recipe.topology == topology and dep.recipe.recipe.tensor_parallel == tp
    for name, argv in lines.items():
        ns = parse_serve_args(argv)  # exits 2 with vLLM's message on anything vLLM's parser would reject
        assert ns.model_tag == dep.recipe.recipe.model, name
        if topology == "cluster":
            tp_, pp_ = (int(getattr(ns, d, 1)) for d in ("tensor_parallel_size", "pipeline_parallel_size"))
            assert tp_ * pp_ == nodes, name


@pytest.mark.parametrize("fixture", ["kimi-k2.5-nvfp4.yaml", "kimi-k2.6-native-int4.yaml"])
def test_underscore_dotted_config_renders_as_nested_typed_json(fixture):
    """eugr writes `--compilation_config.pass_config.fuse_allreduce_rms true` (vLLM reads `--a_b` as `--a-b`):
    one --compilation-config whose JSON nests pass_config and holds a boolean, not the string "true"."""
    dep, lines = rendered(fixture)
    assert dep.recipe.recipe.vllm.compilation.extra == {"pass_config": {"fuse_allreduce_rms": True}}
    for argv in lines.values():
        assert not any("." in w and w.startswith("--compilation") for w in argv), argv
        assert json.loads(argv[argv.index("--compilation-config") + 1])["pass_config"] == {"fuse_allreduce_rms": True}


def test_dash_dotted_config_renders_as_nested_json():
    _dep, lines = rendered("8x-spark-cluster/glm-5-fp8.yaml")
    for argv in lines.values():
        config = json.loads(argv[argv.index("--compilation-config") + 1])
        assert config["cudagraph_mode"] == "NONE", config


def test_rendered_argv_parses_with_vllm_0_32_0(tmp_path):
    """Every rendered line through vLLM 0.32.0's own parser (needs its CPU venv: tests/support/vllm_venv.py)."""
    argvs = {}
    for fixture in sorted(RUNNABLE):
        dep, lines = rendered(fixture)
        if dep.image.vllm_version != "0.32.0":  # the MXFP4 fork: its own CLI dump is what check_args used
            continue
        for name, argv in lines.items():
            argvs[name] = without_extra_flags(argv, dep.recipe.recipe.image)
    assert len(argvs) >= 7
    argvs["refused: dotted key as one string"] = ["m", "--compilation-config", '{"pass_config.x": "true"}']
    path = tmp_path / "argv.json"
    path.write_text(json.dumps(argvs))
    run = run_with_vllm([str(REPO / "scripts" / "dump_vllm_args.py"), "--parse", str(path)])
    results = [line for line in run.stdout.splitlines() if line.startswith(("ok ", "FAIL "))]
    assert len(results) == len(argvs), run.stdout + run.stderr
    failed = [line for line in results if line.startswith("FAIL")]
    assert failed == [next(x for x in results if "refused: dotted key" in x)], run.stdout
    assert "CompilationConfig" in failed[0]
