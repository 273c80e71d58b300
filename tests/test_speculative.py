"""A recipe's `speculative:` (issue 39): rendered as vLLM's --speculative-config JSON, checked against what the
pinned vLLM 0.32.0 accepts (images/vllm-node/vllm-speculative-0.32.0.json, dumped from its sources by
scripts/dump_vllm_speculative.py), refused in one line where the engine, the model or the topology cannot."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from sparkdeploy.errors import ConfigError
from sparkdeploy.images.definitions import load_definition
from sparkdeploy.images.vllm_cli import check_args
from sparkdeploy.recipes import recipe as recipes
from sparkdeploy.recipes import speculative
from sparkdeploy.recipes.vllm_args import Distributed, serve_args
from tests.conftest import REPO
from tests.support.vllm_venv import need_vllm_python

for _p in (str(REPO / "images" / "vllm-sim"), str(REPO / "images" / "launcher")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

SPECULATIVE = {
    "openai-gpt-oss-120b-eagle3": "eagle3",
    "gemma-4-26b-a4b-mtp": "mtp",
    "qwen3-coder-30b-ngram": "ngram",
}


def argv(name: str, sets: tuple[str, ...] = (), topology: str | None = None, tp: int = 1) -> list[str]:
    resolved = recipes.resolve(name, topology, sets=sets)
    return serve_args(resolved, load_definition(resolved.recipe.image), 8000, Distributed(tensor_parallel=tp))


def spec_json(args: list[str]) -> dict:
    return json.loads(args[args.index("--speculative-config") + 1])


def refusal(name: str, *sets: str, topology: str | None = None, tp: int = 1) -> str:
    with pytest.raises(ConfigError) as exc:
        argv(name, sets, topology, tp)
    lines = [str(p) for p in exc.value.problems]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    return lines[0]


@pytest.mark.parametrize("name", sorted(SPECULATIVE))
def test_shipped_recipes_render_a_config_the_pinned_vllm_and_the_simulator_accept(name):
    from vllm_sim.flags import parse_serve_args

    args = argv(name)
    config = spec_json(args)
    record = speculative.engine_record("0.32.0")
    assert record is not None
    assert config["method"] == SPECULATIVE[name] and config["method"] in record["methods"]
    assert set(config) <= set(record["options"]), config
    assert args.count("--speculative-config") == 1
    check_args(args, load_definition("vllm-node"), name)
    ns = parse_serve_args(args)
    assert json.loads(json.dumps(ns.speculative_config)) == config or json.loads(ns.speculative_config) == config


def test_each_recipe_says_its_source():
    for name in SPECULATIVE:
        text = recipes.find_recipe(name).read_text()
        assert "Sources:" in text and ("github.com" in text or "docs.vllm.ai" in text), name


def test_eagle3_carries_draft_model_and_revision():
    config = spec_json(argv("openai-gpt-oss-120b-eagle3", ("speculative.revision=0123abc",)))
    assert config == {
        "method": "eagle3",
        "model": "nvidia/gpt-oss-120b-Eagle3-long-context",
        "revision": "0123abc",
        "num_speculative_tokens": 5,
    }


def test_no_speculative_renders_no_flag():
    assert "--speculative-config" not in argv("openai-gpt-oss-120b-eagle3", ("speculative=null",))
    assert "--speculative-config" not in argv("qwen3-coder-30b")


def test_unknown_method_is_refused_with_the_engines_methods():
    line = refusal("qwen3-coder-30b-ngram", "speculative.method=lookahead")
    assert "speculative.method" in line and "'lookahead' is not a speculative method of vLLM 0.32.0" in line
    assert "eagle3" in line and "ngram" in line


def test_unknown_option_is_refused():
    line = refusal("qwen3-coder-30b-ngram", "speculative.options.prompt_lookup=3")
    assert "speculative.options.prompt_lookup" in line and "SpeculativeConfig" in line
    line = refusal("qwen3-coder-30b-ngram", "speculative.options.tensor_parallel_size=1")
    assert "draft_tensor_parallel_size" in line


def test_a_draft_method_without_a_draft_and_ngram_with_one_are_refused():
    assert "drafts with a separate model" in refusal("openai-gpt-oss-120b-eagle3", "speculative.model=null")
    assert "no draft model" in refusal("qwen3-coder-30b-ngram", "speculative.model=org/draft")


def test_mtp_on_a_model_without_mtp_layers_is_refused():
    line = refusal("qwen3-coder-30b-ngram", "speculative.method=mtp")
    assert "mtp_layers" in line and "Qwen/Qwen3-Coder-30B-A3B-Instruct" in line
    config = spec_json(
        argv("qwen3-coder-30b-ngram", ("speculative.method=mtp", "architecture.mtp_layers=1", "speculative.options={}"))
    )
    assert config["method"] == "mtp"


def test_draft_tensor_parallel_must_be_one_or_the_engines():
    line = refusal("qwen3-coder-30b-ngram", "speculative.options.draft_tensor_parallel_size=2")
    assert "allows only 1 or the target's tensor parallel size" in line
    args = argv("qwen3-coder-30b-ngram", ("speculative.options.draft_tensor_parallel_size=2",), tp=2)
    assert spec_json(args)["draft_tensor_parallel_size"] == 2


def test_an_engine_without_a_speculative_record_is_refused():
    line = refusal("qwen3-coder-30b-ngram", "image=vllm-node-mxfp4")
    assert "vllm-node-mxfp4" in line and "no record of its speculative methods" in line


def test_the_config_is_said_once():
    line = refusal("qwen3-coder-30b-ngram", 'vllm.extra_args=["--speculative-config", "{}"]')
    assert "vllm.extra_args" in line


def test_bad_values_are_refused_by_the_schema(tmp_path):
    data = yaml.safe_load(recipes.find_recipe("qwen3-coder-30b-ngram").read_text())
    data["speculative"]["num_speculative_tokens"] = 0
    data["speculative"]["revision"] = "main; rm -rf /"
    path = tmp_path / "qwen3-coder-30b-ngram.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as exc:
        recipes.resolve(str(path))
    text = "\n".join(str(p) for p in exc.value.problems)
    assert "speculative.num_speculative_tokens" in text and "speculative.revision" in text


def test_lint_names_the_recipe_field_in_one_line(tmp_path, cli):
    data = yaml.safe_load(recipes.find_recipe("qwen3-coder-30b-ngram").read_text())
    data["name"] = "mine"
    data["speculative"]["method"] = "lookahead"
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(data))
    code, out, err = cli("recipes", "lint", "--recipes-dir", str(tmp_path))
    assert code == 1, out + err
    assert "Traceback" not in err
    assert any("mine" in line and "speculative.method" in line for line in out.splitlines()), out


def test_the_record_matches_vllm_0_32_0s_sources():
    """scripts/dump_vllm_speculative.py --check against the pinned vLLM's own files (needs its CPU venv)."""
    python = need_vllm_python()
    site = next(python.parent.parent.glob("lib/python3*/site-packages/vllm"))
    out = REPO / "images" / "vllm-node" / "vllm-speculative-0.32.0.json"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "dump_vllm_speculative.py"),
            "--vllm",
            str(site),
            "--expect-version",
            "0.32.0",
            "--out",
            str(out),
            "--check",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_record_names_the_methods_and_metrics_vllm_has():
    record = speculative.engine_record("0.32.0")
    assert record is not None
    assert {"eagle3", "mtp", "ngram", "draft_model", "suffix"} <= set(record["methods"])
    assert "qwen3_next_mtp" in record["mtp_aliases"]
    assert speculative.metric_names() == (
        "vllm:spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "vllm:spec_decode_num_draft_tokens",
        "vllm:spec_decode_num_drafts",
    )
