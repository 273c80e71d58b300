"""The SGLang 0.5.23 fixtures (scripts/dump_sglang_args.py) are well-formed and hold the facts the engine needs.

These only prove the dumps are sound data; checking rendered `sglang.launch_server` argv against them comes
with the engine module (issue 38).
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ARGS = Path(__file__).resolve().parent.parent / "images" / "engine-args"  # shipped: the engine checks against it
VERSION = "0.5.23"


@cache
def args_doc() -> dict:
    return json.loads((ARGS / f"sglang-{VERSION}-args.json").read_text())


@cache
def metrics_doc() -> dict:
    return json.loads((FIXTURES / f"sglang-{VERSION}-metrics.json").read_text())


def flags() -> dict:
    return args_doc()["flags"]


def prefix_matches(token: str) -> list[str]:
    """What argparse (allow_abbrev) would match for a long option that is not registered itself."""
    return sorted(f for f in flags() if f.startswith(token))


def test_header_names_the_pinned_release_and_its_provenance() -> None:
    doc = args_doc()
    assert doc["sglang_version"] == VERSION
    assert "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937" in doc["source"]
    assert doc["prog"] == "sglang serve"
    assert doc["stubbed_modules"] == ["triton"]
    assert doc["positionals"] == []
    assert len(flags()) > 500


def test_every_entry_is_complete_and_aliases_point_back() -> None:
    keys = {"dest", "action", "takes_value", "nargs", "type", "choices", "default", "required", "aliases"}
    for name, info in flags().items():
        assert keys <= set(info), name
        assert name.startswith("-"), name
        for alias in info["aliases"]:
            other = flags()[alias]
            assert other["dest"] == info["dest"], (name, alias)
            assert name in other["aliases"], (name, alias)
        if not info["takes_value"]:
            assert info["nargs"] == 0, name


@pytest.mark.parametrize(
    ("flag", "aliases"),
    [
        ("--model-path", ["--model"]),
        ("--tp-size", ["--tensor-parallel-size"]),
        ("--pp-size", ["--pipeline-parallel-size"]),
        ("--dist-init-addr", ["--nccl-init-addr"]),
        ("--speculative-draft-model-path", ["--speculative-draft-model"]),
        ("--nnodes", []),
        ("--node-rank", []),
        ("--mem-fraction-static", []),
        ("--context-length", []),
    ],
)
def test_known_flags_and_aliases(flag: str, aliases: list[str]) -> None:
    info = flags()[flag]
    assert info["takes_value"] is True
    assert info["aliases"] == aliases


def test_value_types_and_defaults_of_the_flags_a_recipe_sets() -> None:
    f = flags()
    assert (f["--tp-size"]["type"], f["--tp-size"]["default"]) == ("int", 1)
    assert (f["--nnodes"]["type"], f["--nnodes"]["default"]) == ("int", 1)
    assert (f["--node-rank"]["type"], f["--node-rank"]["default"]) == ("int", 0)
    assert (f["--port"]["default"], f["--host"]["default"]) == (30000, "127.0.0.1")
    # None: SGLang computes it from the memory it finds at start (arg_groups/memory_hook.py)
    assert f["--mem-fraction-static"]["default"] is None
    assert f["--model-path"]["required"] is True
    for switch in ("--enable-metrics", "--trust-remote-code", "--disable-radix-cache"):
        assert f[switch]["takes_value"] is False, switch


def test_parsers_include_the_ones_spark_recipes_use() -> None:
    tools = set(flags()["--tool-call-parser"]["choices"])
    reasoning = set(flags()["--reasoning-parser"]["choices"])
    assert {"gpt-oss", "qwen3_coder", "glm45", "glm47", "auto"} <= tools
    assert {"gpt-oss", "qwen3", "glm45", "nemotron_3", "auto"} <= reasoning
    # The cookbook's older Nemotron name is gone in 0.5.23: a recipe that uses it must be refused.
    assert "nano_v3" not in reasoning


def test_speculative_algorithm_is_checked_after_argparse() -> None:
    assert flags()["--speculative-algorithm"]["choices"] is None
    spec = args_doc()["value_sets"]["--speculative-algorithm"]
    assert spec["case_insensitive"] is True
    assert {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"} <= set(spec["values"])
    assert "NONE" not in spec["values"]


def test_abbreviations_the_field_relies_on() -> None:
    """`--tp` is no flag of 0.5.23; argparse takes it as the unique prefix of --tp-size. `--cuda-graph-max-bs`
    (used by published Spark recipes) is now ambiguous and makes the launch exit 2."""
    assert args_doc()["allow_abbrev"] is True
    assert "--tp" not in flags()
    assert prefix_matches("--tp") == ["--tp-size"]
    assert prefix_matches("--speculative-algo") == ["--speculative-algorithm"]
    assert "--cuda-graph-max-bs" not in flags()
    assert prefix_matches("--cuda-graph-max-bs") == ["--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"]


def test_deprecated_flags_are_marked() -> None:
    assert flags()["--disable-cuda-graph"]["deprecated"] == "--cuda-graph-backend-{decode,prefill}=disabled"
    assert flags()["--enable-dp-attention"]["deprecated"] == "--attn-dp-size <dp-size>"


def test_help_text_is_of_the_same_parser() -> None:
    text = (FIXTURES / f"sglang-{VERSION}-help.txt").read_text()
    assert text.startswith("usage: sglang serve ")
    shown = set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", text))
    listed = {name for name, info in flags().items() if not info.get("hidden")}
    assert listed <= shown
    assert {"--forward-pass-metrics-ipc-name"} <= set(flags()) - listed  # accepted, hidden from --help


def test_environment_variables_hold_the_ones_sparkrun_sets() -> None:
    names = set(args_doc()["environment_variables"])
    assert {"SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"} <= names


def test_metrics_for_top_exist_with_their_kinds() -> None:
    doc = metrics_doc()
    assert doc["sglang_version"] == VERSION
    by_name = {m["name"]: m for m in doc["metrics"]}
    expected = {
        "sglang:num_running_reqs": "Gauge",
        "sglang:num_queue_reqs": "Gauge",
        "sglang:token_usage": "Gauge",
        "sglang:gen_throughput": "Gauge",
        "sglang:prompt_tokens_total": "Counter",
        "sglang:generation_tokens_total": "Counter",
        "sglang:time_to_first_token_seconds": "Histogram",
        "sglang:spec_accept_length": "Gauge",
        "sglang:spec_accept_rate": "Gauge",
    }
    for name, kind in expected.items():
        assert by_name[name]["kind"] == kind, name
        assert by_name[name]["source"].startswith("sglang/srt/"), name
    assert by_name["sglang:time_to_first_token_seconds"]["exposed"] == [
        "sglang:time_to_first_token_seconds_bucket",
        "sglang:time_to_first_token_seconds_count",
        "sglang:time_to_first_token_seconds_sum",
    ]
    assert by_name["sglang:prompt_tokens_total"]["exposed"] == ["sglang:prompt_tokens_total"]
    assert all(re.fullmatch(r"sglang:[a-z0-9_]+", n) for n in by_name)
