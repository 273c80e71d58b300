"""A recipe's `speculative:` (issue 39): rendered as vLLM's --speculative-config JSON, checked against what the
pinned vLLM 0.32.0 accepts (images/vllm-node/vllm-speculative-0.32.0.json, dumped from its sources by
scripts/dump_vllm_speculative.py), refused in one line where the engine, the model or the topology cannot."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from sparkdeploy.errors import ConfigError
from sparkdeploy.images.definitions import load_definition
from sparkdeploy.images.vllm_cli import check_args
from sparkdeploy.recipes import recipe as recipes
from sparkdeploy.recipes import speculative
from sparkdeploy.recipes.vllm_args import Distributed, serve_args
from tests.conftest import REPO
from tests.support.vllm_venv import need_vllm_python

for _p in (str(REPO / "images" / "vllm-sim"), str(REPO / "images" / "launcher")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

SPECULATIVE = {
    "openai-gpt-oss-120b-eagle3": "eagle3",
    "gemma-4-26b-a4b-mtp": "mtp",
    "qwen3-coder-30b-ngram": "ngram",
}


def argv(name: str, sets: tuple[str, ...] = (), topology: str | None = None, tp: int = 1) -> list[str]:
    resolved = recipes.resolve(name, topology, sets=sets)
    return serve_args(resolved, load_definition(resolved.recipe.image), 8000, Distributed(tensor_parallel=tp))


def spec_json(args: list[str]) -> dict:
    return json.loads(args[args.index("--speculative-config") + 1])


def refusal(name: str, *sets: str, topology: str | None = None, tp: int = 1) -> str:
    with pytest.raises(ConfigError) as exc:
        argv(name, sets, topology, tp)
    lines = [str(p) for p in exc.value.problems]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    return lines[0]


@pytest.mark.parametrize("name", sorted(SPECULATIVE))
def test_shipped_recipes_render_a_config_the_pinned_vllm_and_the_simulator_accept(name):
    from vllm_sim.flags import parse_serve_args

    args = argv(name)
    config = spec_json(args)
    record = speculative.engine_record("0.32.0")
    assert record is not None
    assert config["method"] == SPECULATIVE[name] and config["method"] in record["methods"]
    assert set(config) <= set(record["options"]), config
    assert args.count("--speculative-config") == 1
    check_args(args, load_definition("vllm-node"), name)
    ns = parse_serve_args(args)
    assert json.loads(json.dumps(ns.speculative_config)) == config or json.loads(ns.speculative_config) == config


def test_each_recipe_says_its_source():
    for name in SPECULATIVE:
        text = recipes.find_recipe(name).read_text()
        assert "Sources:" in text and ("github.com" in text or "docs.vllm.ai" in text), name


def test_eagle3_carries_draft_model_and_revision():
    config = spec_json(argv("openai-gpt-oss-120b-eagle3", ("speculative.revision=0123abc",)))
    assert config == {
        "method": "eagle3",
        "model": "nvidia/gpt-oss-120b-Eagle3-long-context",
        "revision": "0123abc",
        "num_speculative_tokens": 5,
    }


def test_no_speculative_renders_no_flag():
    assert "--speculative-config" not in argv("openai-gpt-oss-120b-eagle3", ("speculative=null",))
    assert "--speculative-config" not in argv("qwen3-coder-30b")


def test_unknown_method_is_refused_with_the_engines_methods():
    line = refusal("qwen3-coder-30b-ngram", "speculative.method=lookahead")
    assert "speculative.method" in line and "'lookahead' is not a speculative method of vLLM 0.32.0" in line
    assert "eagle3" in line and "ngram" in line


def test_unknown_option_is_refused():
    line = refusal("qwen3-coder-30b-ngram", "speculative.options.prompt_lookup=3")
    assert "speculative.options.prompt_lookup" in line and "SpeculativeConfig" in line
    line = refusal("qwen3-coder-30b-ngram", "speculative.options.tensor_parallel_size=1")
    assert "draft_tensor_parallel_size" in line


def test_a_draft_method_without_a_draft_and_ngram_with_one_are_refused():
    assert "drafts with a separate model" in refusal("openai-gpt-oss-120b-eagle3", "speculative.model=null")
    assert "no draft model" in refusal("qwen3-coder-30b-ngram", "speculative.model=org/draft")


def test_mtp_on_a_model_without_mtp_layers_is_refused():
    line = refusal("qwen3-coder-30b-ngram", "speculative.method=mtp")
    assert "mtp_layers" in line and "Qwen/Qwen3-Coder-30B-A3B-Instruct" in line
    config = spec_json(
        argv("qwen3-coder-30b-ngram", ("speculative.method=mtp", "architecture.mtp_layers=1", "speculative.options={}"))
    )
    assert config["method"] == "mtp"


def test_draft_tensor_parallel_must_be_one_or_the_engines():
    line = refusal("qwen3-coder-30b-ngram", "speculative.options.draft_tensor_parallel_size=2")
    assert "allows only 1 or the target's tensor parallel size" in line
    args = argv("qwen3-coder-30b-ngram", ("speculative.options.draft_tensor_parallel_size=2",), tp=2)
    assert spec_json(args)["draft_tensor_parallel_size"] == 2


def test_an_engine_without_a_speculative_record_is_refused():
    line = refusal("qwen3-coder-30b-ngram", "image=vllm-node-mxfp4")
    assert "vllm-node-mxfp4" in line and "no record of its speculative methods" in line


def test_the_config_is_said_once():
    line = refusal("qwen3-coder-30b-ngram", 'vllm.extra_args=["--speculative-config", "{}"]')
    assert "vllm.extra_args" in line


def test_bad_values_are_refused_by_the_schema(tmp_path):
    data = yaml.safe_load(recipes.find_recipe("qwen3-coder-30b-ngram").read_text())
    data["speculative"]["num_speculative_tokens"] = 0
    data["speculative"]["revision"] = "main; rm -rf /"
    path = tmp_path / "qwen3-coder-30b-ngram.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as exc:
        recipes.resolve(str(path))
    text = "\n".join(str(p) for p in exc.value.problems)
    assert "speculative.num_speculative_tokens" in text and "speculative.revision" in text


def test_lint_names_the_recipe_field_in_one_line(tmp_path, cli):
    data = yaml.safe_load(recipes.find_recipe("qwen3-coder-30b-ngram").read_text())
    data["name"] = "mine"
    data["speculative"]["method"] = "lookahead"
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(data))
    code, out, err = cli("recipes", "lint", "--recipes-dir", str(tmp_path))
    assert code == 1, out + err
    assert "Traceback" not in err
    assert any("mine" in line and "speculative.method" in line for line in out.splitlines()), out


def test_the_record_matches_vllm_0_32_0s_sources():
    """scripts/dump_vllm_speculative.py --check against the pinned vLLM's own files (needs its CPU venv)."""
    python = need_vllm_python()
    site = next(python.parent.parent.glob("lib/python3*/site-packages/vllm"))
    out = REPO / "images" / "vllm-node" / "vllm-speculative-0.32.0.json"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "dump_vllm_speculative.py"),
            "--vllm",
            str(site),
            "--expect-version",
            "0.32.0",
            "--out",
            str(out),
            "--check",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_record_names_the_methods_and_metrics_vllm_has():
    record = speculative.engine_record("0.32.0")
    assert record is not None
    assert {"eagle3", "mtp", "ngram", "draft_model", "suffix"} <= set(record["methods"])
    assert "qwen3_next_mtp" in record["mtp_aliases"]
    assert speculative.metric_names() == (
        "vllm:spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "vllm:spec_decode_num_draft_tokens",
        "vllm:spec_decode_num_drafts",
    )


