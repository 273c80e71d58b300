"""The GB10 model on four nodes (SIMULATED): TP=4's ring all-reduce, and the advisor's verdicts on cluster TP=4
vs replicas of TP=2 vs 4xsolo from the predictor's points (what `benchmarks/four_nodes.py predict --out` writes).
The derivation is in docs/multinode.md; no Spark measured any of it."""

from __future__ import annotations

import pytest
import yaml

from sparkdeploy.bench.advisor import advise
from sparkdeploy.bench.store import BenchResult, Stat, save_result
from vllm_sim.catalog import DATA_DIR
from vllm_sim.config import from_namespace
from vllm_sim.engine import SimEngine
from vllm_sim.flags import parse_serve_args
from vllm_sim.predict import predict, with_tp
from vllm_sim.timing import ExecConfig, StepShape, ring_factors

TARGETS = yaml.safe_load((DATA_DIR / "calibration-targets.yaml").read_text())
RECIPE = "openai-gpt-oss-120b-bench"


@pytest.fixture(scope="module")
def cfg():
    return from_namespace(parse_serve_args([TARGETS["model"], *TARGETS["serve_args"]]), env={})


def test_ring_factors_are_one_at_two_ranks():
    assert ring_factors(2) == (1.0, 1.0)  # the calibrated TP=2 model is unchanged
    assert ring_factors(4) == (3.0, 1.5)  # 2(N-1) = 6 steps vs 2; 2(N-1)/N = 1.5 of the payload vs 1


def test_tp4_halves_the_weights_read_and_pays_more_all_reduce(cfg):
    engine = SimEngine(cfg)
    model = engine.model
    from vllm_sim.timing import StepCostModel

    def parts(tp: int) -> dict[str, float]:
        ex = ExecConfig(
            tp=tp,
            quantization=cfg.quantization,
            mxfp4_layers=frozenset(cfg.mxfp4_layers or ()),
            kv_cache_dtype=cfg.kv_cache_dtype or "auto",
            graph_mode="eager",
        )
        return StepCostModel(engine.catalog, engine.hw, model, ex).breakdown(
            StepShape(decode_seqs=8, decode_context=8 * 1024, num_seqs=8)
        )

    two, four = parts(2), parts(4)
    assert four["memory"] == pytest.approx(two["memory"] / 2)
    assert four["comm"] > 2 * two["comm"]  # three times the latency steps, 1.5 times the bytes


def test_advisor_on_four_nodes_cluster_at_c1_engines_at_c64(cfg, tmp_path):
    levels = [1, 64]
    layouts = {
        "cluster": (predict(with_tp(cfg, 4), levels), 1),
        "replicas": (predict(with_tp(cfg, 2), levels, engines=2, runs=6, spacing_s=0.004), 2),
        "2xsolo-shuffle": (predict(cfg, levels, engines=4, runs=6, spacing_s=0.004), 4),
    }
    nodes = [{"name": f"spark{i}"} for i in range(1, 5)]
    for variant, (points, engines) in layouts.items():
        for p in points:
            md = {
                "simulated": True,
                "nodes": nodes,
                "backends": [f"e{i}" for i in range(engines)] if engines > 1 else [],
            }
            save_result(
                BenchResult(
                    RECIPE,
                    variant,
                    TARGETS["pp"],
                    TARGETS["tg"],
                    p.concurrency,
                    {"decode_tps": Stat(p.decode_tps), "prefill_tps": Stat(p.prefill_tps), "ttft_ms": Stat(p.ttft_ms)},
                    md,
                ),
                tmp_path,
            )
    low = advise(1, recipe=RECIPE, results_dirs=[str(tmp_path)])
    assert low.topology == "cluster" and low.label("cluster") == "Cluster TP=4"
    assert low.source["simulated"]
    high = advise(64, recipe=RECIPE, results_dirs=[str(tmp_path)])
    assert (
        high.topology in ("replicas", "2xsolo")
        and high.best.request_s < next(e for e in high.ranking if e.variant == "cluster").request_s
    )
    why = " ".join(high.reasons)
    assert "Replicas 2xTP=2 (2 engines) gives each ~32" in why and "4xSolo shuffle (4 engines) gives each ~16" in why
    assert "cluster TP=4 vs 2 replicas of TP=2" in why
