"""Every shipped recipe serves in the lab on each topology it lists (issue 24, item 9).

One `up` per recipe x topology (no --set: the recipe's own values), then one streamed chat completion through the
endpoint, and each engine's /sim/info says it runs the recipe's model under that model's own sim profile with the
recipe's max_model_len. The cases come from recipes/*.yaml, so a new recipe or topology is deployed here, or is
listed below as deployed by another lab test, or the fast test at the end fails. Kept lean for CI: no down
between cases (the next `up` replaces the deployment), no second `up`, no bench, no fabric gate (its own test is
tests/deploy/test_fabric_gate_lab.py). A recipe that lists solo and 2xsolo is deployed once, as 2xsolo: the head's
engine there is the solo engine (same files but for labels: the fast test at the end), and the case streams a
completion from that engine directly, as the solo case would; the solo topology itself is deployed by
tests/deploy/test_deploy_lab.py.

The engines are vllm-sim (SIMULATED: no GPU math); the lab serves no weights of these models, and `up` lets a
model absent from every node pass for a simulated engine (sparkdeploy/models/up_check.py), so nothing is seeded.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests

from sparkdeploy.config.secrets import parse_env_file
from sparkdeploy.recipes.recipe import load_recipe, recipe_files, resolve
from tests.deploy.test_deploy_lab import containers, expected_containers, stream_chat
from tests.support.cli_process import failure, sd

REPO = Path(__file__).resolve().parents[2]
GATE_TIMEOUT = "240"
SHIPPED = {name: load_recipe(name)[0] for name in sorted(recipe_files())}

# Deployed, with a completion, by another lab test already: not deployed twice (CI time).
DEPLOYED_ELSEWHERE = (
    {
        ("openai-gpt-oss-120b-bench", t): "tests/bench/test_bench_lab.py::test_short_sweep_of_three_topologies (up, "
        "then llama-benchy)"
        for t in ("solo", "cluster", "2xsolo")
    }
    | {
        ("openai-gpt-oss-120b", t): "tests/deploy/test_tool_calls_lab.py::"
        "test_openai_client_gets_a_tool_call_from_the_default_gpt_oss_recipe (up, then the OpenAI client's tool call)"
        for t in ("solo", "cluster", "2xsolo")
    }
    | {
        ("qwen3-coder-30b-ngram", "solo"): "tests/bench/test_speculative_ab_lab.py::"
        "test_the_ab_deploys_each_setting_and_recommends_on_the_owners_prompts (up per setting, the prompts streamed)"
    }
    | {
        ("glm-4.7-flash-int4", t): f"tests/deploy/test_deploy_lab.py::test_up_stream_idempotent_status_down[{case}]"
        for t, case in (("solo", "solo"), ("cluster", "cluster-torchrun"), ("2xsolo", "2xsolo"))
    }
)
REPLICAS = (  # why replicas is not deployed here
    "replicas is listed by no recipe (a cluster recipe may run it): it pairs nodes into TP=2 engines behind "
    "the proxy, so two engines need four nodes; on this two-node lab it would be the cluster engine deployed "
    "here behind the 2xsolo proxy. The four-node replicas runs in tests/multinode/test_four_nodes_lab.py"
)


# Engines the lab serves elsewhere, not with vllm-sim here: the recipe's engine -> where its lab tests are.
OTHER_ENGINES = {
    "sglang": "tests/deploy/test_sglang_lab.py: vllm-sim as SGLang (SIMULATED, SGLang's own flags) serves "
    "sglang-gpt-oss-120b on solo, 2xsolo and a two-node cluster; the other SGLang recipes are cluster-only "
    "variants of the same rendering (tests/test_engines.py)",
    "llamacpp": "tests/deploy/test_llamacpp_lab.py: the REAL CPU llama-server serves llamacpp-qwen3-coder-30b (the "
    "tiny GGUF in its place) on solo and 2xsolo; the other llama.cpp recipes differ only in fields it renders",
}


def solo_in_2xsolo(name: str) -> bool:
    """The recipe's solo case is served by its 2xsolo case (see the module doc)."""
    topologies = SHIPPED[name].topologies
    return "solo" in topologies and "2xsolo" in topologies and (name, "2xsolo") not in DEPLOYED_ELSEWHERE


def cases() -> list:
    out = []
    for name, recipe in SHIPPED.items():
        if recipe.engine in OTHER_ENGINES:
            continue  # see OTHER_ENGINES
        for topology in list(recipe.topologies) + (["replicas"] if "cluster" in recipe.topologies else []):
            if topology == "replicas" or (name, topology) in DEPLOYED_ELSEWHERE:
                continue  # deployed by the lab test named there (the fast test below keeps the list true)
            if topology == "solo" and solo_in_2xsolo(name):
                continue  # its engine is deployed and asked by the 2xsolo case
            out.append(pytest.param(name, topology, id=f"{name}-{topology}"))
    return out


@pytest.fixture(scope="module")
def inv(lab) -> str:
    path = str(lab.spec.inventory_path)
    r = sd("down", "-i", path)  # start from nothing of ours
    assert r.returncode == 0, failure(r)
    yield path
    r = sd("down", "-i", path)
    assert r.returncode == 0, failure(r)