# -- the draft is part of the model: pulled with it, checked with it, counted in the one memory budget ----------


def test_the_draft_is_pulled_and_checked_with_the_model():
    from sparkdeploy.models.ops import ModelRef, recipe_refs

    r = recipes.resolve("openai-gpt-oss-120b-eagle3", sets=("speculative.revision=v1",)).recipe
    assert recipe_refs(r.model, r.speculative.model, r.speculative.revision) == [
        ModelRef("openai/gpt-oss-120b"),
        ModelRef("nvidia/gpt-oss-120b-Eagle3-long-context", "v1"),
    ]
    assert recipe_refs("openai/gpt-oss-120b", None, None) == [ModelRef("openai/gpt-oss-120b")]  # ngram, mtp
    assert recipe_refs("org/m", "org/m", None) == [ModelRef("org/m")]  # the model itself: once
    assert recipe_refs("org/m", "/models/draft", None) == [ModelRef("org/m")]  # a local path: nothing to pull
    with pytest.raises(ConfigError):
        recipe_refs("org/m", "org/draft", "bad revision")


def test_up_and_models_pull_name_the_draft(inventory_file):
    from sparkdeploy.cli.models_cmd import resolve_target
    from sparkdeploy.models import up_check
    from sparkdeploy.models.ops import ModelRef

    inv = inventory_file
    refs, dep, _ = resolve_target("openai-gpt-oss-120b-eagle3", None, str(inv), None)
    assert refs == [ModelRef("openai/gpt-oss-120b"), ModelRef("nvidia/gpt-oss-120b-Eagle3-long-context")]
    assert up_check.refs_of(dep) == refs
    refs, _, _ = resolve_target("qwen3-coder-30b-ngram", "abc123", str(inv), None)
    assert refs == [ModelRef("Qwen/Qwen3-Coder-30B-A3B-Instruct", "abc123")]


