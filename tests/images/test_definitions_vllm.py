"""Fast checks (no Docker, no vLLM install) of the vLLM serving images and the LiteLLM proxy image.

What they protect: the flag list sparkdeploy validates recipes against is the real vLLM 0.32.0 parser's
(dumped by scripts/dump_vllm_args.py), the manifests say what the Dockerfiles build, the eager all-reduce
can keep vLLM's default splitting ops, and the proxy can never be a compromised LiteLLM.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sparkdeploy.images.definitions import ImageDefinition

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
VLLM_IMAGES = ("vllm-node", "vllm-node-mxfp4")
MY_IMAGES = VLLM_IMAGES + ("litellm-proxy",)
ARGS_JSON = IMAGES / "vllm-node" / "vllm-args-0.32.0.json"
FORK_ARGS_JSON = IMAGES / "vllm-node-mxfp4" / "vllm-args-0.1.dev12777.json"
BANNED_LITELLM = ("1.82.7", "1.82.8")

# Every flag sparkdeploy's renderer can emit (sparkdeploy/recipes/vllm_args.py: serve_args).
RENDERED_FLAGS = (
    "--served-model-name --host --port --tensor-parallel-size --gpu-memory-utilization --max-model-len "
    "--kv-cache-dtype --enforce-eager --max-num-batched-tokens --max-num-seqs --quantization --load-format "
    "--compilation-config --distributed-executor-backend --nnodes --node-rank --master-addr --master-port "
    "--headless"
).split()


def manifest(name: str) -> dict:
    return yaml.safe_load((IMAGES / name / "manifest.yaml").read_text())


@pytest.fixture(scope="module")
def spec() -> dict:
    return json.loads(ARGS_JSON.read_text())


# -- manifests ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MY_IMAGES)
def test_manifest_parses_and_has_required_fields(name):
    data = manifest(name)
    assert data["name"] == name
    assert data["description"].strip()
    assert data["platform"] in ("linux/amd64", "linux/arm64")
    assert data["base"]
    assert isinstance(data.get("patches"), list)
    assert data.get("simulated") is False
    # The lead's schema forbids unknown keys: the manifest must load as an ImageDefinition.
    ImageDefinition.model_validate(data)
    assert (IMAGES / name / "Dockerfile").is_file()


@pytest.mark.parametrize("name", VLLM_IMAGES)
def test_vllm_manifests(name):
    data = manifest(name)
    assert data["platform"] == "linux/arm64"  # GB10 is an arm64 machine
    assert data["launchers"] == {"torchrun": "/opt/sparkdeploy/launcher/serve_torchrun.py"}
    assert data["include"] == ["../launcher", "../vllm-check"]
    assert data["extra_flags"] == []  # each carries the dump of its own vLLM's parser
    assert data["build_args"]["VLLM_VERSION"] == data["vllm_version"]
    # The image carries the flag set of exactly its vLLM, and the build proves it against the real parser.
    own = IMAGES / name / f"vllm-args-{data['vllm_version']}.json"
    assert json.loads(own.read_text())["vllm_version"] == data["vllm_version"]
    dockerfile = (IMAGES / name / "Dockerfile").read_text()
    assert f"COPY vllm-check/check_image.py vllm-args-{data['vllm_version']}.json /opt/sparkdeploy/" in dockerfile
    assert "--args-json /opt/sparkdeploy/vllm-args-${VLLM_VERSION}.json" in dockerfile
    assert "--require-file /opt/sparkdeploy/launcher/serve_torchrun.py" in dockerfile
    assert f"ARG VLLM_VERSION={data['vllm_version']}" in dockerfile
    assert re.search(r"^ARG BASE=" + re.escape(data["base"]) + "$", dockerfile, re.M)
    assert data["build_needs"]["arch"] == "aarch64" and data["build_needs"]["disk_gb"] > 0
    # Resumable: sources, each compile and the install are separate steps (cached layers), in two stages.
    assert "FROM ${BASE} AS build" in dockerfile and dockerfile.count("\nRUN ") >= 5
    # No BuildKit-only syntax: sparkdeploy builds with the classic builder (docker-py's api.build).
    assert "--mount=" not in dockerfile and "<<" not in dockerfile


def test_vllm_node_base_and_build():
    data = manifest("vllm-node")
    assert re.fullmatch(r"nvcr\.io/nvidia/pytorch:\d\d\.\d\d-py3(@sha256:[0-9a-f]{64})?", data["base"])
    assert data["vllm_version"] == "0.32.0"
    assert data["patches"] == []  # the eager all-reduce is --compilation-config, not a patch
    dockerfile = (IMAGES / "vllm-node" / "Dockerfile").read_text()
    assert "ARG TORCH_CUDA_ARCH_LIST=12.1a" in dockerfile and data["build_args"]["TORCH_CUDA_ARCH_LIST"] == "12.1a"
    assert "COPY launcher/ /opt/sparkdeploy/launcher/" in dockerfile
    for arg in ("VLLM_VERSION", "RAY_VERSION", "FASTSAFETENSORS_VERSION", "VLLM_SDIST_URL", "VLLM_SDIST_SHA256"):
        assert f"ARG {arg}={data['build_args'][arg]}" in dockerfile, arg
    # The tag is proven to be the released source before the hour of compiling.
    assert "sha256sum -c -" in dockerfile and 'git clone --depth 1 --branch "v${VLLM_VERSION}"' in dockerfile


def test_mxfp4_image_is_the_community_build_with_its_own_cli():
    data = manifest("vllm-node-mxfp4")
    assert data["base"] == "nvcr.io/nvidia/pytorch:26.01-py3"  # the community build's base, not vllm-node
    assert data["vllm_version"] == "0.1.dev12777"
    dockerfile = (IMAGES / "vllm-node-mxfp4" / "Dockerfile").read_text()
    for key in ("VLLM_REF", "FLASHINFER_REF", "CUTLASS_REF"):
        assert re.fullmatch(r"[0-9a-f]{40}", data["build_args"][key]), key
        assert f"ARG {key}={data['build_args'][key]}" in dockerfile
    assert "REFUSED" not in dockerfile  # nothing in the definition refuses its own sources any more
    assert 'cat-file -e "$2^{commit}"' in dockerfile  # a vanished commit stops the build in seconds
    spec = json.loads(FORK_ARGS_JSON.read_text())
    assert spec["source_ref"] == "christopherowen/vllm@045293d8"
    assert {"--mxfp4-layers", "--mxfp4-backend"} <= set(spec["flags"])
    assert spec["flags"]["--mxfp4-layers"]["takes_value"] is True
    for gone in ("--enable-return-routed-experts", "--allow-deprecated-quantization"):
        assert gone not in spec["flags"]  # newer than the fork
    for flag in (
        "--served-model-name",
        "--kv-cache-dtype",
        "--enforce-eager",
        "--max-num-batched-tokens",
        "--tensor-parallel-size",
        "--distributed-executor-backend",
        "--nnodes",
        "--node-rank",
        "--master-addr",
        "--master-port",
        "--headless",
        "--compilation-config",
        "--swap-space",
    ):
        assert flag in spec["flags"], flag
    assert list(spec["flags"]) == sorted(spec["flags"])
    assert FORK_ARGS_JSON.read_text() == json.dumps(spec, indent=1, ensure_ascii=True) + "\n"


# -- the vLLM 0.32.0 argument list ------------------------------------------------------------------------


def test_vllm_args_json_is_well_formed(spec):
    assert spec["vllm_version"] == "0.32.0"
    assert "make_arg_parser" in spec["source"] and "VLLM_TARGET_DEVICE=cpu" in spec["source"]
    assert re.search(r"sha256:[0-9a-f]{64}", spec["source"])  # which wheel it came from
    flags = spec["flags"]
    assert len(flags) > 300
    assert list(flags) == sorted(flags)  # deterministic order
    for opt, info in flags.items():
        assert opt.startswith("-"), opt
        assert isinstance(info["dest"], str) and info["dest"]
        assert isinstance(info["takes_value"], bool)
        assert info["choices"] is None or isinstance(info["choices"], list)
        assert info["aliases"] == sorted(info["aliases"])
        for alias in info["aliases"] + info.get("negates", []) + info.get("negated_by", []):
            assert flags[alias]["dest"] == info["dest"], (opt, alias)
    # The file is exactly what the script writes (indent=1, trailing newline): a re-dump diffs cleanly.
    assert ARGS_JSON.read_text() == json.dumps(spec, indent=1, ensure_ascii=True) + "\n"


def test_rendered_flags_exist_in_vllm_0_32_0(spec):
    missing = [f for f in RENDERED_FLAGS if f not in spec["flags"]]
    assert not missing, f"sparkdeploy renders flags vLLM 0.32.0 does not have: {missing}"


def test_flag_shapes_the_renderer_relies_on(spec):
    flags = spec["flags"]
    for f in ("--enforce-eager", "--headless"):
        assert flags[f]["takes_value"] is False, f
    for f in ("--compilation-config", "--load-format", "--quantization", "--kv-cache-dtype", "--nnodes"):
        assert flags[f]["takes_value"] is True, f
    assert flags["-tp"]["dest"] == "tensor_parallel_size"
    assert flags["-cc"]["dest"] == "compilation_config"
    assert "fp8" in flags["--kv-cache-dtype"]["choices"]


def test_removed_and_changed_flags(spec):
    flags = spec["flags"]
    assert "--swap-space" not in flags  # removed before 0.32.0
    # -O is no option string: FlexibleArgumentParser rewrites -O<n> to --optimization-level <n>.
    assert "-O" not in flags and "--optimization-level" in flags
    assert any(k.startswith("-O") and "--optimization-level" in v for k, v in spec["preprocessing"].items())


def test_values_checked_after_argparse(spec):
    sets = spec["value_sets"]
    assert {"fastsafetensors", "dummy", "safetensors", "auto"} <= set(sets["--load-format"])
    assert {"ray", "mp", "external_launcher"} <= set(sets["--distributed-executor-backend"])
    assert {"mxfp4", "gpt_oss_mxfp4", "fp8"} <= set(sets["--quantization"])


def test_known_environment_variables(spec):
    env = spec["environment_variables"]
    assert env == sorted(env)
    for name in ("VLLM_HOST_IP", "VLLM_USE_RAY_COMPILED_DAG_CHANNEL_TYPE", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        assert name in env, name
    # A retired switch the MXFP4 recipes still set: vLLM 0.32.0 would only warn that it is unknown.
    assert "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8" not in env


# -- compilation defaults (the eager all-reduce keeps them) ------------------------------------------------


def test_compilation_defaults_match_the_dump(spec):
    dumped = spec["compilation_defaults"]
    assert dumped["cudagraph_mode"] == "FULL_AND_PIECEWISE" and dumped["optimization_level"] == "O2"
    ops = dumped["splitting_ops"]
    assert "vllm::unified_attention_with_output" in ops and "vllm::unified_kv_cache_update" in ops
    assert "vllm::all_reduce" not in ops  # the eager all-reduce adds it; it is no default
    assert len(ops) == len(set(ops))
    for name in VLLM_IMAGES:  # each manifest keeps the defaults of its own vLLM
        data = manifest(name)
        own = json.loads((IMAGES / name / f"vllm-args-{data['vllm_version']}.json").read_text())
        assert data["compilation_defaults"] == (own["compilation_defaults"] or {}), name


# -- LiteLLM proxy -----------------------------------------------------------------------------------------


def _requirements() -> list[tuple[str, str, list[str]]]:
    """(name with extras, version, hashes) from the hashed lock."""
    text = (IMAGES / "litellm-proxy" / "requirements.txt").read_text()
    logical = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in logical.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+(?:\[[a-z,]+\])?)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)", line)
        assert m, f"not an exact, hashed pin: {line}"
        out.append((m.group(1), m.group(2), re.findall(r"[0-9a-f]{64}", m.group(3))))
    return out


def test_litellm_requirements_pin_1_100_5_with_hashes():
    reqs = _requirements()
    by_name = {name.split("[")[0].lower(): version for name, version, _ in reqs}
    assert ("litellm[proxy]", "1.100.5") in [(n, v) for n, v, _ in reqs]
    assert len(reqs) > 50  # the full resolved set, not just the top-level requirement
    for banned in BANNED_LITELLM:
        assert by_name["litellm"] != banned
    text = (IMAGES / "litellm-proxy" / "requirements.txt").read_text()
    for banned in BANNED_LITELLM:
        assert not re.search(rf"^litellm[^=\n]*=={re.escape(banned)}\b", text, re.M)
    # bookworm's Python 3.11.2 needs async-timeout for redis (marker python_full_version < 3.11.3).
    assert "async-timeout" in by_name


def test_litellm_dockerfile_installs_offline_and_checks():
    data = manifest("litellm-proxy")
    assert data["base"] == "debian-base" and data["requirements"] == "requirements.txt"
    dockerfile = (IMAGES / "litellm-proxy" / "Dockerfile").read_text()
    assert "apt-get install" in dockerfile and "python3-venv" in dockerfile
    assert "--no-index" in dockerfile and "--find-links /tmp/wheels" in dockerfile
    assert "--require-hashes" in dockerfile
    assert "check_litellm.py --expect 1.100.5" in dockerfile
    assert 'ENTRYPOINT ["/opt/sparkdeploy/litellm/entrypoint.sh"]' in dockerfile
    entry = (IMAGES / "litellm-proxy" / "entrypoint.sh").read_text()
    assert "check_litellm.py" in entry and "exec /opt/litellm/bin/litellm" in entry
    # Few layers in the final stage: one RUN (apt) and one COPY after the last FROM.
    final = dockerfile.rsplit("\nFROM ", 1)[1]
    assert len(re.findall(r"^(RUN|COPY|ADD) ", final, re.M)) == 2


def test_check_litellm_refuses_pth_file(tmp_path):
    (tmp_path / "litellm_init.pth").write_text("import os\n")
    script = IMAGES / "litellm-proxy" / "check_litellm.py"
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 1
    assert "litellm_init.pth" in result.stderr
