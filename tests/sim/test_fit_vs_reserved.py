"""benchmarks/fit_vs_reserved.py reads what vllm-sim logs, and the budget agrees with the sim's start-up
arithmetic where both model the same thing (SIMULATED: the sim allocates nothing)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from sparkdeploy.recipes import budget
from sparkdeploy.recipes.recipe import resolve
from vllm_sim.config import ServeConfig
from vllm_sim.engine import SimEngine

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fit_vs_reserved

GIB = 2**30


def test_the_benchmark_parses_the_sims_lines_and_the_budget_agrees_on_the_reservation(caplog):
    recipe = resolve("openai-gpt-oss-120b", "solo", None, (), None).recipe
    v = recipe.vllm
    with caplog.at_level(logging.INFO, logger="vllm_sim.engine"):
        plan = SimEngine(
            ServeConfig(
                model=recipe.model,
                served_model_names=[recipe.model],
                max_model_len=v.max_model_len,
                gpu_memory_utilization=v.gpu_memory_utilization,
                kv_cache_dtype=v.kv_cache_dtype or "auto",
                max_num_batched_tokens=v.max_num_batched_tokens,
                mxfp4_layers=frozenset({"moe", "qkv", "o", "lm_head"}),
            )
        ).plan
    text = "\n".join(r.getMessage() for r in caplog.records)
    kv_mem = fit_vs_reserved.KV_MEM_RE.search(text)
    kv_tok = fit_vs_reserved.KV_TOK_RE.search(text)
    planned = fit_vs_reserved.PLAN_RE.search(text)
    assert kv_mem and kv_tok and planned, text
    assert int(kv_tok["tok"].replace(",", "")) == plan.kv_cache_tokens == plan.kv_blocks * 16
    assert abs(float(kv_mem["gib"]) * GIB - plan.kv_cache_bytes) < 0.01 * GIB
    assert int(planned["blocks"]) == plan.kv_blocks

    b = budget.nominal(recipe, 1)
    assert abs(b.reserve / plan.reserve_bytes - 1) < 0.001  # util x total: one formula, the same total
    assert abs(b.weights / plan.weights_bytes - 1) < 0.10  # recipe's weights_gb vs the sim's parameter counts
