"""Recipe schema, resolution, provenance and refusal messages."""

from __future__ import annotations

import pytest
import yaml

from sparkdeploy.errors import ConfigError
from sparkdeploy.recipes import recipe as recipes

SHIPPED = [
    "openai-gpt-oss-120b",
    "openai-gpt-oss-120b-bench",
    "qwen3-coder-30b-int4",
    "glm-4.7-flash-int4",
    "qwen3.5-397b-int4-autoround",
    "llama-3.3-70b-instruct",
]


def write_recipe(tmp_path, **changes) -> str:
    data = yaml.safe_load((recipes.find_recipe("openai-gpt-oss-120b")).read_text())
    for key, value in changes.items():
        data[key] = value
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def messages(exc_info) -> list[str]:
    return [str(p) for p in exc_info.value.problems]


def test_every_shipped_recipe_is_present_and_valid():
    files = recipes.recipe_files()
    assert set(SHIPPED) <= set(files)
    for name in SHIPPED:
        recipe, _, _ = recipes.load_recipe(name)
        assert recipe.default_topology in recipe.topologies


def test_gpt_oss_values_from_the_seeds():
    r = recipes.resolve("openai-gpt-oss-120b-bench", "cluster").recipe
    assert (r.vllm.gpu_memory_utilization, r.vllm.max_model_len, r.vllm.kv_cache_dtype) == (0.70, 4096, "fp8")
    assert r.vllm.enforce_eager and r.vllm.max_num_batched_tokens == 32768
    assert r.vllm.extra_args == ["--mxfp4-layers", "moe,qkv,o,lm_head"]
    assert set(r.topologies) == {"solo", "cluster", "2xsolo"}


def test_default_gpt_oss_serves_tools_and_reasoning_with_a_long_context():
    """Issue 27: an agent client (tools, tool_choice auto) gets a tool call, not HTTP 400: vLLM's gpt-oss
    parsers; the seeds' 4K eager benchmark values live in openai-gpt-oss-120b-bench."""
    r = recipes.resolve("openai-gpt-oss-120b", "cluster").recipe
    args = r.vllm.extra_args
    assert args[args.index("--tool-call-parser") + 1] == "openai" and "--enable-auto-tool-choice" in args
    assert args[args.index("--reasoning-parser") + 1] == "openai_gptoss"
    assert r.vllm.max_model_len == 131072 and not r.vllm.enforce_eager
    bench = recipes.resolve("openai-gpt-oss-120b-bench", "cluster").recipe
    assert (bench.model, bench.image, bench.architecture) == (
        r.model,
        r.image,
        r.architecture.model_copy(update={"source": None}),
    )


def test_unknown_key_did_you_mean(tmp_path):
    path = write_recipe(tmp_path, vllm={"gpu_memory_utilisation": 0.7})
    with pytest.raises(ConfigError) as info:
        recipes.load_recipe(path)
    assert messages(info) == [
        (f"{path}: vllm.gpu_memory_utilisation: unknown key (fix: did you mean 'gpu_memory_utilization'?)")
    ]


def test_unknown_top_level_key(tmp_path):
    path = write_recipe(tmp_path, topology="solo")
    with pytest.raises(ConfigError) as info:
        recipes.load_recipe(path)
    assert any("topology: unknown key (fix: did you mean 'topologies'?)" in m for m in messages(info))


def test_unknown_recipe_lists_the_closest():
    with pytest.raises(ConfigError) as info:
        recipes.resolve("openai-gpt-oss-12b")
    (msg,) = messages(info)
    assert "no such recipe" in msg and "did you mean openai-gpt-oss-120b" in msg


def test_model_too_big_for_one_node_is_refused_with_the_reason():
    with pytest.raises(ConfigError) as info:
        recipes.resolve("llama-3.3-70b-instruct", "solo")
    (msg,) = messages(info)
    assert "141 GB" in msg and "128 GB" in msg and "use --topology cluster" in msg
    with pytest.raises(ConfigError):
        recipes.resolve("llama-3.3-70b-instruct", "2xsolo")


def test_unsupported_topology_lists_the_supported(tmp_path):
    path = write_recipe(tmp_path, topologies=["cluster"], default_topology="cluster")
    with pytest.raises(ConfigError) as info:
        recipes.resolve(path, "solo")
    assert "does not support solo" in messages(info)[0] and "use one of cluster" in messages(info)[0]


