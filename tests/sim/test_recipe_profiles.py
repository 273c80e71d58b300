"""Every model a shipped recipe names has its own sim profile, and every shipped recipe x topology starts in the sim.

Issue 24: qwen3-coder-30b-int4 and glm-4.7-flash-int4 named quantized checkpoints the sim did not know; it fell
back to its generic profile (32K positions), refused their max_model_len 65536 and restarted in a loop in the lab.
These tests fail fast, not in the lab, when a recipe names a model without a profile or asks for more than its
profile allows: the engine arguments are the ones `up` renders (the head's entry script of the lab-like
deployment), read by the sim's own parser and start-up arithmetic. An unknown model serves anyway and says so.
"""

from __future__ import annotations

import logging
import shlex
import sys

import pytest
import requests

from sparkdeploy.config.inventory import Inventory
from sparkdeploy.config.secrets import Secrets
from sparkdeploy.recipes.recipe import load_recipe, recipe_files, resolve
from sparkdeploy.topologies import build_deployment
from tests.conftest import SECRET_HF, SECRET_KEY, TWO_NODES
from tests.sim.conftest import Proc, free_port, sim_env, wait_http
from vllm_sim.catalog import default_catalog
from vllm_sim.config import from_namespace
from vllm_sim.engine import SimEngine
from vllm_sim.flags import parse_serve_args

# vllm-sim stands in for vLLM's images only: SGLang's recipes are not served in the lab yet, llama.cpp's by the real
# CPU llama-server (docs/engines-sglang.md, docs/engines-llamacpp.md).
SHIPPED = {name: r for name in sorted(recipe_files()) if (r := load_recipe(name)[0]).engine == "vllm"}
LAB_LIKE = {**TWO_NODES, "cluster": {**TWO_NODES["cluster"], "image_override": "vllm-sim"}}
ENGINE_ENTRIES = ("vllm.entry.sh", "ray-head.entry.sh", "torchrun.entry.sh")


def cases() -> list[tuple[str, str]]:
    """(recipe, topology) for each topology a shipped recipe lists, and replicas where it lists cluster."""
    out = []
    for name, recipe in SHIPPED.items():
        topologies = list(recipe.topologies) + (["replicas"] if "cluster" in recipe.topologies else [])
        out += [(name, t) for t in topologies]
    return out


def engine_args(recipe: str, topology: str) -> list[str]:
    """The `vllm serve` arguments `up` renders for the head (or solo) engine of the lab-like two-node cluster."""
    inv = Inventory.model_validate(LAB_LIKE)
    dep = build_deployment(
        inv, resolve(recipe, topology), Secrets({"HF_TOKEN": SECRET_HF, "LITELLM_MASTER_KEY": SECRET_KEY}, "test")
    )
    head = dep.nodes[0]
    entry = next(f for f in head.files if f.name in ENGINE_ENTRIES)
    line = next(x for x in entry.content.replace("\\\n", " ").splitlines() if x.startswith("exec "))
    argv = shlex.split(line)
    model = dep.recipe.recipe.model
    return argv[argv.index(model) :]  # after `vllm serve` or torchrun's launcher path


@pytest.mark.parametrize("recipe", sorted(SHIPPED))
def test_every_shipped_recipe_model_has_its_own_profile(recipe):
    model = SHIPPED[recipe].model
    profile = default_catalog().model(model)
    # its own entry: not the generic fallback, and not another model's (a base or an alias) by a similar name
    assert profile.known and profile.name == model, (
        f"recipes/{recipe}.yaml: model {model} has no entry in images/vllm-sim/vllm_sim/data/models.yaml "
        f"(got profile {profile.name!r}): add one with the facts of its config.json"
    )


