"""The calibration, checked cheaply: the virtual-time predictor against the seed tables, and the adapter's
pacing. The full check through HTTP, proxy and llama-benchy is benchmarks/calibrate_sim.py (minutes)."""

from __future__ import annotations

import pytest
import yaml

from sparklaunch.protocol import GenRequest
from vllm_sim.adapter import MAX_CATCH_UP_S, SimAdapter
from vllm_sim.catalog import DATA_DIR
from vllm_sim.config import from_namespace
from vllm_sim.flags import parse_serve_args
from vllm_sim.predict import predict, with_tp

TARGETS = yaml.safe_load((DATA_DIR / "calibration-targets.yaml").read_text())


@pytest.fixture(scope="module")
def seed_cfg():
    return from_namespace(parse_serve_args([TARGETS["model"], *TARGETS["serve_args"]]), env={})


def check(topology: str, points, tolerance: float) -> None:
    seeds = TARGETS["topologies"][topology]
    bad = []
    for p in points:
        i = TARGETS["concurrency"].index(p.concurrency)
        for name, value in (("decode", p.decode_tps), ("prefill", p.prefill_tps), ("ttft", p.ttft_ms)):
            err = value / seeds[name][i] - 1
            if abs(err) > tolerance:
                bad.append(f"{topology} c{p.concurrency} {name}: {value:.0f} vs seed {seeds[name][i]} ({err:+.0%})")
    assert not bad, "\n".join(bad)


# The predictor reproduces the seeds within 15% (the real stack adds noise on top; tolerance 25%).
def test_solo_prediction_matches_seeds(seed_cfg):
    check("solo", predict(seed_cfg, TARGETS["concurrency"]), 0.15)


def test_cluster_tp2_prediction_matches_seeds(seed_cfg):
    check("cluster-tp2", predict(with_tp(seed_cfg, 2), TARGETS["concurrency"]), 0.15)


def test_2xsolo_prediction_matches_seeds(seed_cfg):
    check("2xsolo-shuffle", predict(seed_cfg, TARGETS["concurrency"], engines=2, runs=30, spacing_s=0.004), 0.15)


def test_topology_ordering_of_the_seeds(seed_cfg):
    """The seeds' story: cluster wins decode at c8, 2xsolo wins everything at c64, solo collapses at c64."""
    solo = {p.concurrency: p for p in predict(seed_cfg, [8, 32, 64])}
    tp2 = {p.concurrency: p for p in predict(with_tp(seed_cfg, 2), [8, 64])}
    two = {p.concurrency: p for p in predict(seed_cfg, [8, 64], engines=2, runs=30, spacing_s=0.004)}
    assert tp2[8].decode_tps > two[8].decode_tps > solo[8].decode_tps
    assert two[64].decode_tps > tp2[64].decode_tps and two[64].prefill_tps > 2 * tp2[64].prefill_tps
    assert solo[64].prefill_tps < solo[32].prefill_tps / 2 and solo[64].ttft_ms > 2 * solo[32].ttft_ms


def test_enforce_eager_off_changes_tp2_decode(seed_cfg):
    """CUDA graphs cut launch cost but put the all-reduce in the graph (46 us): both effects are modeled."""
    from dataclasses import replace

    eager = predict(with_tp(seed_cfg, 2), [1])[0].decode_tps
    graphs = predict(replace(with_tp(seed_cfg, 2), enforce_eager=False), [1])[0].decode_tps
    split = predict(
        replace(
            with_tp(seed_cfg, 2),
            enforce_eager=False,
            compilation_config={"splitting_ops": ["vllm::all_reduce"], "cudagraph_mode": "PIECEWISE"},
        ),
        [1],
    )[0].decode_tps
    assert graphs > eager  # launch savings (36 layers) outweigh 73 slower all-reduces
    assert split > graphs  # seed 004's fix: all-reduce eager between graph pieces


class FakeTime:
    def __init__(self):
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self):
        return self.now

    def sleep(self, s):
        self.slept.append(s)
        self.now += s


def test_steps_are_paced_on_a_continuous_timeline(seed_cfg):
    t = FakeTime()
    a = SimAdapter(seed_cfg, sleep=t.sleep, clock=t.clock)
    a.add_request(GenRequest("r", [0] * 1024, 50))
    durations = []
    for _i in range(5):
        before = a.simulated_seconds
        a.step()
        durations.append(a.simulated_seconds - before)
        t.now += 0.004  # the host spends 4 ms between steps (HTTP, collectives)
    # the time between steps is taken out of the next sleep, not added to it
    assert t.slept[1] == pytest.approx(durations[1] - 0.004)
    assert t.now - 100.0 == pytest.approx(sum(durations) + 0.004)


def test_a_long_stall_restarts_the_timeline(seed_cfg):
    t = FakeTime()
    a = SimAdapter(seed_cfg, sleep=t.sleep, clock=t.clock)
    a.add_request(GenRequest("r", [0] * 16, 50))
    a.step()
    t.now += MAX_CATCH_UP_S + 1  # the host froze
    a.step()
    assert t.slept[-1] > 0  # the step after the stall still takes its time: no burst of catch-up steps


# The real stack (HTTP, the LiteLLM proxy, llama-benchy) at c1/c8/c64 is a sweep, not a CI test: it is
# `python benchmarks/calibrate_sim.py --quick` (about 4 minutes), whose figures are in docs/calibration.md. The
# lab suite still drives llama-benchy through the proxy against the simulator (tests/bench/test_bench_lab.py).