def test_the_budget_counts_the_drafts_weights_and_kv():
    from sparkdeploy.recipes import budget

    with_draft = recipes.resolve("openai-gpt-oss-120b-eagle3").recipe
    without = recipes.resolve("openai-gpt-oss-120b-eagle3", sets=("speculative=null",)).recipe
    a, b = budget.nominal(with_draft, 1), budget.nominal(without, 1)
    # the draft: 2 GB of weights; KV: 2 x 1 layer x 8 KV heads x 64 x 1 byte (fp8) = 1024 B a token
    assert a.weights - b.weights == 2_000_000_000 == a.draft_weights
    assert a.kv_per_token - b.kv_per_token == 1024 == a.draft_kv_per_token
    assert any("speculative draft nvidia/gpt-oss-120b-Eagle3-long-context" in n for n in a.notes)
    # a draft TP of 1 on a TP=2 engine: the whole draft on each node
    two = recipes.resolve("openai-gpt-oss-120b-eagle3", sets=("speculative.options.draft_tensor_parallel_size=1",))
    assert budget.nominal(two.recipe, 2).draft_weights == 2_000_000_000
    assert budget.nominal(with_draft, 2).draft_weights == 1_000_000_000


def test_the_budget_says_what_it_cannot_count_and_counts_mtp_layers():
    from sparkdeploy.recipes import budget

    gemma = budget.nominal(recipes.resolve("gemma-4-26b-a4b-mtp").recipe, 1)
    assert gemma.draft_weights == 0
    assert any("has no weights_gb" in n for n in gemma.notes) and any("has no architecture" in n for n in gemma.notes)
    mtp = recipes.resolve(
        "qwen3-coder-30b-ngram", sets=("speculative.method=mtp", "speculative.options={}", "architecture.mtp_layers=1")
    ).recipe
    # one MTP layer of the model's shape: 2 x 1 x 4 KV heads x 128 x 1 byte (fp8) = 1024 B a token
    assert budget.nominal(mtp, 1).draft_kv_per_token == 1024


def test_fit_shows_the_draft(cli):
    code, out, _ = cli("recipes", "fit", "openai-gpt-oss-120b-eagle3")
    assert code == 0
    assert "the speculative draft nvidia/gpt-oss-120b-Eagle3-long-context: 1.9 GiB of weights" in out


# -- measured acceptance: the engine's vllm:spec_decode_* counters, in top (and bench) ---------------------------


def sim_engine(spec: dict | None, model: str = "openai/gpt-oss-120b"):
    from vllm_sim.config import from_namespace
    from vllm_sim.engine import SimEngine
    from vllm_sim.flags import parse_serve_args

    args = [model, "--max-model-len", "8192"] + (["--speculative-config", json.dumps(spec)] if spec else [])
    return SimEngine(from_namespace(parse_serve_args(args), env={}))


CODE = (REPO / "images" / "vllm-sim" / "vllm_sim" / "engine.py").read_text()[:6000]
PROSE = (REPO / "images" / "vllm-sim" / "vllm_sim" / "data" / "corpus.txt").read_text()[:6000]


def run_sim(spec: dict | None, text: str, concurrency: int = 1, tokens: int = 48):
    """Decode tokens/s (simulated time) and the engine's counters."""
    from sparklaunch.protocol import GenRequest

    engine = sim_engine(spec)
    for i in range(concurrency):
        engine.add_request(GenRequest(f"r{i}", engine.tokenizer.encode(text), tokens, ignore_eos=True))
    seconds, emitted = 0.0, 0
    while engine.has_unfinished():
        deltas, s = engine.step()
        seconds, emitted = seconds + s, emitted + len(deltas)
    return emitted / seconds, engine.speculation


