"""Scheduler and step-cost model: the mechanisms the calibration relies on, checked one at a time."""

from __future__ import annotations

import re

import pytest

from sparklaunch.protocol import GenRequest
from vllm_sim.catalog import default_catalog
from vllm_sim.config import ServeConfig
from vllm_sim.engine import SimEngine
from vllm_sim.scheduler import Scheduler, SchedulerLimits, Seq
from vllm_sim.timing import StepShape, distinct_experts

MODEL = "openai/gpt-oss-120b"


def cfg(**kw) -> ServeConfig:
    base = {
        "model": MODEL,
        "served_model_names": [MODEL],
        "max_model_len": 4096,
        "gpu_memory_utilization": 0.7,
        "kv_cache_dtype": "fp8",
        "enforce_eager": True,
        "max_num_batched_tokens": 32768,
        "mxfp4_layers": frozenset({"moe", "qkv", "o", "lm_head"}),
    }
    base.update(kw)
    return ServeConfig(**base)


def req(i: int, prompt: int = 1024, out: int = 4) -> GenRequest:
    return GenRequest(f"r{i}", list(range(prompt)), out)


def run_to_end(engine: SimEngine) -> tuple[float, list[int]]:
    clock, steps_tokens = 0.0, []
    while engine.has_unfinished():
        deltas, seconds = engine.step()
        clock += seconds
        steps_tokens.append(len(deltas))
    return clock, steps_tokens


def test_prefills_past_the_token_budget_wait_a_step():
    engine = SimEngine(cfg(max_num_seqs=256))
    for i in range(40):
        engine.add_request(req(i))
    first, _ = engine.step()
    assert len(first) == 32  # 32 x 1024 = 32768 fills the budget; the other 8 prompts wait
    second, _ = engine.step()
    assert len(second) == 32 + 8  # decodes of the first 32 and the (chunked) rest


def test_max_num_seqs_caps_the_running_batch():
    engine = SimEngine(cfg(max_num_seqs=3))
    for i in range(5):
        engine.add_request(req(i, prompt=16))
    engine.step()
    assert engine.stats().running == 3 and engine.stats().waiting == 2


def test_fitted_admission_cap_applies_below_max_num_seqs():
    assert SimEngine(cfg()).plan.max_num_seqs == default_catalog().model(MODEL).fitted["max_running_seqs"]
    assert SimEngine(cfg(max_num_seqs=8)).plan.max_num_seqs == 8


def test_every_request_gets_exactly_max_tokens():
    engine = SimEngine(cfg())
    for i in range(6):
        engine.add_request(req(i, prompt=100 + i, out=3 + i))
    counts: dict[str, int] = {}
    while engine.has_unfinished():
        for d in engine.step()[0]:
            counts[d.request_id] = counts.get(d.request_id, 0) + 1
            assert d.completion_tokens == counts[d.request_id]
    assert counts == {f"r{i}": 3 + i for i in range(6)}


def test_kv_exhaustion_preempts_and_recomputes():
    sched = Scheduler(SchedulerLimits(max_num_batched_tokens=4096, max_num_seqs=8, kv_blocks=10))
    a, b = Seq("a", 64), Seq("b", 64)  # 4 blocks each; 2 blocks of room to grow
    sched.add(a)
    sched.add(b)
    for _ in range(60):
        batch = sched.schedule()
        sched.complete(batch)
        if sched.preemptions:
            break
    assert sched.preemptions == 1 and sched.waiting[0] is b and b.computed == 0 and b.prompt_len > 64


def test_decode_step_is_bandwidth_bound_and_grows_sublinearly():
    e = SimEngine(cfg()).cost
    t1 = e.step_seconds(StepShape(decode_seqs=1, decode_context=1100, num_seqs=1))
    t32 = e.step_seconds(StepShape(decode_seqs=32, decode_context=32 * 1100, num_seqs=32))
    assert 0.010 < t1 < 0.030  # tens of ms per token at batch 1 (seed: 57.5 t/s)
    assert t1 < t32 < 16 * t1  # batching pays: 32 tokens for far less than 32 steps


def test_tp2_halves_weight_reads_and_pays_allreduce():
    solo = SimEngine(cfg()).cost
    tp2 = SimEngine(cfg(tp=2, nnodes=2)).cost
    shape = StepShape(decode_seqs=1, decode_context=1100, num_seqs=1)
    a, b = solo.breakdown(shape), tp2.breakdown(shape)
    assert b["memory"] == pytest.approx(a["memory"] / 2)
    assert a["comm"] == 0 and b["comm"] > 73 * 18e-6
    assert sum(b.values()) < sum(a.values())


def test_allreduce_latency_follows_graph_mode():
    """Seed 004: 46 us inside CUDA graphs, 18 us eager; splitting at vllm::all_reduce makes it eager."""
    shape = StepShape(decode_seqs=1, decode_context=1100, num_seqs=1)
    graph = SimEngine(cfg(tp=2, nnodes=2, enforce_eager=False, compilation_config={"cudagraph_mode": "PIECEWISE"})).cost
    split = SimEngine(
        cfg(
            tp=2,
            nnodes=2,
            enforce_eager=False,
            compilation_config={"cudagraph_mode": "PIECEWISE", "splitting_ops": ["vllm::all_reduce"]},
        )
    ).cost
    eager = SimEngine(cfg(tp=2, nnodes=2)).cost
    n = 2 * 36 + 1
    assert graph.breakdown(shape)["comm"] - split.breakdown(shape)["comm"] == pytest.approx(
        n * (46 - 23) * 1e-6, rel=1e-6
    )
    assert split.breakdown(shape)["comm"] - eager.breakdown(shape)["comm"] == pytest.approx(n * 5e-6, rel=1e-6)
    assert graph.breakdown(shape)["launch"] < eager.breakdown(shape)["launch"]


