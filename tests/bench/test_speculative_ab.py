"""`bench --prompts FILE --speculative off,...` (issue 39, item 5): the owner's prompts against each setting, the
report and the recommendation per concurrency band, the winner written as the recipe's override. Fast: the real
simulator (vllm-sim from the checkout) on localhost stands in for each deployed setting; the lab test
(tests/bench/test_speculative_ab_lab.py) runs the same A/B end to end through `up`."""

from __future__ import annotations

import json
import os
import sys

import pytest
import yaml

from sparkdeploy.bench import speculative_ab as ab
from sparkdeploy.bench.benchy import Endpoint
from sparkdeploy.errors import ConfigError
from sparkdeploy.recipes import recipe as recipes
from tests.bench.conftest import LAUNCHER_DIR, SIM_DIR, _start, _stop, free_port

CODE = (SIM_DIR / "vllm_sim" / "engine.py").read_text()[:4000]
PROSE = (SIM_DIR / "vllm_sim" / "data" / "corpus.txt").read_text()[:4000]


def write_prompts(tmp_path, texts, max_tokens=32):
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": t}], "max_tokens": max_tokens}) + "\n" for t in texts
        )
    )
    return path


def test_settings_parse_and_off_comes_first():
    got = ab.parse_settings("eagle3:3,ngram,off")
    assert [s.text for s in got] == ["off", "eagle3:3", "ngram"]
    assert [s.text for s in ab.parse_settings("ngram:4")] == ["off", "ngram:4"]  # every ratio is to off
    with pytest.raises(ConfigError) as exc:
        ab.parse_settings("off,eagle3:0,Bad Name,ngram:4,ngram:4")
    lines = [str(p) for p in exc.value.problems]
    assert len(lines) == 3 and all("--speculative" in line for line in lines), lines


def test_setting_to_sets_keeps_the_recipes_draft_or_replaces_it():
    base = {"method": "eagle3", "model": "nvidia/gpt-oss-120b-Eagle3-long-context", "num_speculative_tokens": 5}
    assert ab.Setting("off", None, None).sets(base) == ("speculative=null",)
    assert ab.Setting("eagle3:3", "eagle3", 3).sets(base) == ("speculative.num_speculative_tokens=3",)
    assert ab.Setting("ngram:4", "ngram", 4).sets(base) == (
        'speculative={"method":"ngram","num_speculative_tokens":4}',
    )
    r = recipes.resolve("openai-gpt-oss-120b-eagle3", sets=ab.Setting("ngram:4", "ngram", 4).sets(base)).recipe
    assert r.speculative.method == "ngram" and r.speculative.model is None


def test_bad_prompts_are_one_line_each(tmp_path):
    path = tmp_path / "p.jsonl"
    good = {"messages": [{"role": "user", "content": "hi"}]}
    lines = [json.dumps(good), "not json", '{"messages": "x"}', json.dumps({**good, "max_tokens": 0})]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as exc:
        ab.load_prompts(path)
    lines = [str(p) for p in exc.value.problems]
    assert len(lines) == 3
    assert f"{path}:2" in lines[0] and f"{path}:3" in lines[1] and "max_tokens" in lines[2], lines


@pytest.fixture
def sims(tmp_path):
    """Start vllm-sim with a setting's --speculative-config (what `up` would deploy); stop them all at the end."""
    procs = []

    def start(setting: ab.Setting) -> Endpoint:
        port = free_port()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SIM_DIR), str(LAUNCHER_DIR)]), VLLM_SIM_TIME_SCALE="1.0")
        args = [sys.executable, "-m", "vllm_sim", "serve", "openai/gpt-oss-120b", "--port", str(port)]
        args += ["--max-model-len", "8192", "--max-num-seqs", "16"]
        if setting.method:
            config = {"method": setting.method, "num_speculative_tokens": setting.tokens or 4}
            if setting.method == "eagle3":
                config["model"] = "nvidia/gpt-oss-120b-Eagle3-long-context"
            args += ["--speculative-config", json.dumps(config)]
        log = tmp_path / f"sim-{setting.text.replace(':', '-')}.log"
        procs.append(_start(args, env, log, f"http://127.0.0.1:{port}/health"))
        return Endpoint(f"http://127.0.0.1:{port}/v1", "openai/gpt-oss-120b", metadata={"simulated": True})

    yield start
    for p in procs:
        _stop(p)