def test_the_simulator_accepts_drafts_by_the_prompts_content():
    """SIMULATED (docs/calibration.md): repetitive code is drafted and accepted far more than prose by n-gram
    lookup; a trained draft (eagle3) accepts prose too; no speculation reports no counters."""
    ngram, eagle = (
        {"method": "ngram", "num_speculative_tokens": 4},
        {"method": "eagle3", "model": "d", "num_speculative_tokens": 3},
    )
    base_code, none = run_sim(None, CODE)
    assert none is None
    code, spec = run_sim(ngram, CODE)
    prose, spec_prose = run_sim(ngram, PROSE)
    rate = spec.accepted / spec.draft_tokens
    assert rate > 0.4 and spec_prose.accepted / max(spec_prose.draft_tokens, 1e-9) < 0.1
    assert code > 1.3 * base_code  # accepted drafts: more tokens a step
    base_prose, _ = run_sim(None, PROSE)
    assert abs(prose - base_prose) / base_prose < 0.05  # no match, no draft: about the plain speed
    _, trained = run_sim(eagle, PROSE)
    assert 0.25 < trained.accepted / trained.draft_tokens < 0.5
    assert len(trained.per_pos) == 3 and trained.per_pos[0] > trained.per_pos[1] > trained.per_pos[2]


def test_the_gain_shrinks_with_concurrency_in_the_simulator():
    ngram = {"method": "ngram", "num_speculative_tokens": 4}
    gain = {c: run_sim(ngram, CODE, c)[0] / run_sim(None, CODE, c)[0] for c in (1, 64)}
    assert gain[1] > gain[64] > 1.0, gain


def test_metrics_carry_vllms_names_and_top_shows_acceptance():
    from sparkdeploy.cli.top_cmd import render_table
    from sparkdeploy.daytwo import top
    from sparklaunch.metrics import Counters, render
    from sparklaunch.protocol import EngineStats

    _, spec = run_sim({"method": "ngram", "num_speculative_tokens": 4}, CODE)
    text = render("m", EngineStats(), Counters(), simulated=True, spec_decode=spec.counters())
    m = top.parse_metrics(text)
    for name in speculative.metric_names():  # vLLM 0.32's names, from its sources
        assert name + "_total" in m, name
    assert len(m["vllm:spec_decode_num_accepted_tokens_per_pos_total"]) == 4
    counters = speculative.read_counters(m)
    assert counters is not None and counters.acceptance_rate == pytest.approx(spec.accepted / spec.draft_tokens)
    assert counters.tokens_per_step == pytest.approx(1 + spec.accepted / spec.drafts)

    target = top.Target("spark1", "sparkdeploy-vllm", "engine", "http://x/metrics")
    mon = top.Monitor([target], window_s=60)
    old = speculative.SpecCounters(10, 40, 20)
    new = speculative.SpecCounters(20, 80, 50)  # 30 of 40 accepted in the window, 1 + 30/10 tokens a step
    mon.history[target].extend([top.Sample(1.0, running=1, spec=old), top.Sample(3.0, running=1, spec=new)])
    row = mon.snapshot()["engines"][0]
    assert row["spec_decode"]["acceptance_rate"] == 0.75 and row["spec_decode"]["accepted_tokens_per_step"] == 4.0
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(render_table(mon.snapshot(), "t"))
    out = console.export_text()
    assert "draft accepted" in out and "75%" in out and "4.00" in out
    assert speculative.describe_acceptance(new.since(old)) == "75% accepted, 4.00 tokens/step"
    assert speculative.read_counters(top.parse_metrics(render("m", EngineStats(), Counters()))) is None


def test_sglang_flags_are_flags_of_the_pinned_sglang():
    """For issue 38's engine interface: every flag and the algorithm name exist in SGLang 0.5.23's own parser."""
    fixture = json.loads((REPO / "images" / "engine-args" / "sglang-0.5.23-args.json").read_text())
    algorithms = fixture["value_sets"]["--speculative-algorithm"]["values"]
    for name in SPECULATIVE:
        spec = recipes.resolve(name).recipe.speculative
        flags = speculative.sglang_flags(spec)
        assert [f for f in flags if f.startswith("--") and f not in fixture["flags"]] == []
        assert flags[flags.index("--speculative-algorithm") + 1] in algorithms
    eagle = speculative.sglang_flags(recipes.resolve("openai-gpt-oss-120b-eagle3").recipe.speculative)
    assert eagle == [
        "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", "nvidia/gpt-oss-120b-Eagle3-long-context",
        "--speculative-num-steps", "5", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "6",
    ]  # fmt: skip
    with pytest.raises(ConfigError):
        speculative.sglang_flags(
            recipes.resolve("qwen3-coder-30b-ngram", sets=("speculative.method=suffix",)).recipe.speculative
        )


