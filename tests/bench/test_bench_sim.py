"""One real llama-benchy run against the real simulator (vllm-sim) on localhost, started the way the sim's own
tests start it, with the simulator's offline tokenizer and prompt corpus (the runner's defaults)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from sparkdeploy.bench.runner import BenchSettings, Endpoint, run_cell, sim_data_dir
from sparkdeploy.bench.store import read_result

REPO = Path(__file__).resolve().parents[2]
SIM_DIR, LAUNCHER_DIR = REPO / "images" / "vllm-sim", REPO / "images" / "launcher"
KEY = "sk-SIMbenchKEY314"
MODEL = "openai/gpt-oss-120b"



def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sim(tmp_path):
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SIM_DIR), str(LAUNCHER_DIR)]),
               VLLM_SIM_TIME_SCALE="0.2", VLLM_API_KEY=KEY)  # the key by environment, as vLLM takes it
    log = open(tmp_path / "sim.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "vllm_sim", "serve", MODEL, "--host", "127.0.0.1", "--port",
                             str(port), "--max-model-len", "4096", "--max-num-batched-tokens", "32768",
                             "--gpu-memory-utilization", "0.7", "--enforce-eager"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO))
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, (tmp_path / "sim.log").read_text()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        assert time.monotonic() < deadline, "the simulator did not become healthy"
        time.sleep(0.2)
    yield f"http://127.0.0.1:{port}/v1"
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    log.close()


def test_llama_benchy_against_the_simulator(sim, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # llama-benchy's corpus cache stays in the test
    monkeypatch.delenv("SPARKDEPLOY_BENCH_TOKENIZER", raising=False)
    monkeypatch.delenv("SPARKDEPLOY_BENCH_CORPUS", raising=False)
    ep = Endpoint(sim, MODEL, KEY, {"recipe": "openai-gpt-oss-120b", "topology": "solo", "simulated": True,
                                    "vllm_version": "0.32.0"})
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