@pytest.mark.lab
@pytest.mark.parametrize("recipe,topology", cases())
def test_recipe_serves_on_topology(lab, inv, recipe, topology):
    resolved = resolve(recipe, topology)
    t0 = time.monotonic()
    # the fabric gate is tested in test_fabric_gate_lab.py; it would add ~8 s to each cluster case here
    gate = ["--no-fabric-gate"] if topology in ("cluster", "replicas") else []
    r = sd("up", "--recipe", recipe, "-t", topology, "-i", inv, "--timeout", GATE_TIMEOUT, "--json", *gate)
    seconds = time.monotonic() - t0
    assert r.returncode == 0, failure(r)
    result = json.loads(r.stdout)
    assert result["ok"] and result["health"]["ok"], result
    print(f"{recipe} {topology} ({resolved.backend or 'no backend'}): up {seconds:.1f} s")
    assert {n: set(c) for n, c in containers(inv).items()} == expected_containers(topology)

    key = parse_env_file(lab.spec.directory / "secrets.env")["LITELLM_MASTER_KEY"] if topology == "2xsolo" else None
    # Few tokens: the simulated 70B decodes at about 3 tok/s in real time, as on two Sparks. With a reasoning
    # parser the (simulated) reasoning comes first: 32 tokens reach the content.
    tokens = 32 if "--reasoning-parser" in resolved.recipe.vllm.extra_args else 4
    assert stream_chat(result["endpoint"], key, resolved.recipe.public_name, max_tokens=tokens)
    if topology == "2xsolo" and solo_in_2xsolo(recipe):  # the solo case: the head's engine, asked directly
        assert stream_chat(result["backends"][0], None, resolved.recipe.public_name, max_tokens=tokens)
    for base in result["backends"] or [result["endpoint"]]:
        info = requests.get(base.removesuffix("/v1") + "/sim/info", timeout=10).json()
        got = (info["model"], info["model_profile"], info["profile_known"], info["plan"]["max_model_len"])
        assert got == (resolved.recipe.model, resolved.recipe.model, True, resolved.recipe.vllm.max_model_len), info


def test_every_shipped_recipe_topology_is_deployed_by_a_lab_test():
    """Fast: each case left out above names a lab test that exists and deploys that recipe on that topology,
    with the recipe's own values; no entry is stale."""
    from tests.bench import test_bench_lab
    from tests.deploy import test_deploy_lab, test_tool_calls_lab

    listed = {(name, t) for name, r in SHIPPED.items() for t in r.topologies}
    assert set(DEPLOYED_ELSEWHERE) <= listed, set(DEPLOYED_ELSEWHERE) - listed
    assert test_bench_lab.RECIPE == "openai-gpt-oss-120b-bench"
    assert test_tool_calls_lab.RECIPE == "openai-gpt-oss-120b"
    assert {(t, b) for t, b in test_tool_calls_lab.CASES} >= {("solo", None), ("cluster", "ray"), ("2xsolo", None)}
    assert test_bench_lab.TOPOLOGIES == "solo,cluster,2xsolo"
    assert test_deploy_lab.CHAT_RECIPE == "glm-4.7-flash-int4"
    assert {("solo", None), ("cluster", "torchrun"), ("2xsolo", None)} <= set(test_deploy_lab.CASES)
    assert not getattr(test_deploy_lab, "CHAT_SETS", None), "the glm deployments must use the recipe's own values"
    for where in DEPLOYED_ELSEWHERE.values():
        path, _, name = where.split(" ")[0].partition("::")
        assert f"def {name.split('[')[0]}(" in (REPO / path).read_text(), where


LABELS_OF_THE_TOPOLOGY = ("io.sparkdeploy.topology=", "io.sparkdeploy.role=", "io.sparkdeploy.config-hash=")


def _engine_files(recipe: str, topology: str) -> dict[str, str]:
    """The head's rendered files but for comments and the labels that name the topology."""
    from tests.test_render import deployment

    head = next(nd for nd in deployment(topology, recipe=recipe).nodes if nd.node.role == "head")
    return {
        f.name: "\n".join(
            line
            for line in f.content.splitlines()
            if not line.lstrip().startswith("#") and not any(label in line for label in LABELS_OF_THE_TOPOLOGY)
        )
        for f in head.files
    }


def test_a_solo_case_served_by_the_2xsolo_case_is_the_same_engine():
    """Fast: where the solo case is left to the 2xsolo case, solo's files on the head are 2xsolo's head files
    (the engine, its env and its guard) but for labels and comments, so that engine serving there is solo's."""
    folded = [name for name in SHIPPED if solo_in_2xsolo(name)]
    assert folded, "no recipe lists solo and 2xsolo: the fold is stale"
    for name in folded:
        solo, twice = _engine_files(name, "solo"), _engine_files(name, "2xsolo")
        assert set(solo) <= set(twice), (name, set(solo) - set(twice))
        for file, text in solo.items():
            assert text == twice[file], f"{name}: {file} differs between solo and 2xsolo"
