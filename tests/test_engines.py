"""The engine interface (sparkdeploy/recipes/engines/): every rendered argv of every recipe, topology, backend and
--set variant parses with its engine's own rules; an unknown flag is refused in one line naming the engine and its
version; SGLang's argparse prefix rules are checked against Python's argparse built from the same dump."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from sparkdeploy.errors import ConfigError
from sparkdeploy.recipes.engines.flagcheck import check_argparse, check_llamacpp
from sparkdeploy.recipes.engines.registered import ENGINES, engine_of, metric_names
from sparkdeploy.recipes.recipe import ENGINE_NAMES, resolve
from sparkdeploy.topologies import build_deployment
from tests.test_render import all_deployments, deployment

ROOT = Path(__file__).resolve().parent.parent
SGLANG_DUMP = ROOT / "images" / "engine-args" / "sglang-0.5.23-args.json"
LLAMA_DUMP = ROOT / "images" / "engine-args" / "llama-server-b11434-args.json"
# --set variants per engine: each changes what the engine renders
SETS = {
    "vllm": [(), ("vllm.max_model_len=8192",), ("vllm.max_num_seqs=8", "vllm.enforce_eager=true")],
    "sglang": [
        (),
        ("sglang.context_length=8192", "sglang.max_running_requests=8"),
        ("sglang.kv_cache_dtype=fp8_e4m3", "sglang.chunked_prefill_size=4096"),
        ("sglang.extra_args=[--tp, '1']",),  # a unique prefix of --tp-size: argparse takes it
    ],
    "llamacpp": [(), ("llamacpp.parallel=2", "llamacpp.ctx_size=4096"), ("llamacpp.flash_attn=auto",)],
}


def serving_argv(dep) -> list[list[str]]:
    """Each engine container's argv, read back from its rendered entry script's exec line."""
    import shlex

    out = []
    for nd in dep.nodes:
        for f in nd.files:
            if f.name.endswith(".entry.sh") and f.name.split(".")[0] in ("vllm", "sglang", "llamacpp"):
                line = next(x for x in f.content.splitlines() if x.startswith("exec "))
                out.append(shlex.split(line))
    return out


def test_one_engine_per_name_registered_in_one_place():
    assert tuple(ENGINES) == ENGINE_NAMES == ("vllm", "sglang", "llamacpp")
    for name, engine in ENGINES.items():
        assert engine.name == name
        assert engine.metrics.running and engine.metrics.prompt_tokens


def test_every_recipe_topology_and_set_variant_renders_an_argv_its_engine_parses():
    """build_deployment checks each argv against the engine's dump; this walks every combination (item 4) and
    re-checks the SGLang and llama.cpp lines read back from the rendered scripts."""
    count = dict.fromkeys(ENGINES, 0)
    for recipe, topo, backend in all_deployments():
        engine = engine_of(resolve(recipe).recipe)
        for sets in SETS[engine.name]:
            dep = deployment(topo, backend, recipe=recipe, sets=sets)
            for argv in serving_argv(dep):
                if engine.name == "sglang":
                    assert argv[1:4] == ["python3", "-m", "sglang.launch_server"]
                    check_argparse(argv[4:], SGLANG_DUMP, "SGLang 0.5.23", recipe, "sglang")
                    assert "--mem-fraction-static" in argv and "--enable-metrics" in argv
                    assert not any(a.startswith("--api-key") for a in argv)
                elif engine.name == "llamacpp":
                    assert argv[1] == "llama-server"
                    check_llamacpp(argv[2:], LLAMA_DUMP, "llama.cpp b11434", recipe, "llamacpp")
                    assert "--metrics" in argv and "-hf" not in argv
                count[engine.name] += 1
    assert count["vllm"] > 100 and count["sglang"] >= 12 and count["llamacpp"] >= 12, count


def argparse_oracle() -> argparse.ArgumentParser:
    """Python's own argparse, built from the dump the way SGLang's parser is (allow_abbrev, nargs, choices)."""
    dump = json.loads(SGLANG_DUMP.read_text())
    parser = argparse.ArgumentParser(allow_abbrev=True, add_help=False, exit_on_error=False)
    seen: set[str] = set()
    for flag, info in dump["flags"].items():
        if flag in seen or flag == "-h":
            continue
        names = [flag, *info["aliases"]]
        seen.update(names)
        if not info["takes_value"]:
            parser.add_argument(*names, dest=info["dest"], action="store_true")
        else:
            parser.add_argument(*names, dest=info["dest"], nargs=info["nargs"], choices=info["choices"])
    return parser


@pytest.mark.parametrize(
    "argv",
    [
        ["--tp", "2"],  # a prefix of --tp-size only
        ["--speculative-algo", "EAGLE3"],  # a prefix of --speculative-algorithm
        ["--cuda-graph-max-bs", "16"],  # ambiguous in 0.5.23 (-decode / -prefill)
        ["--no-such-flag"],
        ["--kv-cache-dtype", "fp8_e4m3"],
        ["--kv-cache-dtype", "fp9"],
        ["--port=30000", "--enable-metrics"],
        ["--mem-fraction-static"],  # no value
    ],
)
def test_sglang_check_agrees_with_argparse_itself(argv):
    try:
        argparse_oracle().parse_args(argv)
        oracle_ok = True
    except (argparse.ArgumentError, SystemExit):
        oracle_ok = False
    try:
        check_argparse(argv, SGLANG_DUMP, "SGLang 0.5.23", "r.yaml", "sglang")
        ours_ok = True
    except ConfigError:
        ours_ok = False
    assert ours_ok == oracle_ok, argv


def test_an_ambiguous_sglang_prefix_names_the_candidates():
    with pytest.raises(ConfigError) as exc:
        check_argparse(["--cuda-graph-max-bs", "16"], SGLANG_DUMP, "SGLang 0.5.23", "r.yaml", "sglang")
    text = str(exc.value)
    assert "ambiguous for SGLang 0.5.23" in text and "--cuda-graph-max-bs-decode" in text


@pytest.mark.parametrize(
    "recipe,sets,expect",
    [
        (
            "sglang-gpt-oss-120b",
            ("sglang.extra_args=[--no-such-flag]",),
            "--no-such-flag is not a flag of SGLang 0.5.23",
        ),
        ("llamacpp-gpt-oss-120b", ("llamacpp.extra_args=[--no-such-flag]",), "not a flag of llama.cpp b11434"),
        ("llamacpp-gpt-oss-120b", ("llamacpp.extra_args=[--ubatch-size=256]",), "no --flag=value form"),
        ("llamacpp-gpt-oss-120b", ("llamacpp.extra_args=[-hf, ggml-org/gpt-oss-120b-GGUF]",), "downloads the model"),
        ("openai-gpt-oss-20b", ("vllm.extra_args=[--no-such-flag]",), "is not a flag of image"),
    ],
)
def test_an_unknown_flag_is_refused_in_one_line_naming_the_engine(recipe, sets, expect):
    with pytest.raises(ConfigError) as exc:
        deployment("solo", recipe=recipe, sets=sets)
    lines = str(exc.value).splitlines()
    assert len(lines) == 1 and expect in lines[0], lines


def test_llamacpp_cluster_is_refused_with_the_reason():
    from sparkdeploy.config.inventory import Inventory
    from sparkdeploy.config.secrets import Secrets
    from tests.conftest import TWO_NODES

    resolved = resolve("llamacpp-gpt-oss-120b", "2xsolo", sets=("topologies=[solo, 2xsolo, cluster]",))
    resolved.topology = "cluster"
    with pytest.raises(ConfigError) as exc:
        build_deployment(Inventory.model_validate(TWO_NODES), resolved, Secrets({}, source="t"))
    assert "llama.cpp does not serve cluster: llama.cpp splits a model over nodes only through its RPC" in str(
        exc.value
    )


def test_sglang_cluster_with_ray_is_refused_with_the_fix():
    with pytest.raises(ConfigError) as exc:
        deployment("cluster", "ray", recipe="sglang-gpt-oss-120b")
    assert "SGLang runs multi-node only with its own launcher, not ray" in str(exc.value)
    assert "cluster_backend: native" in str(exc.value)


def test_sglang_cluster_dist_init_addr_is_the_heads_fabric_ip_on_every_rank():
    dep = deployment("cluster", "native", recipe="sglang-gpt-oss-120b")
    lines = serving_argv(dep)
    assert len(lines) == 2
    head_fabric = dep.inventory.head.fabric_address
    for rank, argv in enumerate(lines):
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--dist-init-addr") + 1].startswith(head_fabric + ":")
        assert argv[argv.index("--tp-size") + 1] == "2"
    heads = [c for nd in dep.nodes for c in nd.containers if c.role == "head"]
    workers = [c for nd in dep.nodes for c in nd.containers if c.role == "worker"]
    assert heads[0].health_port and workers[0].health_port is None  # health read on the head


def test_a_recipe_with_engine_llamacpp_needs_its_gguf():
    with pytest.raises(ConfigError) as exc:
        resolve("llamacpp-gpt-oss-120b", sets=("llamacpp=null",))
    assert "engine llamacpp needs the GGUF file" in str(exc.value)


def test_top_reads_each_engines_metric_names():
    assert metric_names({"sglang:num_running_reqs", "sglang:prompt_tokens_total"}).kv_usage == "sglang:token_usage"
    assert metric_names({"llamacpp:requests_processing"}).generation_tokens == "llamacpp:tokens_predicted_total"
    assert metric_names({"vllm:num_requests_running"}).running == "vllm:num_requests_running"


def test_the_budget_reads_the_engines_reservation():
    from sparkdeploy.recipes.budget import nominal

    sg = resolve("sglang-gpt-oss-120b", sets=("sglang.mem_fraction_static=0.2",)).recipe
    budget = nominal(sg, 1)
    assert budget.util == 0.2 and not budget.starts
    assert budget.suggestion.startswith("raise sglang.mem_fraction_static to")
    lc = resolve("llamacpp-qwen3-coder-30b").recipe
    fit = nominal(lc, 1)  # -c is the total: 4 slots of 16384; no share, what it needs
    assert (fit.max_model_len, fit.max_num_seqs, fit.fits) == (16384, 4, True) and 0.05 < fit.util < 0.5


def test_parsers_and_model_files_per_engine():
    sg = resolve("sglang-gpt-oss-120b").recipe
    assert engine_of(sg).parsers(sg).tool == "gpt-oss"
    vl = resolve("openai-gpt-oss-120b").recipe
    assert engine_of(vl).parsers(vl).reasoning == "openai_gptoss"
    lc = resolve("llamacpp-gpt-oss-120b").recipe
    assert engine_of(lc).model_files(lc) == ["gpt-oss-120b-mxfp4-*.gguf"]


def test_models_pull_takes_one_quant_of_a_gguf_repo_in_the_proxy_image():
    """`models pull RECIPE` of a llama.cpp recipe downloads only its GGUF files (`include`), and runs the hub client
    in the LiteLLM proxy's image: llama.cpp's has no Python."""
    from sparkdeploy.images.definitions import load_definition
    from sparkdeploy.models.ops import hub_image_tag, model_ref, recipe_ref

    dep = deployment("solo", recipe="llamacpp-gpt-oss-120b")
    ref = recipe_ref(dep)
    assert (ref.repo, ref.include) == ("ggml-org/gpt-oss-120b-GGUF", ("gpt-oss-120b-mxfp4-*.gguf",))
    assert recipe_ref(dep, include=("*Q8_0*",)).include == ("*Q8_0*",)  # --include wins
    assert hub_image_tag(dep) == load_definition("litellm-proxy").tag
    vllm_dep = deployment("solo", recipe="openai-gpt-oss-20b")
    assert recipe_ref(vllm_dep).include == () and hub_image_tag(vllm_dep) == vllm_dep.image_tag
    with pytest.raises(ConfigError) as exc:
        model_ref("org/model", None, include=("--all",))
    assert "is not a file pattern" in str(exc.value)


def test_the_hub_client_lists_and_downloads_only_the_included_files(monkeypatch):
    """nodeside/hub_client.py filters the repo's listing by the patterns and passes them to snapshot_download."""
    import sys
    import types

    hub = types.ModuleType("huggingface_hub")
    errors = types.ModuleType("huggingface_hub.errors")
    hf_api = types.ModuleType("huggingface_hub.hf_api")

    class RepoFile:
        def __init__(self, path):
            self.path, self.size, self.lfs, self.blob_id = path, 1, None, "b" * 40

    class Api:
        def model_info(self, repo, revision):
            return types.SimpleNamespace(sha="c" * 40)

        def list_repo_tree(self, repo, revision, recursive):
            return [RepoFile(p) for p in ("README.md", "Q4_K_M/m-00001-of-00002.gguf", "Q8_0/m.gguf")]

    calls = []
    hub.__version__ = "test"
    hub.HfApi = Api
    hub.snapshot_download = lambda repo, **kw: calls.append(kw) or "/hf/x"
    for name in ("GatedRepoError", "HfHubHTTPError", "RepositoryNotFoundError", "RevisionNotFoundError"):
        setattr(errors, name, type(name, (Exception,), {}))
    hf_api.RepoFile = RepoFile
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    monkeypatch.setitem(sys.modules, "huggingface_hub.errors", errors)
    monkeypatch.setitem(sys.modules, "huggingface_hub.hf_api", hf_api)
    monkeypatch.delitem(sys.modules, "sparkdeploy.nodeside.hub_client", raising=False)
    import sparkdeploy.nodeside.hub_client as client

    assert [f["path"] for f in client.manifest("o/m", "main", ["Q4_K_M/*"])["files"]] == [
        "Q4_K_M/m-00001-of-00002.gguf"
    ]
    assert len(client.manifest("o/m", "main")["files"]) == 3
    client.main(["download", "o/m", "main", "Q4_K_M/*"])
    assert calls[-1]["allow_patterns"] == ["Q4_K_M/*"]