@pytest.mark.parametrize("recipe", sorted(SHIPPED))
def test_profile_agrees_with_the_recipe(recipe):
    """The recipe's own figures (architecture from config.json, weights_gb from the checkpoint) and the
    profile's must agree: two records of one model that drift apart are a wrong profile or a wrong recipe."""
    r = SHIPPED[recipe]
    profile = default_catalog().model(r.model)
    if r.architecture is not None:
        assert (profile.layers, profile.num_kv_heads) == (r.architecture.layers, r.architecture.kv_heads)
    engine = SimEngine(
        from_namespace(
            parse_serve_args(engine_args(recipe, "cluster" if "cluster" in r.topologies else r.topologies[0]))
        )
    )
    weights_gb = engine.plan.weights_gib * engine.cfg.tp * 2**30 / 1e9
    assert r.weights_gb and abs(weights_gb / r.weights_gb - 1) < 0.15, (
        f"{recipe}: the sim's profile holds {weights_gb:.0f} GB of weights, the recipe says {r.weights_gb:g} GB"
    )


@pytest.mark.parametrize("recipe,topology", cases(), ids=[f"{r}-{t}" for r, t in cases()])
def test_every_shipped_recipe_topology_starts_in_the_sim(recipe, topology, caplog):
    args = engine_args(recipe, topology)
    cfg = from_namespace(parse_serve_args(args))
    with caplog.at_level(logging.INFO, logger="vllm_sim.engine"):
        engine = SimEngine(cfg)  # raises ConfigError (the sim's ValueError at start) when it would not start
    resolved = resolve(recipe, topology)
    assert engine.model.name == resolved.recipe.model
    assert engine.plan.max_model_len == resolved.recipe.vllm.max_model_len
    assert f"(sim profile {resolved.recipe.model})" in caplog.text  # the start-up log names the profile used


def test_unknown_model_serves_any_max_model_len_and_says_so_in_one_line(caplog):
    args = ["someone/Unknown-Model-7B-AWQ", "--max-model-len", "65536", "--max-num-batched-tokens", "8192"]
    with caplog.at_level(logging.WARNING, logger="vllm_sim.engine"):
        engine = SimEngine(from_namespace(parse_serve_args(args)))
    assert (engine.model.known, engine.model.name, engine.plan.max_model_len) == (False, "default", 65536)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert "NO PROFILE for model 'someone/Unknown-Model-7B-AWQ'" in lines[0]
    assert "max_model_len 65536 is taken as asked" in lines[0]
    for known in SHIPPED.values():  # names the profiles it knows
        assert known.model in lines[0]


def test_known_model_still_refuses_more_than_its_positions():
    from vllm_sim.config import ConfigError

    args = ["Intel/Qwen3-Coder-30B-A3B-Instruct-int4-AutoRound", "--max-model-len", "300000"]
    with pytest.raises(ConfigError, match=r"max_model_len \(300000\).*max_position_embeddings=262144"):
        SimEngine(from_namespace(parse_serve_args(args)))


@pytest.mark.parametrize(
    "model,profile,known",
    [
        ("cyankiwi/GLM-4.7-Flash-AWQ-4bit", "cyankiwi/GLM-4.7-Flash-AWQ-4bit", True),
        ("someone/Unknown-Model-7B-AWQ", "default", False),
    ],
)
def test_server_reports_its_profile(tmp_path, model, profile, known):
    """A real sim process: /sim/info and the start-up log say which profile it used; an unknown model
    with a long context becomes healthy instead of exiting (what restarted in a loop in the lab)."""
    port = free_port()
    proc = Proc(
        [
            sys.executable,
            "-m",
            "vllm_sim",
            "serve",
            model,
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--max-model-len",
            "65536",
            "--max-num-batched-tokens",
            "4096",
        ],
        sim_env(0.02),
        tmp_path / "sim.log",
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + "/health", proc=proc.p)
        info = requests.get(base + "/sim/info", timeout=5).json()
        assert (info["model_profile"], info["profile_known"], info["plan"]["max_model_len"]) == (profile, known, 65536)
    finally:
        proc.stop()
    log = proc.log.read_text(errors="replace")
    assert f"model {model} (sim profile {profile})" in log
    assert ("NO PROFILE for model" in log) is not known
