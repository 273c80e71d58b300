"""eugr/spark-vllm-docker v1 recipes read as they are (issue 27, item 1 and item 6's recipe inputs).

The fixtures are eugr's published recipes (tests/fixtures/eugr/README.md names each file's commit). Each is
resolved exactly as `run-recipe FILE` resolves it; what has no sparkdeploy equivalent is refused, one line each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkdeploy.errors import ConfigError
from sparkdeploy.recipes import eugr
from sparkdeploy.recipes.recipe import resolve
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "eugr"
GPT_OSS = str(FIXTURES / "openai-gpt-oss-120b.yaml")
MINIMAX = str(FIXTURES / "minimax-m2-awq.yaml")
GLM_FLASH = str(FIXTURES / "glm-4.7-flash-awq.yaml")
GEMMA = str(FIXTURES / "gemma4-26b-a4b-nvfp4-solo.yaml")
MIMO_PP3 = str(FIXTURES / "3x-spark-cluster" / "mimo-v2.6-flash-pp3.yaml")
QWEN_4X = str(FIXTURES / "4x-spark-cluster" / "qwen3.5-397b-int4-autoround.yaml")
GLM5_8X = str(FIXTURES / "8x-spark-cluster" / "glm-5-fp8.yaml")
KIMI_25 = str(FIXTURES / "kimi-k2.5-nvfp4.yaml")
KIMI_26 = str(FIXTURES / "kimi-k2.6-native-int4.yaml")
QWEN_PP3 = str(FIXTURES / "3x-spark-cluster" / "qwen3.5-397b-int4-autoround.yaml")
DSV41_3X = str(FIXTURES / "3x-spark-cluster" / "deepseek-v4.1-flash.yaml")
NEMOTRON = str(FIXTURES / "nemotron-3-nano-nvfp4.yaml")


def problems(exc: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    return [str(p) for p in exc.value.problems]


def test_every_fixture_is_listed_in_its_readme_with_a_commit():
    readme = (FIXTURES / "README.md").read_text()
    files = sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*.yaml"))
    assert len(files) == 12
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
    assert len(lines) == 7, lines
    for name in (
        "--tf5",
        "'vllm-node-tf5'",
        "mods: mods/fix-qwen3-coder-next",
        "mods: mods/fix-qwen35-tp4-marlin",
        "mods: mods/install-conch",
        "mods: mods/gpu-mem-util-gb",
    ):
        assert sum(name in line for line in lines) == 1, (name, lines)
    # The flag only eugr's mod adds is refused in the same pass, naming the mods that could have added it; it
    # stays refused without them (the command still says it).
    assert "--gpu-memory-utilization-gb is not a flag of image vllm-node (vLLM 0.32.0): only one of " in lines[-1]
    with pytest.raises(ConfigError) as exc:
        resolve(QWEN_4X, sets=["mods=[]", "build_args=[]", "container=vllm-node"])
    (line,) = problems(exc)
    assert "--gpu-memory-utilization-gb" in line and "mods/gpu-mem-util-gb" in line, line


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


def test_run_recipe_and_up_accept_an_eugr_file(cli, refusing_inventory):
    inventory_file = refusing_inventory  # up reads the nodes (down here); run-recipe --dry-run does not
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


# -- issue 36 item 6 and issue 35 item 5: eugr's own semantics, every problem at once, the numbers -------------


def eugr_file(tmp_path: Path, body: str, name: str = "r.yaml") -> str:
    path = tmp_path / name
    path.write_text('recipe_version: "1"\nname: R\ncontainer: vllm-node\n' + body)
    return str(path)


def test_dotted_options_become_nested_typed_json_in_either_spelling(tmp_path):
    """vLLM reads `--x.a.b V` as `--x '{"a": {"b": V}}'` with V as JSON (true, 4, 0.5, a string otherwise),
    `--x.a+ A,B` as a list, and `--a_b` as `--a-b`: the rendered argv says the same in one JSON value."""
    f = eugr_file(
        tmp_path,
        "command: >-\n  vllm serve org/m --compilation-config.pass_config.fuse_allreduce_rms true"
        " --compilation_config.cudagraph_capture_sizes+ 1,2 -cc.max_cudagraph_capture_size=64"
        " --compilation-config.cudagraph_mode piecewise --speculative_config.method ngram"
        " --speculative-config.num_speculative_tokens 4 --speculative-config.prompt_lookup_max 0.5"
        " --max_num_seqs 8 -O3\n",
    )
    r = resolve(f).recipe
    assert r.vllm.compilation.cudagraph_mode == "PIECEWISE"
    assert r.vllm.compilation.extra == {
        "pass_config": {"fuse_allreduce_rms": True},
        "cudagraph_capture_sizes": ["1", "2"],
        "max_cudagraph_capture_size": 64,
    }
    args = r.vllm.extra_args
    assert args[args.index("--speculative-config") + 1] == json.dumps(
        {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 0.5}, separators=(",", ":")
    )
    assert r.vllm.max_num_seqs == 8 and args[args.index("--optimization-level") + 1] == "3"
    assert not any("." in a and a.startswith("-") for a in args), args


def test_every_problem_of_a_recipe_in_one_pass_and_what_a_dropped_mod_provides(tmp_path):
    """eugr's nemotron-3-nano recipe: an unknown key (`benchmark`), a mod, and a reasoning parser that exists only
    through the plugin file the mod downloads: all three at once, the file and the parser naming the mod."""
    with pytest.raises(ConfigError) as exc:
        resolve(NEMOTRON)
    lines = [line.removeprefix(f"{NEMOTRON}: ") for line in problems(exc)]
    assert len(lines) == 4, lines
    assert lines[0].startswith("benchmark: unknown key") and "--set benchmark=null" in lines[0]
    assert "sparkdeploy bench sweep" in lines[0]  # what does its job here
    assert lines[1].startswith("mods: mods/nemotron-nano has no sparkdeploy equivalent")
    assert "--reasoning-parser-plugin nano_v3_reasoning_parser.py" in lines[2] and "mods/nemotron-nano" in lines[2]
    assert "--reasoning-parser nano_v3: not a parser of image vllm-node (vLLM 0.32.0)" in lines[3]
    assert "nemotron_v3" in lines[3]  # the image's own parser of that family, proposed
    # --set removes the unknown key and the mod: what only the mod provided is still refused, naming it as dropped
    with pytest.raises(ConfigError) as exc:
        resolve(NEMOTRON, sets=["benchmark=null", "mods=[]"])
    lines = problems(exc)
    assert len(lines) == 2 and all("mods/nemotron-nano" in line or "plugin" in line for line in lines), lines
    assert not any("benchmark" in line for line in lines)


def test_a_file_only_a_mod_provides_is_named_with_the_mod_pp_over_three_nodes():
    with pytest.raises(ConfigError) as exc:
        resolve(QWEN_PP3, sets=["container=vllm-node", "build_args=[]", "mods=[]"])
    (line,) = problems(exc)
    assert "--chat-template unsloth.jinja: a file in eugr's container workspace" in line
    assert "mods/fix-qwen3.5-chat-template" in line
    with pytest.raises(ConfigError) as exc:
        resolve(QWEN_PP3)
    lines = problems(exc)
    assert [line.split(": ")[1] for line in lines] == ["build_args", "build_args", "container", "mods", "command"]


def test_build_arg_values_are_reported_with_their_flag(tmp_path):
    f = eugr_file(tmp_path, "build_args: [-f, Dockerfile.b12x, --exp-b12x]\ncommand: vllm serve org/m\n")
    with pytest.raises(ConfigError) as exc:
        resolve(f)
    lines = problems(exc)
    assert len(lines) == 2, lines
    assert "build_args: -f Dockerfile.b12x has no sparkdeploy equivalent" in lines[0]
    assert "build_args: --exp-b12x has no sparkdeploy equivalent" in lines[1]


def test_tp3_speculative_json_and_auto_context(tmp_path):
    """eugr's DeepSeek V4.1 Flash on three Sparks: TP=3, `--max-model-len auto` (vLLM's default), a speculative
    config written as JSON with placeholders inside; its b12x load format is its own build's."""
    with pytest.raises(ConfigError) as exc:
        resolve(DSV41_3X, sets=["container=vllm-node", "build_args=[]"])
    (line,) = problems(exc)
    assert "--load-format 'b12x' is not one of the choices of image vllm-node" in line
    r = resolve(DSV41_3X, sets=["container=vllm-node", "build_args=[]", "vllm.load_format=auto"])
    assert (r.recipe.tensor_parallel, r.recipe.vllm.max_model_len) == (3, None)
    spec = json.loads(r.recipe.vllm.extra_args[r.recipe.vllm.extra_args.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens"] == 7 and spec["draft_tensor_parallel_size"] == 3
    assert any("--max-model-len auto: vLLM's default" in w for w in r.warnings)


def test_solo_only_takes_tp_1_as_eugr_does_in_solo_unless_asked(tmp_path):
    """eugr's run-recipe.py: `if is_solo and "tensor_parallel" not in overrides: overrides["tensor_parallel"] = 1`."""
    f = eugr_file(
        tmp_path,
        "solo_only: true\ndefaults: {tensor_parallel: 2}\ncommand: vllm serve org/m -tp {tensor_parallel}\n",
    )
    r = resolve(f)
    assert r.topology == "solo" and r.recipe.tensor_parallel is None
    assert any("tensor_parallel 2: solo_only, so 1" in w for w in r.warnings), r.warnings
    with pytest.raises(ConfigError) as exc:
        resolve(f, sets=["tensor_parallel=2"])
    assert "solo_only, but the command asks for TP=2" in problems(exc)[0]


def test_an_unknown_key_can_be_removed_with_set_null(tmp_path):
    f = eugr_file(tmp_path, "pull_image: true\ncommand: vllm serve org/m\n")
    with pytest.raises(ConfigError) as exc:
        resolve(f)
    (line,) = problems(exc)
    assert "pull_image: unknown key" in line and "--set pull_image=null" in line
    assert resolve(f, sets=["pull_image=null"]).recipe.model == "org/m"


@pytest.mark.parametrize(
    "command,flag",
    [
        ("-tp abc", "-tp 'abc'"),
        ("-tp nan", "-tp 'nan'"),
        ("-tp 0", "-tp '0'"),
        ("-tp -2 -pp -2", "-tp '-2'"),
        ("-pp -2", "-pp '-2'"),
        ("--tensor-parallel-size 2.5", "--tensor-parallel-size '2.5'"),
        ("--pipeline-parallel-size=inf", "--pipeline-parallel-size=inf 'inf'"),
        ("-tp", "-tp no value"),
    ],
)
def test_tp_and_pp_must_be_positive_whole_numbers_naming_the_flag(cli, tmp_path, command, flag):
    f = eugr_file(tmp_path, f"command: vllm serve org/m {command}\n")
    code, out, err = cli("run-recipe", f, "--dry-run")
    assert code == 2 and "Traceback" not in err, (out, err)
    assert f"{flag}: not a positive whole number" in err, err


def test_an_empty_served_name_is_refused(cli, tmp_path):
    f = eugr_file(tmp_path, "command: vllm serve org/m --served-model-name ''\n")
    code, _, err = cli("run-recipe", f, "--dry-run")
    assert code == 2 and "--served-model-name: an empty served name" in err and "Traceback" not in err


def test_import_header_keeps_the_whole_serve_line(cli, tmp_path):
    """The header once cut the serve line at 400 characters without a word; it now wraps it, every word kept."""
    code, out, err = cli("recipes", "import", KIMI_26, "--set", "container=vllm-node", "--set", "mods=[]", "--dry-run")
    assert code == 0, err
    head = out.split("\nname:", 1)[0]
    assert all(line.startswith("#") for line in head.splitlines()), head
    words = " ".join(line.lstrip("# ").removesuffix("\\") for line in head.splitlines())
    assert "--distributed-executor-backend ray" in words
    assert "--compilation_config.pass_config.fuse_allreduce_rms" in words
    assert len(" ".join(head.splitlines())) > 400


def test_a_long_description_is_cut_and_said_so(tmp_path):
    f = eugr_file(tmp_path, f"description: {'word ' * 140}end\ncommand: vllm serve org/m\n")
    r = resolve(f)
    assert len(r.recipe.description) == 500
    assert any("description: 703 characters on one line, cut to the recipe's 500" in w for w in r.warnings), r.warnings
