"""The sim's /metrics has vLLM's TTFT and e2e histograms, and `sparkdeploy top` reads a real sim server;
the OOM fault refuses to run without a cgroup memory limit (the lab test makes the real OOM kill)."""

from __future__ import annotations

import math

import requests

from sparkdeploy.daytwo import top
from tests.sim.conftest import MODEL, SEED_ARGS


def _chat(base: str, max_tokens: int = 8) -> None:
    r = requests.post(
        base + "/v1/chat/completions",
        timeout=60,
        json={"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": max_tokens},
    )
    assert r.status_code == 200, r.text


def test_ttft_histogram_and_top_reads_it(sim_server):
    base, _ = sim_server(*SEED_ARGS)
    target = top.Target("local", "sim", "engine", base + "/metrics")
    mon = top.Monitor([target], window_s=60)
    mon.sample()
    for _ in range(3):
        _chat(base)
    mon.sample()
    text = requests.get(base + "/metrics", timeout=5).text
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text
    assert "# TYPE vllm:e2e_request_latency_seconds histogram" in text
    m = top.parse_metrics(text)
    buckets = top._buckets(m, "vllm:time_to_first_token_seconds")
    assert [b for b, _ in buckets][:3] == [0.001, 0.005, 0.01] and math.isinf(buckets[-1][0])  # vLLM's buckets
    assert buckets[-1][1] == 3 and m["vllm:time_to_first_token_seconds_count"][0][1] == 3
    assert m["vllm:e2e_request_latency_seconds_count"][0][1] == 3
    assert m["vllm:time_to_first_token_seconds_sum"][0][1] > 0
    row = mon.snapshot()["engines"][0]
    assert row["error"] is None and row["ttft_requests"] == 3 and row["ttft_basis"] == "window"
    assert 0 < row["ttft_p50_s"] <= row["ttft_p95_s"] < 10
    assert row["generation_tokens_per_s"] > 0 and row["prompt_tokens_per_s"] > 0
    assert row["running"] == 0 and row["waiting"] == 0


def test_oom_fault_needs_a_cgroup_limit(tmp_path):
    from vllm_sim import faults

    assert faults.memory_limit(tmp_path) is None  # no cgroup files at all
    (tmp_path / "memory.max").write_text("max\n")
    assert faults.memory_limit(tmp_path) is None
    (tmp_path / "memory.max").write_text("536870912\n")
    assert faults.memory_limit(tmp_path) == 512 * 2**20
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(str(2**63 - 4096))
    assert faults.memory_limit(v1) is None
    assert faults.exhaust_memory(None) is False  # refuses: it would eat the host's memory