def test_sglang_on_four_nodes_cluster_and_replicas_carry_the_fabric_environment():
    """cluster over four nodes: one engine, every rank's --dist-init-addr at rank 0's fabric IP and the same NCCL/RoCE
    settings as vLLM's cluster; replicas: two TP=2 engines, each with its own rank 0."""
    from sparkdeploy.topologies.lint import synthetic_inventory

    four = synthetic_inventory(4)
    dep = deployment("cluster", "native", recipe="sglang-gpt-oss-120b", inventory=four)
    lines = serving_argv(dep)
    assert [a[a.index("--node-rank") + 1] for a in lines] == ["0", "1", "2", "3"]
    assert {a[a.index("--dist-init-addr") + 1].split(":")[0] for a in lines} == {"198.51.100.1"}
    assert {a[a.index("--tp-size") + 1] for a in lines} == {"4"}
    for nd in dep.nodes:
        env = nd.file("node.env").content
        assert "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1" in env and "NCCL_SOCKET_IFNAME=enp1s0f1np1" in env
    rep = deployment("replicas", "native", recipe="sglang-gpt-oss-120b", inventory=four)
    lines = serving_argv(rep)
    assert [a[a.index("--dist-init-addr") + 1].split(":")[0] for a in lines] == ["198.51.100.1"] * 2 + [
        "198.51.100.3"
    ] * 2
    assert len(rep.backends) == 2


