"""scripts/derive_fork_args.py: a fork's CLI from the two releases around its base plus what its source says.

Pure logic on small synthetic dumps (the real inputs are two 60 KB dumps made in a throwaway venv; the
committed result is checked in test_definitions_vllm.py and proven against the fork at build time).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("derive_fork_args", ROOT / "scripts" / "derive_fork_args.py")
derive_mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(derive_mod)


def flag(dest, choices=None, aliases=(), takes_value=True):
    return {"dest": dest, "takes_value": takes_value, "nargs": None, "choices": choices, "aliases": list(aliases)}


def dump(version, flags, quant, env, comp):
    return {
        "vllm_version": version,
        "positionals": ["model_tag"],
        "preprocessing": {},
        "value_sets": {"--quantization": quant},
        "compilation_defaults": comp,
        "environment_variables": env,
        "flags": flags,
    }


LOW = dump(
    "0.13.0",
    {
        "--port": flag("port"),
        "--kv-cache-dtype": flag("cache_dtype", ["auto", "fp8", "fp8_e5m2"]),
        "--old-only": flag("old_only"),
        "--expert": flag("expert"),
    },
    ["fp8", "mxfp4", "gone"],
    ["VLLM_A", "VLLM_OLD"],
    {"splitting_ops": ["a"]},
)
HIGH = dump(
    "0.14.0",
    {
        "--port": flag("port"),
        "--kv-cache-dtype": flag("cache_dtype", ["auto", "fp8", "nvfp4"]),
        "--seen": flag("seen", takes_value=False),
        "--no-seen": flag("seen", takes_value=False),
        "--later": flag("later"),
        "--unknown": flag("unknown"),
        "--expert": flag("expert", aliases=["-ep"]),
        "-ep": flag("expert", aliases=["--expert"]),
    },
    ["fp8", "mxfp4", "new"],
    ["VLLM_A", "VLLM_NEW"],
    {"splitting_ops": ["a"]},
)
DELTA = {
    "fork": {"repo": "https://github.com/someone/vllm.git", "commit": "ab" * 20, "version": "0.1.dev5"},
    "evidence": "read in its arg_utils.py",
    "added": {"--mxfp4-layers": flag("mxfp4_layers")},
    "seen_in_fork": ["--seen"],
    "absent_from_fork": ["--later", "-ep"],
    "env_added": ["VLLM_MXFP4_BACKEND"],
    "env_removed": [],
}


def test_derivation_keeps_common_adds_the_forks_and_lists_what_it_cannot_decide():
    doc = derive_mod.derive(LOW, HIGH, DELTA)
    flags = doc["flags"]
    assert doc["vllm_version"] == "0.1.dev5" and doc["source_ref"] == "someone/vllm@abababab"
    assert "--port" in flags and "--mxfp4-layers" in flags
    assert "--seen" in flags and "--no-seen" in flags  # the --no- form follows its flag
    assert "--later" not in flags and "-ep" not in flags  # the fork's source lacks them
    assert flags["--expert"]["aliases"] == []  # no alias pointing at a dropped option string
    assert flags["--kv-cache-dtype"]["choices"] == ["auto", "fp8"]  # only what both releases accept
    assert doc["unverified_flags"] == ["--old-only", "--unknown"]
    assert doc["value_sets"]["--quantization"] == ["fp8", "mxfp4"]
    assert doc["environment_variables"] == ["VLLM_A", "VLLM_MXFP4_BACKEND"]
    assert doc["compilation_defaults"] == {"splitting_ops": ["a"]}
    assert list(flags) == sorted(flags)


def test_differing_compilation_defaults_are_not_guessed():
    high = dict(HIGH, compilation_defaults={"splitting_ops": ["a", "b"]})
    assert derive_mod.derive(LOW, high, DELTA)["compilation_defaults"] is None


def test_a_flag_claimed_as_added_that_upstream_has_is_an_error():
    with pytest.raises(SystemExit):
        derive_mod.derive(LOW, HIGH, dict(DELTA, added={"--port": flag("port")}))


def test_check_mode_compares_with_the_file(tmp_path):
    low, high, delta, out = (tmp_path / n for n in ("low.json", "high.json", "delta.yaml", "out.json"))
    low.write_text(json.dumps(LOW))
    high.write_text(json.dumps(HIGH))
    delta.write_text(json.dumps(DELTA))  # JSON is YAML
    args = ["--low", str(low), "--high", str(high), "--delta", str(delta), "--out", str(out)]
    assert derive_mod.main(args) == 0
    assert derive_mod.main(args + ["--check"]) == 0
    out.write_text(out.read_text().replace("0.1.dev5", "0.1.dev6"))
    assert derive_mod.main(args + ["--check"]) == 1