def test_default_topology_must_be_listed(tmp_path):
    path = write_recipe(tmp_path, topologies=["solo"], default_topology="cluster")
    with pytest.raises(ConfigError) as info:
        recipes.load_recipe(path)
    assert any("default_topology: cluster is not in topologies" in m for m in messages(info))


def test_fits_one_node_false_cannot_list_solo(tmp_path):
    path = write_recipe(tmp_path, fits_one_node=False)
    with pytest.raises(ConfigError) as info:
        recipes.load_recipe(path)
    assert any("need the model on one node" in m for m in messages(info))


def test_secret_in_recipe_env_is_refused(tmp_path):
    path = write_recipe(tmp_path, env={"HF_TOKEN": "hf_x"})
    with pytest.raises(ConfigError) as info:
        recipes.load_recipe(path)
    assert any("looks like a secret" in m and "secrets file" in m for m in messages(info))


def test_env_value_with_newline_is_refused(tmp_path):
    path = write_recipe(tmp_path, env={"FOO": "a\nb"})
    with pytest.raises(ConfigError) as info:
        recipes.load_recipe(path)
    assert any("cannot hold a newline" in m for m in messages(info))


def test_set_overrides_and_provenance():
    r = recipes.resolve("openai-gpt-oss-120b", "cluster", sets=["vllm.max_model_len=8192", "vllm.enforce_eager=false"])
    assert r.recipe.vllm.max_model_len == 8192 and r.recipe.vllm.enforce_eager is False
    assert r.sources["vllm.max_model_len"] == "--set"
    assert r.sources["vllm.gpu_memory_utilization"] == "openai-gpt-oss-120b.yaml"
    assert r.sources["litellm.num_retries"] == "default"


def test_set_wins_over_topology_override():
    r = recipes.resolve("qwen3-coder-30b-int4", "solo")
    assert r.recipe.vllm.compilation.eager_allreduce is False
    assert r.sources["vllm.compilation.eager_allreduce"] == "qwen3-coder-30b-int4.yaml overrides.solo"
    r = recipes.resolve("qwen3-coder-30b-int4", "solo", sets=["vllm.compilation.eager_allreduce=true"])
    assert r.recipe.vllm.compilation.eager_allreduce is True


def test_set_with_unknown_key_is_an_error():
    with pytest.raises(ConfigError) as info:
        recipes.resolve("openai-gpt-oss-120b", sets=["vllm.max_model_lenn=1"])
    assert "did you mean 'max_model_len'" in messages(info)[0]


def test_set_needs_key_value():
    with pytest.raises(ConfigError) as info:
        recipes.resolve("openai-gpt-oss-120b", sets=["vllm.max_model_len"])
    assert "expects KEY=VALUE" in messages(info)[0]


def test_out_of_range_value():
    with pytest.raises(ConfigError) as info:
        recipes.resolve("openai-gpt-oss-120b", sets=["vllm.gpu_memory_utilization=0.99"])
    assert "vllm.gpu_memory_utilization" in messages(info)[0]


def test_least_busy_is_allowed_with_a_warning_citing_the_seeds():
    r = recipes.resolve("openai-gpt-oss-120b", "2xsolo", sets=["litellm.routing_strategy=least-busy"])
    (warning,) = r.warnings
    assert "-68% decode" in warning and "c64" in warning
    assert recipes.resolve("openai-gpt-oss-120b", "2xsolo").warnings == []


def test_unknown_routing_strategy():
    with pytest.raises(ConfigError) as info:
        recipes.resolve("openai-gpt-oss-120b", "2xsolo", sets=["litellm.routing_strategy=round-robin"])
    assert "litellm.routing_strategy" in messages(info)[0]


def test_backend_defaults_to_the_recipe_and_only_applies_to_cluster():
    assert recipes.resolve("qwen3-coder-30b-int4", "cluster").backend == "torchrun"
    assert recipes.resolve("qwen3-coder-30b-int4", "cluster", backend="native").backend == "native"
    assert recipes.resolve("qwen3-coder-30b-int4", "solo", backend="ray").backend == ""


def test_recipes_dir_comes_first(tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    mine.mkdir()
    data = yaml.safe_load(recipes.find_recipe("openai-gpt-oss-120b").read_text())
    data["description"] = "my own copy"
    (mine / "openai-gpt-oss-120b.yaml").write_text(yaml.safe_dump(data))
    assert recipes.resolve("openai-gpt-oss-120b", recipes_dir=str(mine)).recipe.description == "my own copy"
    monkeypatch.setenv("SPARKDEPLOY_RECIPES", str(mine))
    assert recipes.resolve("openai-gpt-oss-120b").recipe.description == "my own copy"
