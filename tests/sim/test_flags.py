"""`vllm serve` argument handling: vLLM 0.32's flags accepted, anything else refused like vLLM does."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from tests.sim.conftest import REPO, SEED_ARGS, sim_env
from vllm_sim.config import ConfigError, from_namespace
from vllm_sim.flags import ARGS_FILE, EXTRA_FILE, human_readable_int, parse_serve_args, preprocess

OFFICIAL_DUMP = REPO / "images" / "vllm-node" / "vllm-args-0.32.0.json"


def run_vllm(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vllm_sim", *args],
        env=sim_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(REPO),
    )


def test_flag_list_is_a_copy_of_the_vllm_parser_dump():
    assert json.loads(ARGS_FILE.read_text()) == json.loads(OFFICIAL_DUMP.read_text()), (
        "images/vllm-sim/vllm_sim/data/vllm-args.json differs from images/vllm-node/vllm-args-0.32.0.json: copy it"
    )


def test_extra_flags_match_the_manifests():
    """The sim's manifest declares exactly the extra flags it accepts, and those cover the extra flags of
    every image it stands in for whose definition exists in this checkout."""
    accepted = set(json.loads(EXTRA_FILE.read_text())["flags"])
    sim = yaml.safe_load((REPO / "images" / "vllm-sim" / "manifest.yaml").read_text())
    assert set(sim["extra_flags"]) == accepted
    for path in sorted((REPO / "images").glob("*/manifest.yaml")):
        m = yaml.safe_load(path.read_text())
        if m.get("name") in sim["stands_in_for"]:
            missing = set(m.get("extra_flags") or []) - accepted
            assert not missing, f"{m['name']} declares extra_flags {sorted(missing)} that vllm-sim does not accept"


def test_seed_recipe_arguments_parse():
    ns = parse_serve_args(
        [
            "openai/gpt-oss-120b",
            "--tool-call-parser",
            "openai",
            "--reasoning-parser",
            "openai_gptoss",
            "--enable-auto-tool-choice",
            "--enable-prefix-caching",
            "--load-format",
            "fastsafetensors",
            "--quantization",
            "mxfp4",
            "--mxfp4-backend",
            "CUTLASS",
            "--attention-backend",
            "FLASHINFER",
            "--host",
            "0.0.0.0",
            "--port",
            "8000",
            *SEED_ARGS,
        ]
    )
    cfg = from_namespace(ns, env={})
    assert (cfg.max_model_len, cfg.gpu_memory_utilization, cfg.max_num_batched_tokens) == (4096, 0.7, 32768)
    assert cfg.mxfp4_layers == {"moe", "qkv", "o", "lm_head"} and cfg.graph_mode == "eager"
    assert cfg.kv_cache_dtype == "fp8" and cfg.quantization == "mxfp4" and cfg.mode == "solo"


def test_every_required_flag_and_alias():
    ns = parse_serve_args(
        [
            "m",
            "--served-model-name",
            "a",
            "b",
            "--host",
            "127.0.0.1",
            "--port",
            "9000",
            "-tp",
            "2",
            "--gpu-memory-utilization",
            "0.8",
            "--max-model-len",
            "8k",
            "--kv-cache-dtype",
            "fp8",
            "--enforce-eager",
            "--max-num-batched-tokens",
            "16K",
            "--max-num-seqs",
            "64",
            "--quantization",
            "fp8",
            "--load-format",
            "dummy",
            "--compilation-config",
            '{"cudagraph_mode": "PIECEWISE"}',
            "--distributed-executor-backend",
            "ray",
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--master-addr",
            "10.0.0.1",
            "--master-port",
            "29600",
            "--headless",
            "--trust-remote-code",
            "--dtype",
            "bfloat16",
        ]
    )
    cfg = from_namespace(ns, env={})
    assert cfg.served_model_names == ["a", "b"] and cfg.tp == 2 and cfg.max_model_len == 8000
    assert cfg.max_num_batched_tokens == 16384 and cfg.max_num_seqs == 64 and cfg.mode == "ray"
    assert (cfg.nnodes, cfg.node_rank, cfg.master_addr, cfg.master_port, cfg.headless) == (
        2,
        1,
        "10.0.0.1",
        29600,
        True,
    )
    assert cfg.trust_remote_code and cfg.dtype == "bfloat16" and cfg.load_format == "dummy"


def test_flexible_spellings_like_vllm():
    assert preprocess(["--model", "m", "--max_model_len", "4096"]) == ["m", "--max-model-len", "4096"]
    assert preprocess(["m", "-O3"]) == ["m", "--optimization-level", "3"]
    assert preprocess(["m", "-O", "0"]) == ["m", "--optimization-level", "0"]
    out = preprocess(
        [
            "m",
            "--compilation-config.splitting_ops+",
            "vllm::all_reduce,x",
            "--compilation-config.cudagraph_mode=PIECEWISE",
        ]
    )
    assert out[:2] == ["m", "--compilation-config"]
    assert json.loads(out[2]) == {"splitting_ops": ["vllm::all_reduce", "x"], "cudagraph_mode": "PIECEWISE"}
    cfg = from_namespace(parse_serve_args(["m", "--compilation-config.splitting_ops+", "vllm::all_reduce"]), env={})
    assert cfg.allreduce_split and cfg.graph_mode == "full_and_piecewise"
    assert from_namespace(parse_serve_args(["m", "-O0"]), env={}).graph_mode == "eager"


def test_human_readable_ints():
    assert (
        human_readable_int("4k") == 4000 and human_readable_int("4K") == 4096 and human_readable_int("32768") == 32768
    )
    with pytest.raises(ValueError):
        human_readable_int("4q")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--bogus", "3"], "vllm serve: error: unrecognized arguments: --bogus 3"),
        (["--swap-space", "4"], "unrecognized arguments: --swap-space 4"),
        (["--port", "abc"], "argument --port: invalid int value: 'abc'"),
        (["--dtype", "fp9"], "argument --dtype: invalid choice: 'fp9'"),
        (
            ["--distributed-executor-backend", "slurm"],
            "argument --distributed-executor-backend: invalid choice: 'slurm'",
        ),
        (["--max-model-len"], "argument --max-model-len: expected one argument"),
        (["--compilation-config", "{not json"], "argument --compilation-config/-cc: invalid parse_dataclass value"),
    ],
)
def test_rejections_exit_2_with_vllm_wording(args, message):
    r = run_vllm("serve", "m", *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("vllm serve: error:")


def test_version_and_unknown_subcommand():
    assert run_vllm("--version").stdout.strip() == "0.32.0"
    r = run_vllm("launch", "x")
    assert r.returncode == 2 and "invalid choice: 'launch'" in r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["-tp", "2"], "exceeds the total number of available GPUs"),
        (["--gpu-memory-utilization", "0.3", "--max-model-len", "4096"], "Model weights take"),
        (["--gpu-memory-utilization", "0.52", "--max-model-len", "4096"], "No available memory for the cache blocks"),
        (["--max-model-len", "200000"], "greater than the derived max_model_len"),
        (["--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1"], "World size (1"),
        (["--distributed-executor-backend", "external_launcher"], "serve_torchrun.py"),
    ],
)
def test_startup_refusals_exit_1(args, message):
    r = run_vllm("serve", "openai/gpt-oss-120b", *args)
    assert r.returncode == 1, r.stderr
    assert message in r.stderr and "ValueError:" in r.stderr


def test_model_is_required():
    with pytest.raises(ConfigError):
        from_namespace(parse_serve_args(["--port", "8000"]), env={})
