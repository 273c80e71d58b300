"""One real llama-benchy run against the real simulator (vllm-sim) on localhost, started the way the sim's own
tests start it, with the simulator's offline tokenizer and prompt corpus (the runner's defaults)."""

from __future__ import annotations

from pathlib import Path

from sparkdeploy.bench.benchy import BenchSettings, Endpoint, run_cell, sim_data_dir
from sparkdeploy.bench.store import read_result
from tests.bench.conftest import SIM_KEY as KEY
from tests.bench.conftest import SIM_MODEL as MODEL


def test_llama_benchy_against_the_simulator(sim, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # llama-benchy's corpus cache stays in the test
    monkeypatch.delenv("SPARKDEPLOY_BENCH_TOKENIZER", raising=False)
    monkeypatch.delenv("SPARKDEPLOY_BENCH_CORPUS", raising=False)
    ep = Endpoint(
        sim,
        MODEL,
        KEY,
        {"recipe": "openai-gpt-oss-120b-bench", "topology": "solo", "simulated": True, "vllm_version": "0.32.0"},
    )
    settings = BenchSettings(pp=512, tg=32, runs=2)  # tokenizer and corpus: the simulator's (defaults)
    result = run_cell(ep, settings, 4, tmp_path / "out")
    stored = read_result(result.path)
    md = stored.metadata
    assert md["failed_requests"] == 0 and md["requests"] == 8
    assert md["tokenizer"].startswith(str(sim_data_dir())) and md["corpus"]["path"].startswith(str(sim_data_dir()))
    assert md["coherence_checked"] is False  # a simulated engine writes placeholder text
    m = stored.metrics
    assert m["decode_tps"].mean > 0 and m["prefill_tps"].mean > 0 and m["ttft_ms"].mean > 0
    assert len(m["ttft_ms"].values) == 8
    run = stored.llama_benchy["benchmarks"][0]
    assert run["prompt_size"] == 512 and run["concurrency"] == 4
    log = Path(md["log"]).read_text()
    assert "Loading text from cache" in log and KEY not in log
