"""doctor --nccl's advice per recipe: keep graphs / cut at all-reduce / enforce eager, from the probe's 4 KiB
figures (pure logic; the figures are the seeds' CX7 ones and the H200 NVLink ones in docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from sparkdeploy.doctor import graph_advice as ga
from sparkdeploy.doctor.nccl_probe import allreduce_advice
from sparkdeploy.recipes import recipe as recipes_mod

SEEDS_CX7 = {"eager_us": 18.0, "graph_us": 46.0, "eager_method": "eager nccl-direct"}
H200_NVLINK = {"eager_us": 7.3, "graph_us": 6.2, "eager_method": "eager nccl-direct"}


def test_seeds_cx7_figures_cut_at_the_all_reduce_with_the_numbers():
    advice = ga.advise(SEEDS_CX7)
    assert advice.choice == ga.CUT
    assert "18.0 us eager" in advice.reason and "46.0 us in a CUDA graph" in advice.reason
    assert "graph/eager 2.56" in advice.reason and "saves about 23.0 us" in advice.reason


def test_nvlink_figures_keep_graphs():
    advice = ga.advise(H200_NVLINK)
    assert advice.choice == ga.KEEP and "faster inside the graph" in advice.reason and "7.3 us" in advice.reason


@pytest.mark.parametrize(
    "eager, graph, choice",
    [
        (10.0, 13.0, ga.KEEP),  # 1.3x slower in a graph, but 3 us is less than an extra graph piece costs
        (10.0, 11.5, ga.KEEP),  # under the 1.2 ratio: within the noise
        (20.0, 25.5, ga.CUT),  # 1.275x and 5.5 us: half a microsecond left after the extra piece
        (30.0, 40.0, ga.CUT),
        (40.0, 9.0, ga.KEEP),  # reference.md's plain loop over NVLink
    ],
)
def test_thresholds(eager, graph, choice):
    assert ga.advise({"eager_us": eager, "graph_us": graph}).choice == choice


def test_failed_capture_enforces_eager_and_gloo_gives_no_advice():
    failed = ga.advise({"eager_us": 19.0, "graph_us": None, "graph_error": "RuntimeError: capture failed"})
    assert failed.choice == ga.EAGER and "capture failed" in failed.reason and "19.0 us" in failed.reason
    assert (
        ga.advise(
            {
                "eager_us": 900.0,
                "graph_us": None,
                "graph_error": "not applicable: CUDA graphs need the nccl backend on GPUs",
            }
        )
        is None
    )
    assert ga.advise({"eager_us": None}) is None


def _resolved(name, topology, *sets):
    return recipes_mod.resolve(name, topology, None, list(sets))


def test_recipe_modes_from_the_shipped_recipes():
    assert ga.recipe_mode(_resolved("qwen3-coder-30b-int4", "cluster").recipe.vllm) == ga.CUT
    assert ga.recipe_mode(_resolved("openai-gpt-oss-120b-bench", "cluster").recipe.vllm) == ga.EAGER
    plain = _resolved("openai-gpt-oss-120b", "cluster", "vllm.enforce_eager=false")
    assert ga.recipe_mode(plain.recipe.vllm) == ga.KEEP


def test_advice_per_recipe_names_the_setting_and_the_figures():
    cut_recipe = _resolved("qwen3-coder-30b-int4", "cluster")
    text, data = allreduce_advice(SEEDS_CX7, cut_recipe)
    assert data["fits"] and data["recipe_mode"] == ga.CUT and "fits this cluster" in text and "46.0 us" in text
    text, data = allreduce_advice(H200_NVLINK, cut_recipe)
    assert not data["fits"] and data["choice"] == ga.KEEP
    assert "wants keep graphs" in text and "vllm.compilation.eager_allreduce: false" in text and "6.2 us" in text
    eager_recipe = _resolved("openai-gpt-oss-120b-bench", "cluster")
    text, _ = allreduce_advice(SEEDS_CX7, eager_recipe)
    assert "set vllm.enforce_eager: false and vllm.compilation.eager_allreduce: true" in text
    assert "another reason" in text
    text, data = allreduce_advice(SEEDS_CX7, None)
    assert text.startswith("this cluster wants cut at all-reduce") and "recipe" not in data
    assert allreduce_advice({"eager_us": 1.0, "graph_us": None, "graph_error": "not applicable"}, cut_recipe) == (
        "",
        {},
    )