def test_preflight_and_doctor_disk_count_the_drafts_download():
    """The hf_cache room (doctor's disk check, which preflight runs) for a model not cached yet: its weights and
    the draft's, both pulled by `models pull RECIPE`."""
    from sparkdeploy.deploy import preflight
    from sparkdeploy.recipes.recipe import SpeculativeSettings
    from tests.deploy.deploy_helpers import empty_facts, make_deployment

    dep = make_deployment("solo")  # 65 GB of weights, not cached
    facts = {n.name: empty_facts(n.name) for n in dep.inventory.nodes}
    facts["spark1"].disk_free_mb["hf_cache"] = 68 * 1024  # the weights + 2 GiB of room, not a 5 GB draft
    failed = lambda: [(c.node, c.check) for c in preflight.run(dep, facts) if not c.ok]  # noqa: E731
    assert failed() == []
    draft = SpeculativeSettings(method="eagle3", model="org/draft", num_speculative_tokens=3, weights_gb=5)
    dep.recipe.recipe = dep.recipe.recipe.model_copy(update={"speculative": draft})
    assert failed() == [("spark1", "disk")]


def test_top_and_bench_read_sglangs_own_acceptance_gauges():
    """SGLang 0.5.23 reports acceptance as gauges of its latest verify step (sglang:spec_accept_rate and
    sglang:spec_accept_length, in its metrics fixture), not vLLM's counters: top's columns and bench's figures read
    them by the engine's own names (recipes/engines/sglang.py)."""
    from rich.console import Console

    from sparkdeploy.bench.benchy import Endpoint, spec_counters
    from sparkdeploy.cli.top_cmd import render_table
    from sparkdeploy.daytwo import top
    from sparkdeploy.recipes.engines.registered import ENGINES

    fixture = json.loads((REPO / "tests" / "fixtures" / "sglang-0.5.23-metrics.json").read_text())
    kinds = {m["name"]: m["kind"] for m in fixture["metrics"]}
    names = ENGINES["sglang"].metrics
    assert kinds[names.spec_accept_rate] == kinds[names.spec_accept_length] == "Gauge"
    page = (
        "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 2\n"
        "# TYPE sglang:prompt_tokens_total counter\nsglang:prompt_tokens_total 100\n"
        "# TYPE sglang:generation_tokens_total counter\nsglang:generation_tokens_total 50\n"
        f"# TYPE {names.spec_accept_rate} gauge\n{names.spec_accept_rate} 0.6\n"
        f"# TYPE {names.spec_accept_length} gauge\n{names.spec_accept_length} 3.4\n"
    )
    server, url = _serve_metrics(page)
    try:
        target = top.Target("spark1", "sparkdeploy-sglang", "engine", url + "/metrics")
        mon = top.Monitor([target], window_s=60)
        mon.history[target].extend([top.scrape(target), top.scrape(target)])
        spec = mon.snapshot()["engines"][0]["spec_decode"]
        assert spec["acceptance_rate"] == 0.6 and spec["accepted_tokens_per_step"] == 3.4 and spec["gauges"]
        console = Console(width=200, record=True)
        console.print(render_table(mon.snapshot(), "t"))
        out = console.export_text()
        assert "60%" in out and "3.40" in out and "SGLang's draft acceptance: its latest verify step" in out
        got = spec_counters(Endpoint(url + "/v1", "m", None))
        assert got is not None and speculative.describe_acceptance(got) == "60% accepted, 3.40 tokens/step"
        assert speculative.SpecCounters.of(got.as_dict()) == got  # a stored bench result reads back
    finally:
        server.shutdown()
    idle = page.replace(f"{names.spec_accept_rate} 0.6", f"{names.spec_accept_rate} 0").replace(" 3.4\n", " 0\n")
    assert speculative.read_counters(top.parse_metrics(idle), names.spec_accept_rate, names.spec_accept_length) is None


def _serve_metrics(page: str):
    """A real HTTP server on localhost answering /metrics with `page` (the engine's Prometheus text)."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"