def test_the_ab_on_repetitive_code_recommends_speculation_and_reports_acceptance(tmp_path, sims):
    prompts = ab.load_prompts(write_prompts(tmp_path, [CODE, CODE[200:], CODE[400:]]))
    settings = ab.parse_settings("off,ngram:4,eagle3:3")
    result = ab.run_ab("openai-gpt-oss-120b-eagle3", "solo", settings, [1, 4], prompts, sims, timeout_s=120)
    assert not result.failed
    for s in ("off", "ngram:4", "eagle3:3"):
        for c in (1, 4):
            level = result.rows[s][c]
            assert level.failed == 0 and level.requests == max(3, c) and level.decode_tps > 0
            assert level.ttft_p50_s is not None
    assert result.rows["off"][1].spec is None  # no speculation: no counters
    ngram = result.rows["ngram:4"][1].spec
    assert ngram is not None and ngram.acceptance_rate > 0.3 and ngram.tokens_per_step > 1.5
    assert result.ratio("ngram:4", 1) > 1.1  # SIMULATED: accepted drafts on code
    bands = result.recommend()
    assert bands and bands[0].setting != "off" and bands[0].levels[0] == 1
    data = result.to_json()
    assert data["results"]["ngram:4"]["1"]["speculative"]["acceptance_rate"] > 0.3
    assert data["timing"]["own_s"] >= 0 and data["timing"]["runs_s"] > 0


def test_prose_gives_ngram_nothing_to_accept(tmp_path, sims):
    prompts = ab.load_prompts(write_prompts(tmp_path, [PROSE]))
    result = ab.run_ab("r", "solo", ab.parse_settings("off,ngram:4"), [1], prompts, sims, timeout_s=120)
    spec = result.rows["ngram:4"][1].spec
    assert spec is not None and (spec.acceptance_rate or 0) < 0.1
    assert result.recommend()[0].setting == "off"


def test_a_refused_setting_is_reported_and_the_others_run(tmp_path):
    def deploy(s):
        raise ConfigError([recipes.Problem("recipes/x.yaml", "speculative.method", "nope", "fix")])

    prompts = ab.load_prompts(write_prompts(tmp_path, ["hi"]))
    result = ab.run_ab("r", "solo", ab.parse_settings("off,lookahead:2"), [1], prompts, deploy)
    assert set(result.failed) == {"off", "lookahead:2"} and "speculative.method" in result.failed["lookahead:2"]


def test_the_recommendation_per_band():
    r = ab.ABResult("r", "solo", ab.parse_settings("off,ngram:4"), [1, 4, 16, 64])
    figures = {"off": [10, 30, 80, 200], "ngram:4": [15, 40, 81, 150]}
    for s, tps in figures.items():
        r.rows[s] = {c: ab.LevelResult(c, c, 0, t, 0.1, 0.1, 1.0) for c, t in zip(r.levels, tps, strict=True)}
    bands = r.recommend()
    assert [(b.setting, b.levels) for b in bands] == [("ngram:4", [1, 4]), ("off", [16, 64])]  # 81/80: alike
    assert bands[0].ratio == pytest.approx((1.5 + 40 / 30) / 2)


def test_the_winner_is_written_as_the_recipes_override(tmp_path, cli):
    spec = ab.winner_spec("openai-gpt-oss-120b-eagle3", "solo", ab.Setting("eagle3:3", "eagle3", 3))
    assert spec == {
        "method": "eagle3",
        "model": "nvidia/gpt-oss-120b-Eagle3-long-context",
        "num_speculative_tokens": 3,
        "weights_gb": 2,
        "architecture": {"attention_heads": 64, "kv_heads": 8, "layers": 1, "head_dim": 64},
    }
    path = ab.write_recipe(
        recipes.find_recipe("openai-gpt-oss-120b-eagle3"), "solo", spec, tmp_path, "chosen by a test"
    )
    text = path.read_text()
    assert text.startswith("# chosen by a test\n")
    assert yaml.safe_load(text)["overrides"]["solo"]["speculative"]["num_speculative_tokens"] == 3
    r = recipes.resolve("openai-gpt-oss-120b-eagle3", "solo", recipes_dir=str(tmp_path)).recipe
    assert r.speculative.num_speculative_tokens == 3  # the written recipe wins over the shipped one
    off = ab.write_recipe(recipes.find_recipe("qwen3-coder-30b-ngram"), "solo", None, tmp_path, "off")
    assert recipes.resolve(str(off), "solo").recipe.speculative is None
    code, _out, err = cli("bench", "--speculative", "off,ngram:4")  # no --prompts
    assert code == 2 and "--prompts FILE" in err and "Traceback" not in err


def test_advise_knows_speculation_helps_low_and_can_hurt_high():
    from sparkdeploy.bench.advisor import advise

    low = advise(1, recipe="openai-gpt-oss-120b-eagle3")
    high = advise(64, recipe="openai-gpt-oss-120b-eagle3")
    (say_low,) = [n for n in low.notes if "speculatively" in n]
    (say_high,) = [n for n in high.notes if "speculatively" in n]
    assert "at c1 it should help" in say_low and "--speculative off,eagle3:5 --concurrency 1" in say_low
    assert "at c64 it can hurt" in say_high and "speculative=null" in say_high
    plain = advise(2, recipe="openai-gpt-oss-120b")
    assert any("try sparkdeploy bench" in n and "off,ngram:4" in n for n in plain.notes)
    assert not any("speculative" in n for n in advise(64, recipe="openai-gpt-oss-120b").notes)