def test_speculative_on_sglang_renders_its_own_flags_and_they_parse():
    """Issue 39 on issue 38's interface: the recipe's `speculative:` becomes SGLang's --speculative-* flags in the
    one place SGLang's flags are written, and SGLang 0.5.23's own parser rules accept them."""
    sets = (
        "speculative.method=eagle3",
        "speculative.model=lmsys/EAGLE3-gpt-oss-120b-bf16",
        "speculative.num_speculative_tokens=3",
    )
    (argv,) = serving_argv(deployment("solo", recipe="sglang-gpt-oss-120b", sets=sets))
    i = argv.index("--speculative-algorithm")
    assert argv[i : i + 4] == [
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        sets[1].split("=")[1],
    ]
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "4"
    check_argparse(argv[4:], SGLANG_DUMP, "SGLang 0.5.23", "sglang-gpt-oss-120b", "sglang")


def test_speculative_on_llamacpp_is_refused_in_one_line():
    with pytest.raises(ConfigError) as exc:
        deployment(
            "solo",
            recipe="llamacpp-gpt-oss-120b",
            sets=("speculative.method=ngram", "speculative.num_speculative_tokens=4"),
        )
    lines = str(exc.value).splitlines()
    assert len(lines) == 1 and "speculative" in lines[0] and "llama.cpp" in lines[0], lines
