"""The advisor against the seeds' tables (shipped as data), and measured results taking precedence.

Objective (explicit): `latency` (default) = the shortest request, TTFT + (G-1) / (decode t/s total / N).
At c8 the seeds split: decode and request time favour Cluster TP=2 (231.0 vs 177.5 t/s; 5.4 vs 6.7 s per
request), TTFT favours 2xsolo shuffle by 1.5% (1005 vs 1020 ms)."""

from __future__ import annotations

import json

import pytest

from sparkdeploy.bench.advisor import advise, topology_of
from sparkdeploy.bench.reference import seed_reference
from sparkdeploy.bench.store import save_result
from sparkdeploy.errors import ConfigError
from sparkdeploy.recipes import resolve
from tests.bench.conftest import make_results
from tests.conftest import TWO_NODES


def test_reference_data_is_the_seeds_tables():
    ref = seed_reference()
    cells = {(r.variant, r.concurrency): r.metrics for r in ref.results}
    assert len(ref.results) == 28
    assert cells[("cluster", 1)]["decode_tps"].mean == 69.0
    assert cells[("2xsolo-shuffle", 64)]["decode_tps"].mean == 567.9
    assert cells[("2xsolo-shuffle", 64)]["decode_tps"].std == 48.02
    assert cells[("solo", 64)]["prefill_tps"].mean == 2753
    assert cells[("2xsolo-least-busy", 32)]["ttft_ms"].mean == 3303
    assert ref.setup["vllm"]["max_num_batched_tokens"] == 32768 and ref.pp == 1024 and ref.tg == 128
    assert any("002_" in f for f in ref.source["files"])
    assert ref.winner_as_published["ttft_ms"]["8"] == "Shuffle (-2%)"


def test_c1_cluster():
    a = advise(1, recipe="openai-gpt-oss-120b-bench")
    assert a.topology == "cluster" and a.source["kind"] == "reference"
    assert all(v == "cluster" for v in a.by_objective.values())
    assert any("TP=2" in r and "half the weights" in r for r in a.reasons)


def test_c64_2xsolo_with_the_batching_reason():
    a = advise(64, recipe="openai-gpt-oss-120b-bench")
    assert a.topology == "2xsolo" and a.best.variant == "2xsolo-shuffle"
    assert a.to_json()["recommendation"]["routing"] == "simple-shuffle"
    why = " ".join(a.reasons)
    assert "32768" in why and "= 32 prefills per engine step" in why and "c64 is more than 32" in why
    assert "least-busy" in why  # why not the other routing


def test_c8_depends_on_the_objective_and_says_so():
    latency = advise(8)
    assert latency.objective == "latency" and latency.topology == "cluster"
    assert advise(8, objective="decode").topology == "cluster"
    ttft = advise(8, objective="ttft")
    assert ttft.topology == "2xsolo"
    assert latency.by_objective["ttft"] == "2xsolo-shuffle"
    assert any("other objectives choose differently" in r and "ttft -> Shuffle" in r for r in latency.reasons)


def test_between_and_beyond_measured_levels():
    a = advise(12)
    assert "interpolated between c8 and c16" in " ".join(a.notes)
    b = advise(200)
    assert b.topology == "2xsolo" and "beyond the measured range" in " ".join(b.notes)


def test_measured_results_take_precedence(tmp_path):
    d = tmp_path / "measured"
    # a measured world where solo wins everything at c64
    scale = {("solo", 64, "decode_tps"): 10.0, ("solo", 64, "ttft_ms"): 0.01, ("solo", 64, "prefill_tps"): 10.0}
    for r in make_results(scale=scale):
        save_result(r, d)
    a = advise(64, recipe="openai-gpt-oss-120b-bench", results_dirs=[str(d)])
    assert a.source["kind"] == "measured" and a.source["simulated"] is True
    assert a.topology == "solo"
    # results of another recipe do not count: back to the reference, saying why
    b = advise(64, recipe="qwen3-coder-30b-int4", results_dirs=[str(d)])
    assert b.source["kind"] == "reference"
    assert any(
        f"{d} holds no results of qwen3-coder-30b-int4 (it holds openai-gpt-oss-120b-bench)" in n for n in b.notes
    )


def test_one_measured_topology_falls_back_to_the_seeds_and_says_so(tmp_path):
    d = tmp_path / "measured"
    for r in make_results():
        if r.variant == "cluster":
            save_result(r, d)
    a = advise(8, recipe="openai-gpt-oss-120b-bench", results_dirs=[str(d)])
    assert a.source["kind"] == "reference"
    assert any(
        "using the seeds' measurements" in n and "measured on one topology only (Cluster TP=2)" in n for n in a.notes
    ), a.notes


@pytest.mark.parametrize(
    "recipe,refused",
    [("llama-3.3-70b-instruct", {"solo", "2xsolo"}), ("qwen3.5-397b-int4-autoround", {"solo", "2xsolo"})],
)
def test_advise_recommends_only_what_up_accepts_for_the_recipe(recipe, refused, cli):
    for n in (1, 8, 64, 256):
        a = advise(n, recipe=recipe)
        ranked = {topology_of(e.variant) for e in a.ranking}
        assert not ranked & refused, (n, ranked)
        assert a.topology == "cluster"
        assert any("not ranked, `up` refuses them" in note and "2xsolo:" in note for note in a.notes), a.notes
    # the command it prints is one `up` accepts (resolve is what `up` asks)
    code, out, err = cli("advise", "-c", "64", "-r", recipe, "--json")
    assert code == 0, err
    assert json.loads(out)["command"] == f"sparkdeploy up --recipe {recipe} --topology cluster"
    assert resolve(recipe, "cluster").topology == "cluster"
    with pytest.raises(ConfigError):
        resolve(recipe, "2xsolo")


def test_advise_an_unknown_recipe_is_refused_like_up_refuses_it():
    with pytest.raises(ConfigError, match="no such recipe"):
        advise(8, recipe="no-such-recipe")


def test_advise_cli_json(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./bench-results here
    code, out, err = cli("advise", "--concurrency", "64", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["recommendation"]["topology"] == "2xsolo" and data["objective"] == "latency"
    assert data["source"]["kind"] == "reference" and data["ranking"][0]["variant"] == "2xsolo-shuffle"
    code, out, err = cli("advise", "-c", "8", "--objective", "ttft")
    assert code == 0 and out.startswith("recommended: 2xsolo")
    code, out, err = cli("advise", "-c", "0")
    assert code == 2


def test_advise_leaves_out_what_the_inventory_cannot_run(write_inventory):
    one = {"cluster": dict(TWO_NODES["cluster"]), "nodes": [dict(TWO_NODES["nodes"][0])]}
    inv = str(write_inventory(one))
    a = advise(64, recipe="openai-gpt-oss-120b-bench", inventory=inv)
    assert a.topology == "solo" and {topology_of(e.variant) for e in a.ranking} == {"solo"}
    assert any("2xsolo: needs at least 2 nodes, the inventory has 1" in n for n in a.notes), a.notes
    assert (
        a.to_json()["command"] == f"sparkdeploy up --recipe openai-gpt-oss-120b-bench --topology solo --inventory {inv}"
    )
