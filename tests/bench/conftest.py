"""Fixtures of the bench tests: stored results shaped like the seeds, a local tokenizer and corpus."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sparkdeploy.bench.reference import seed_reference
from sparkdeploy.bench.store import Result, Stat, save_result
from tests.bench.bench_fakes import write_corpus, write_tokenizer

THREE = ("solo", "cluster", "2xsolo-shuffle")


def make_results(variants=THREE, scale: dict | None = None, seed: int = 1, runs: int = 3) -> list[Result]:
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
        md = {"recipe": ref.recipe, "topology": ref.variant.split("-")[0], "backend": "ray" if ref.variant == "cluster"
              else None, "routing": "simple-shuffle" if ref.variant.startswith("2xsolo") else None,
              "image": "sparkdeploy/vllm-sim:0123456789ab", "image_id": "sha256:" + "ab" * 32,
              "vllm_version": "0.32.0", "simulated": True, "runs": runs, "failed_requests": 0,
              "nodes": [{"name": "spark1"}] + ([] if ref.variant == "solo" else [{"name": "spark2"}]),
              "date": f"2026-11-21T10:{rng.randint(10, 59)}:00+00:00", "llama_benchy_version": "0.4.0"}
        out.append(Result(ref.recipe, ref.variant, ref.pp, ref.tg, ref.concurrency, metrics, md))
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
