"""eugr/spark-vllm-docker v1 recipes read as they are (issue 27, item 1 and item 6's recipe inputs).

The fixtures are eugr's published recipes (tests/fixtures/eugr/README.md names each file's commit). Each is
resolved exactly as `run-recipe FILE` resolves it; what has no sparkdeploy equivalent is refused, one line each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkdeploy import eugr
from sparkdeploy.errors import ConfigError
from sparkdeploy.recipes import resolve
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "eugr"
GPT_OSS = str(FIXTURES / "openai-gpt-oss-120b.yaml")
MINIMAX = str(FIXTURES / "minimax-m2-awq.yaml")
GLM_FLASH = str(FIXTURES / "glm-4.7-flash-awq.yaml")
GEMMA = str(FIXTURES / "gemma4-26b-a4b-nvfp4-solo.yaml")
MIMO_PP3 = str(FIXTURES / "3x-spark-cluster" / "mimo-v2.6-flash-pp3.yaml")
QWEN_4X = str(FIXTURES / "4x-spark-cluster" / "qwen3.5-397b-int4-autoround.yaml")
GLM5_8X = str(FIXTURES / "8x-spark-cluster" / "glm-5-fp8.yaml")


def problems(exc: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    return [str(p) for p in exc.value.problems]


def test_every_fixture_is_listed_in_its_readme_with_a_commit():
    readme = (FIXTURES / "README.md").read_text()
    files = sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*.yaml"))
    assert len(files) == 7
    for f in files:
        row = next(line for line in readme.splitlines() if line.startswith(f"| {f} |"))
        assert len(row.split("|")[3].strip()) == 40, row


def test_solo_only_recipe_maps_onto_a_recipe():
    r = resolve(GPT_OSS)
    rec = r.recipe
    assert (rec.name, rec.model, rec.image) == ("openai-gpt-oss-120b", "openai/gpt-oss-120b", "vllm-node-mxfp4")
    assert (rec.topologies, r.topology, rec.fits_one_node) == (["solo", "2xsolo"], "solo", True)
    v = rec.vllm
    assert (v.gpu_memory_utilization, v.kv_cache_dtype, v.max_num_batched_tokens) == (0.70, "fp8", 8192)
    assert (v.quantization, v.load_format) == ("mxfp4", "fastsafetensors")
    assert v.extra_args[:5] == [
        "--tool-call-parser",
        "openai",
        "--reasoning-parser",
        "openai_gptoss",
        "--enable-auto-tool-choice",
    ]
    assert "--host" not in v.extra_args and "--port" not in v.extra_args
    assert rec.env == {"VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": "1"}
    assert any("--port 8000" in w for w in r.warnings) and any("--exp-mxfp4" in w for w in r.warnings)
    with pytest.raises(ConfigError) as exc:
        resolve(GPT_OSS, "cluster")
    assert "does not support cluster" in problems(exc)[0]


def test_placeholders_take_defaults_then_set():
    assert resolve(GPT_OSS).recipe.vllm.gpu_memory_utilization == 0.70
    r = resolve(GPT_OSS, sets=["gpu_memory_utilization=0.6", "max_num_batched_tokens=4096", "vllm.max_model_len=65536"])
    assert (r.recipe.vllm.gpu_memory_utilization, r.recipe.vllm.max_num_batched_tokens) == (0.6, 4096)
    assert r.recipe.vllm.max_model_len == 65536  # a dotted --set is a recipe key, as for any recipe


def test_cluster_only_recipe_with_its_container_replaced():
    with pytest.raises(ConfigError) as exc:
        resolve(MINIMAX)
    assert problems(exc) == [
        (
            f"{MINIMAX}: container: 'vllm-thor' is not an image sparkdeploy knows (eugr's tags it maps: vllm-node, "
            "vllm-node-mxfp4) (fix: pass --set container=IMAGE with a sparkdeploy image definition (sparkdeploy "
            "images list))"
        )
    ]
    r = resolve(MINIMAX, sets=["container=vllm-node"])
    rec = r.recipe
    assert (rec.topologies, rec.fits_one_node, rec.tensor_parallel, rec.cluster_backend) == (
        ["cluster"],
        False,
        2,
        "ray",
    )
    assert (rec.vllm.max_model_len, rec.vllm.load_format, rec.image) == (128000, "fastsafetensors", "vllm-node")
    assert "--distributed-executor-backend" not in rec.vllm.extra_args
    assert resolve(MINIMAX, sets=["container=vllm-node", "tensor_parallel=1"]).recipe.tensor_parallel is None


def test_pipeline_parallel_over_three_nodes():
    r = resolve(MIMO_PP3, sets=["mods=[]"])
    rec = r.recipe
    assert (rec.topologies, rec.tensor_parallel, rec.fits_one_node) == (["cluster"], 1, False)
    assert (rec.vllm.max_model_len, rec.vllm.trust_remote_code) == (1048576, True)
    assert rec.vllm.extra_args[rec.vllm.extra_args.index("--override-generation-config") + 1] == '{"top_p":0.95}'
    assert any("pipeline_parallel 3" in w for w in r.warnings)


def test_four_node_recipe_refuses_each_mod_build_arg_and_container_by_name():
    with pytest.raises(ConfigError) as exc:
        resolve(QWEN_4X)
    lines = problems(exc)
    assert len(lines) == 6, lines
    for name in (
        "--tf5",
        "'vllm-node-tf5'",
        "mods/fix-qwen3-coder-next",
        "mods/fix-qwen35-tp4-marlin",
        "mods/install-conch",
        "mods/gpu-mem-util-gb",
    ):
        assert sum(name in line for line in lines) == 1, (name, lines)
    # Without them the recipe maps, TP=4; the flag only eugr's mod adds stays in extra_args for the lint to refuse.
    r = resolve(QWEN_4X, sets=["mods=[]", "build_args=[]", "container=vllm-node"])
    assert r.recipe.tensor_parallel == 4 and r.recipe.vllm.compilation.cudagraph_mode == "PIECEWISE"
    assert "--gpu-memory-utilization-gb" in r.recipe.vllm.extra_args


def test_container_may_name_any_sparkdeploy_image():
    r = resolve(MINIMAX, sets=["container=vllm-sim"])  # not one of eugr's tags: a definition of ours
    assert r.recipe.image == "vllm-sim"
    with pytest.raises(ConfigError) as exc:
        resolve(MINIMAX, sets=["container=no-such-image"])
    assert "container: 'no-such-image' is not an image sparkdeploy knows" in problems(exc)[0]


def test_eight_node_recipe():
    r = resolve(GLM5_8X, sets=["build_args=[]", "container=vllm-node"])
    rec = r.recipe
    assert (rec.tensor_parallel, rec.cluster_backend, rec.vllm.compilation.cudagraph_mode) == (8, "ray", "NONE")
    assert rec.env["OMP_NUM_THREADS"] == "4"


def test_fixture_with_a_mod_and_a_registry_container_is_refused():
    with pytest.raises(ConfigError) as exc:
        resolve(GEMMA)
    assert [line.split(": ")[1] for line in problems(exc)] == ["container", "mods"]
    with pytest.raises(ConfigError) as exc:
        resolve(GLM_FLASH)
    assert any("mods/fix-glm-4.7-flash-AWQ has no sparkdeploy equivalent" in line for line in problems(exc))


# -- bad input through the CLI: one line per problem, exit 2, nothing written -----------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "in" / "bad.yaml"
    path.parent.mkdir()
    path.write_text(text)
    return path


BASE = """recipe_version: "1"
name: Bad
container: vllm-node
defaults: {port: 8000}
"""


@pytest.mark.parametrize(
    "body,expect",
    [
        (
            'mods: [mods/does-not-exist]\ncommand: "vllm serve org/m --port {port}"\n',
            "bad.yaml: mods: mods/does-not-exist has no sparkdeploy equivalent",
        ),
        ('command: "python3 -m vllm.entrypoints.openai.api_server --port {port}"\n', "is not a `vllm serve` command"),
        ('command: "vllm serve org/m --port {port} && rm -rf /"\n', "is more than one `vllm serve` call"),
        ('command: "vllm serve org/m --port {port} --max-model-len {ctx}"\n', "placeholder {ctx} has no value"),
        ('command: "vllm serve org/m"\nsurprise: 1\n', "surprise: unknown key"),
    ],
    ids=["unknown-mod", "not-vllm-serve", "two-commands", "placeholder-without-value", "unknown-field"],
)
def test_bad_eugr_recipe_one_line_exit_2_nothing_written(cli, tmp_path, body, expect):
    path = write(tmp_path, BASE + body)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    for args in (["recipes", "import", str(path), "--out", str(out_dir)], ["run-recipe", str(path), "--dry-run"]):
        code, out, err = cli(*args)
        assert code == 2, (args, out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and expect in lines[0], lines
        assert "Traceback" not in err
    assert list(out_dir.iterdir()) == []


def test_import_writes_a_recipe_that_runs_and_lists_what_did_not_carry(cli, tmp_path, inventory_file):
    code, out, err = cli("recipes", "import", GPT_OSS, "--out", str(tmp_path), "--json")
    assert code == 0, err
    result = json.loads(out)
    written = tmp_path / "openai-gpt-oss-120b.yaml"
    assert result["file"] == str(written) and result["written"]
    assert any("--port 8000" in n for n in result["not_carried"])
    text = written.read_text()
    assert text.startswith(
        "# Imported by `sparkdeploy recipes import` from the eugr v1 recipe openai-gpt-oss-120b.yaml"
    )
    assert resolve(str(written)).recipe == resolve(GPT_OSS).recipe  # the written file is the recipe run-recipe runs
    code, _, err = cli("recipes", "import", GPT_OSS, "--out", str(tmp_path))
    assert code == 2 and "exists already" in err
    code, out, err = cli("recipes", "import", GPT_OSS, "--out", str(tmp_path / "nowhere"), "--dry-run")
    assert code == 0 and out.startswith("# Imported") and not (tmp_path / "nowhere").exists()


def test_import_lints_extra_flags_against_the_image_cli(cli, tmp_path):
    code, _, err = cli(
        "recipes",
        "import",
        QWEN_4X,
        "--set",
        "mods=[]",
        "--set",
        "build_args=[]",
        "--set",
        "container=vllm-node",
        "--out",
        str(tmp_path),
    )
    assert code == 2 and "--gpu-memory-utilization-gb is not a flag of image vllm-node" in err, err
    assert list(tmp_path.iterdir()) == []


def test_run_recipe_and_up_accept_an_eugr_file(cli, inventory_file):
    code, out, err = cli("run-recipe", GPT_OSS, "--dry-run", "-i", str(inventory_file))
    assert code == 0, err
    assert "--tool-call-parser openai" in out and "--enable-auto-tool-choice" in out
    assert (
        "eugr recipe 'OpenAI GPT-OSS 120B': --port 8000: sparkdeploy serves on the inventory's vllm_port" in out + err
    )
    code, out2, err = cli(
        "run-recipe", GPT_OSS, "--dry-run", "-i", str(inventory_file), "--set", "max_num_batched_tokens=2048"
    )
    assert code == 0, err
    assert "--max-num-batched-tokens 2048" in out2
    # up reads the nodes first (none here): the recipe is taken, the run stops at the nodes, not at the file.
    code, _, err = cli("up", "-r", GPT_OSS, "--dry-run", "-i", str(inventory_file))
    assert code == 1 and "preflight failed" in err and "OpenAI GPT-OSS 120B" in err, err


def test_not_an_eugr_recipe_is_not_imported(cli, tmp_path):
    code, _, err = cli("recipes", "import", str(REPO / "recipes" / "glm-4.7-flash-int4.yaml"), "--out", str(tmp_path))
    assert code == 2 and "not an eugr v1 recipe" in err


def test_is_eugr_only_by_recipe_version():
    assert eugr.is_eugr({"recipe_version": "1"}) and not eugr.is_eugr({"name": "x"})
    with pytest.raises(ConfigError) as exc:
        eugr.parse({"recipe_version": 2, "name": "x", "container": "c", "command": "vllm serve m"}, "f.yaml")
    assert "version '2'" in problems(exc)[0]