def test_mxfp4_layers_shrink_dense_reads():
    plain = SimEngine(cfg(mxfp4_layers=frozenset())).cost
    assert SimEngine(cfg()).cost.dense_bytes < plain.dense_bytes


def test_distinct_experts():
    assert distinct_experts(1, 128, 4, 2.0, 0.5) == pytest.approx(4.0, rel=0.05)  # one token: k of E
    assert distinct_experts(2, 128, 4, 2.0, 0.5) == pytest.approx(7.9, rel=0.05)  # independent below the knee
    counts = [distinct_experts(t, 128, 4, 2.0, 0.5) for t in (1, 8, 64, 32768)]
    assert counts == sorted(counts) and counts[-1] == pytest.approx(128, abs=1)
    assert distinct_experts(64, 128, 4, 2.0, 0.5) < distinct_experts(64, 128, 4, 2.0, 1.0)  # shared past it
    assert distinct_experts(0, 128, 4, 2.0, 0.5) == 0.0


def test_more_load_takes_longer_end_to_end():
    times = []
    for n in (1, 8):
        engine = SimEngine(cfg())
        for i in range(n):
            engine.add_request(req(i, out=16))
        times.append(run_to_end(engine)[0])
    assert times[0] < times[1] < 8 * times[0]


def test_kv_cache_per_token_by_attention_kind():
    """Per token and GPU: GQA splits its K/V heads over the TP ranks (sliding-window layers paged like full
    ones); MLA (GLM-4.7-Flash) caches one 576-element latent per layer, whole on every rank; Gated DeltaNet
    layers (Qwen3.5: 45 of 60) hold no per-token KV."""
    from vllm_sim.timing import ExecConfig, StepCostModel

    cat = default_catalog()

    def per_token(model: str, tp: int) -> float:
        return StepCostModel(cat, cat.hardware["gb10"], cat.model(model), ExecConfig(tp=tp)).kv_bytes_per_token()

    assert per_token(MODEL, 2) == 36 * 2 * 8 * 64 * 2 / 2
    assert per_token("meta-llama/Llama-3.3-70B-Instruct", 2) == 80 * 2 * 8 * 128 * 2 / 2
    assert per_token("zai-org/GLM-4.7-Flash", 1) == per_token("zai-org/GLM-4.7-Flash", 2) == 47 * 576 * 2
    assert per_token("Qwen/Qwen3.5-397B-A17B", 2) == 15 * 2 * 2 * 256 * 2 / 2


def test_a_quantized_checkpoint_takes_its_base_models_architecture():
    cat = default_catalog()
    base, quant = (
        cat.model("Qwen/Qwen3-Coder-30B-A3B-Instruct"),
        cat.model("Intel/Qwen3-Coder-30B-A3B-Instruct-int4-AutoRound"),
    )
    assert (quant.name, quant.default_quantization, base.default_quantization) == (
        "Intel/Qwen3-Coder-30B-A3B-Instruct-int4-AutoRound",
        "int4",
        "bf16",
    )
    assert {**quant.__dict__, "name": "", "default_quantization": ""} == {
        **base.__dict__,
        "name": "",
        "default_quantization": "",
    }
    glm = cat.model("cyankiwi/GLM-4.7-Flash-AWQ-4bit")
    assert (glm.moe_layers, glm.kv_latent_dim, glm.default_quantization) == (46, 576, "awq")


def test_kv_cache_report_is_vllms_arithmetic():
    """The start-up lines say what vLLM's say (Available KV cache memory, GPU KV cache size, Maximum
    concurrency) and the numbers are util x total - weights - peak in whole blocks; 0.1 more utilization
    buys 0.1 x total of KV, whatever the weights and peak are."""

    def tokens(plan) -> int:
        lines = plan.startup_lines()
        assert all("SIMULATED" in line for line in lines)
        m = re.fullmatch(r"GPU KV cache size: ([\d,]+) tokens .*", lines[1])
        assert m, lines
        return int(m.group(1).replace(",", ""))

    low, high = SimEngine(cfg(gpu_memory_utilization=0.7)).plan, SimEngine(cfg(gpu_memory_utilization=0.8)).plan
    per_token = low.kv_bytes_per_token
    assert per_token > 0 and low.total_bytes == int(default_catalog().hardware["gb10"].memory_gib * 2**30)
    assert low.kv_cache_bytes == int(0.7 * low.total_bytes) - low.weights_bytes - low.peak_bytes
    assert tokens(low) == int(low.kv_cache_bytes // (per_token * 16)) * 16
    assert f"Available KV cache memory: {low.kv_cache_bytes / 2**30:.2f} GiB" in low.startup_lines()[0]
    assert abs((tokens(high) - tokens(low)) - 0.1 * low.total_bytes / per_token) <= 32
    assert low.cache_config_info()["num_gpu_blocks"] == str(tokens(low) // 16)
