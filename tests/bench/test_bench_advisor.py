"""The advisor against the seeds' tables (shipped as data), and measured results taking precedence.

Objective (explicit): `latency` (default) = the shortest request, TTFT + (G-1) / (decode t/s total / N).
At c8 the seeds split: decode and request time favour Cluster TP=2 (231.0 vs 177.5 t/s; 5.4 vs 6.7 s per
request), TTFT favours 2xsolo shuffle by 1.5% (1005 vs 1020 ms)."""

from __future__ import annotations

import json
import re

import pytest

from sparkdeploy.bench.advisor import advise, render_text, topology_of
from sparkdeploy.bench.seeds import seed_reference
from sparkdeploy.bench.store import save_result
from sparkdeploy.errors import ConfigError
from sparkdeploy.recipes.recipe import resolve
from sparkdeploy.simulated import LABEL
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
    # results of another recipe do not count: the simulator's prediction for its own model, saying why
    b = advise(64, recipe="qwen3-coder-30b-int4", results_dirs=[str(d)])
    assert b.source["kind"] == "predicted" and b.source["simulated"] is True
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


# -- issue 36 item 4: never one model's figures under another's name; sentences checked at every level ------------

SEED_FIGURES = {round(st.mean, 1) for r in seed_reference().results for st in r.metrics.values() if st.mean is not None}


@pytest.mark.parametrize("recipe", ["qwen3-coder-30b-int4", "glm-4.7-flash-int4"])
def test_another_models_advice_is_its_own_simulated_prediction(cli, recipe):
    """`advise -r qwen3-coder-30b-int4` printed gpt-oss-120b's seeds (c64: 19.25 s, 567.9 t/s) under its name. Now:
    the calibrated simulator's prediction for its own model, SIMULATED in the text and the JSON."""
    a = advise(64, recipe=recipe)
    model = resolve(recipe).recipe.model
    assert a.source["kind"] == "predicted" and a.simulated and a.source["model"] == model
    assert model in a.source["description"] and a.source["description"].startswith(LABEL)
    shown = {round(v, 1) for e in a.ranking for v in (e.decode_tps, e.ttft_ms, e.prefill_tps)}
    assert not shown & SEED_FIGURES, shown & SEED_FIGURES  # none of the seeds' figures
    assert all(e.request_s != pytest.approx(19.25, abs=0.01) for e in a.ranking)
    assert any(f"sparkdeploy bench sweep --recipe {recipe}" in n for n in a.notes), a.notes
    text = render_text(a)
    assert text.splitlines()[0].endswith(f"[{LABEL}]") and f"estimates at this load [{LABEL}]:" in text
    code, out, _err = cli("advise", "-c", "64", "-r", recipe, "--json")
    data = json.loads(out)
    assert code == 0 and data["simulated"] is True and data["label"] == LABEL and data["source"]["model"] == model


def test_two_other_models_get_different_figures():
    qwen, glm = (advise(64, recipe=r) for r in ("qwen3-coder-30b-int4", "glm-4.7-flash-int4"))
    assert [e.to_json() for e in qwen.ranking] != [e.to_json() for e in glm.ranking]


def test_gpt_oss_recipes_keep_the_seeds_measurements_of_their_model():
    a = advise(64, recipe="openai-gpt-oss-120b")
    assert a.source["kind"] == "reference" and not a.simulated and a.source["model"] == "openai/gpt-oss-120b"
    assert any("as openai-gpt-oss-120b-bench configures it" in n for n in a.notes), a.notes
    assert LABEL not in render_text(a)


def test_no_figures_says_so_and_how_to_make_them(cli, tmp_path):
    (tmp_path / "mystery.yaml").write_text(
        "name: mystery\ndescription: a model nobody measured\nmodel: org/mystery-7b\nimage: vllm-node\n"
        "topologies: [solo, cluster, 2xsolo]\ndefault_topology: solo\n"
    )
    with pytest.raises(ConfigError) as exc:
        advise(8, recipe="mystery", recipes_dir=str(tmp_path))
    (p,) = exc.value.problems
    assert "no figures for mystery (org/mystery-7b)" in p.message and "no profile of org/mystery-7b" in p.message
    assert "sparkdeploy bench sweep --recipe mystery" in p.fix
    code, out, err = cli("advise", "-c", "8", "-r", "mystery", "--recipes-dir", str(tmp_path))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (out, err)


RATE = r"(\d+(?:\.\d+)?) vs (\d+(?:\.\d+)?) t/s"


def sentence_faults(a) -> list[str]:
    """What a reader would find garbled or contradicted by the figures it quotes."""
    faults = []
    n = a.concurrency
    for r in a.reasons:
        if re.search(r"\ball [012] prompts\b|\b0 tokens at\b|\b1 steps\b", r):
            faults.append(f"wording at c{n}: {r}")
        if re.search(r"\w+ and \w+ \(\d+ engines\) gives\b", r):
            faults.append(f"agreement at c{n}: {r}")
        levels = {int(x) for x in re.findall(r"\bc(\d+)\b", r)}
        if levels - {n}:
            faults.append(f"another level than c{n}: {r}")
        if "starves" in r:
            lo, hi = map(float, re.search(RATE, r).groups())
            if not lo < hi * 0.95:
                faults.append(f"starvation claimed at {lo} vs {hi} t/s: {r}")
        if "hence" in r:
            more, less = map(float, re.search(RATE, r).groups())
            if not more > less:
                faults.append(f"a win claimed at {more} vs {less} t/s: {r}")
    return faults


@pytest.mark.parametrize("gen_tokens", [1, 128])
def test_every_sentence_reads_right_at_every_concurrency(gen_tokens):
    """The c1 text said `(58 vs 58 t/s decode for simple-shuffle here); use simple-shuffle` and `all 1 prompts fit`.
    Every sentence, at each measured level, each side of it and beyond the measured range, for each objective."""
    faults = []
    for n in (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 96, 128, 256, 1000):
        for objective in ("latency", "decode", "ttft", "prefill"):
            a = advise(n, gen_tokens=gen_tokens, recipe="openai-gpt-oss-120b-bench", objective=objective)
            faults += sentence_faults(a)
    assert not faults, faults[:10]


def test_every_sentence_reads_right_for_a_predicted_recipe():
    faults = []
    for n in (1, 2, 3, 8, 9, 33, 64):
        faults += sentence_faults(advise(n, recipe="qwen3-coder-30b-int4"))
    assert not faults, faults


def test_advise_names_the_engine_of_an_sglang_or_llamacpp_recipe():
    """Issue 38: the seeds are vLLM's measurements and the simulator models vLLM: advise says so, naming the
    recipe's engine and version, where it said vLLM alone."""
    a = advise(64, recipe="sglang-gpt-oss-120b")
    assert any("on vLLM" in n and "serves the same model with SGLang 0.5.23" in n for n in a.notes), a.notes
    assert any("serves with SGLang 0.5.23" in r for r in a.reasons if r.startswith("batching")), a.reasons
    for recipe, text in (
        ("sglang-qwen3-coder-next-fp8", "SGLang 0.5.23"),
        ("llamacpp-qwen3-coder-30b", "llama.cpp b11434"),
    ):
        with pytest.raises(ConfigError) as exc:
            advise(64, recipe=recipe)
        assert f"the simulator models vLLM's timing, not {text}'s" in exc.value.problems[0].message
