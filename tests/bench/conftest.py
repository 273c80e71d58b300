"""Fixtures of the bench tests: stored results shaped like the seeds, a local tokenizer and corpus, the real
simulator (vllm-sim from the checkout) on localhost, and a real LiteLLM proxy in front of it."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from sparkdeploy.bench.seeds import seed_reference
from sparkdeploy.bench.store import BenchResult, Stat, save_result
from tests.bench.bench_fakes import write_corpus, write_tokenizer

THREE = ("solo", "cluster", "2xsolo-shuffle")


def make_results(variants=THREE, scale: dict | None = None, seed: int = 1, runs: int = 3) -> list[BenchResult]:
    """Results with the reference's means (times `scale[(variant, c, metric)]`), 3 runs each with a small spread."""
    rng = random.Random(seed)
    out = []
    for ref in seed_reference().results:
        if ref.variant not in variants:
            continue
        metrics = {}
        for m, st in ref.metrics.items():
            mean = st.mean * (scale or {}).get((ref.variant, ref.concurrency, m), 1.0)
            values = [mean * (1 + d) for d in (-0.01, 0.0, 0.01)]
            metrics[m] = Stat(sum(values) / 3, abs(mean) * 0.02, values)
        md = {
            "recipe": ref.recipe,
            "topology": ref.variant.split("-")[0],
            "backend": "ray" if ref.variant == "cluster" else None,
            "routing": "simple-shuffle" if ref.variant.startswith("2xsolo") else None,
            "image": "sparkdeploy/vllm-sim:0123456789ab",
            "image_id": "sha256:" + "ab" * 32,
            "vllm_version": "0.32.0",
            "simulated": True,
            "runs": runs,
            "failed_requests": 0,
            "nodes": [{"name": "spark1"}] + ([] if ref.variant == "solo" else [{"name": "spark2"}]),
            "date": f"2026-11-21T10:{rng.randint(10, 59)}:00+00:00",
            "llama_benchy_version": "0.4.0",
        }
        out.append(BenchResult(ref.recipe, ref.variant, ref.pp, ref.tg, ref.concurrency, metrics, md))
    return out


@pytest.fixture
def stored_results(tmp_path) -> Path:
    d = tmp_path / "results"
    for r in make_results():
        save_result(r, d)
    return d


@pytest.fixture(scope="session")
def bench_data(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("bench-data")
    return write_tokenizer(d / "tokenizer.json"), write_corpus(d / "corpus.txt")


REPO = Path(__file__).resolve().parents[2]
SIM_DIR, LAUNCHER_DIR = REPO / "images" / "vllm-sim", REPO / "images" / "launcher"
SIM_KEY = "sk-SIMbenchKEY314"
SIM_MODEL = "openai/gpt-oss-120b"
PROXY_KEY = "sk-PROXYmasterKEY271"
PROXY_MODEL = "gpt-oss-lab"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(cmd: list, env: dict, log_path: Path, ready_url: str, timeout_s: float = 90.0) -> subprocess.Popen:
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(log_path.parent))
    log.close()
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, log_path.read_text()
        try:
            with urllib.request.urlopen(ready_url, timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{cmd[0]} did not become ready: {log_path.read_text()[-2000:]}"
        time.sleep(0.2)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def sim(tmp_path):
    """vllm-sim serving SIM_MODEL on localhost, started the way the sim's own tests start it: its /v1 base URL."""
    port = free_port()
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(SIM_DIR), str(LAUNCHER_DIR)]),
        VLLM_SIM_TIME_SCALE="0.2",
        VLLM_API_KEY=SIM_KEY,
    )  # the key by environment, as vLLM takes it
    proc = _start(
        [
            sys.executable,
            "-m",
            "vllm_sim",
            "serve",
            SIM_MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-model-len",
            "4096",
            "--max-num-batched-tokens",
            "32768",
            "--gpu-memory-utilization",
            "0.7",
            "--enforce-eager",
        ],
        env,
        tmp_path / "sim.log",
        f"http://127.0.0.1:{port}/health",
        60,
    )
    yield f"http://127.0.0.1:{port}/v1"
    _stop(proc)


@pytest.fixture
def proxy(sim, tmp_path):
    """The project's LiteLLM (.venv-litellm, scripts/setup.sh) in front of the sim, as 2xsolo runs it
    (hosted_vllm/ provider): its /v1 base URL. Clients use PROXY_KEY and PROXY_MODEL."""
    import yaml

    litellm = REPO / ".venv-litellm" / "bin" / "litellm"
    assert litellm.is_file(), f"{litellm} is missing: run `bash scripts/setup.sh`"
    config = tmp_path / "litellm.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model_list": [
                    {
                        "model_name": PROXY_MODEL,
                        "litellm_params": {"model": f"hosted_vllm/{SIM_MODEL}", "api_base": sim, "api_key": SIM_KEY},
                    }
                ],
                "general_settings": {"master_key": PROXY_KEY},
            }
        )
    )
    port = free_port()
    env = dict(os.environ, LITELLM_MASTER_KEY=PROXY_KEY, LITELLM_LOG="ERROR", NO_DOCS="True")
    proc = _start(
        [str(litellm), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
        env,
        tmp_path / "litellm.log",
        f"http://127.0.0.1:{port}/health/liveliness",
        120,
    )
    yield f"http://127.0.0.1:{port}/v1"
    _stop(proc)
