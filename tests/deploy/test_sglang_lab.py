"""SGLang in the lab (issue 38 items 2 and 7), SIMULATED: vllm-sim stands in for SGLang's registry image
(`stands_in_for: engine:sglang`) and runs `python3 -m sglang.launch_server` with the argv sparkdeploy renders,
parsed by SGLang 0.5.23's own flag list (images/vllm-sim/sglang/launch_server.py). A shipped SGLang recipe on solo,
2xsolo and a two-node cluster (SGLang's --nnodes/--node-rank/--dist-init-addr: the ranks meet at rank 0's fabric
address; `up` runs the fabric gate first, as for vLLM's cluster): a streamed chat and a chat with tools (the OpenAI
client's tool call) through the endpoint, SGLang's metric names on /metrics, and `top` reading them."""

from __future__ import annotations

import json
import time

import pytest
import requests

from sparkdeploy.config.secrets import parse_env_file
from tests.deploy.test_deploy_lab import containers, expected_containers, stream_chat
from tests.deploy.test_tool_calls_lab import call_a_tool
from tests.support.cli_process import failure, sd

pytestmark = pytest.mark.lab

RECIPE = "sglang-gpt-oss-120b"
CASES = [("solo", None), ("2xsolo", None), ("cluster", "native")]


@pytest.fixture(scope="module")
def inv(lab) -> str:
    path = str(lab.spec.inventory_path)
    r = sd("down", "-i", path)
    assert r.returncode == 0, failure(r)
    yield path
    r = sd("down", "-i", path)
    assert r.returncode == 0, failure(r)


@pytest.mark.parametrize("topology,backend", CASES, ids=[c[0] for c in CASES])
def test_a_shipped_sglang_recipe_serves_simulated(lab, inv, topology, backend):
    t0 = time.monotonic()
    # The cluster runs the fabric gate as vLLM's does (SGLang's ranks all-reduce over the fabric too): doctor's
    # image and driver checks, then the all-reduce probe in the serving image (gloo over the fabric IPs: SIMULATED).
    r = sd("up", "--recipe", RECIPE, "-t", topology, "-i", inv, "--timeout", "240", "--json")
    assert r.returncode == 0, failure(r)
    result = json.loads(r.stdout)
    assert result["ok"] and result["health"]["ok"], result
    print(f"sglang {topology}: up {time.monotonic() - t0:.1f} s")
    if topology == "cluster":
        gate = result["fabric_gate"]
        assert gate["status"] == "passed" and gate["simulated"], gate
        rows = {c["check"]: c for c in gate["checks"]}
        assert set(rows) >= {"image.same_id", "image.torch_nccl", "gpu.same_driver", "nccl.allreduce"}, rows
        assert rows["nccl.allreduce"]["measured"].startswith("SIMULATED gloo/CPU over fabric IPs"), rows
    assert {n: set(c) for n, c in containers(inv).items()} == expected_containers(topology)
    key = parse_env_file(lab.spec.directory / "secrets.env")["LITELLM_MASTER_KEY"] if topology == "2xsolo" else None
    assert stream_chat(result["endpoint"], key, "openai/gpt-oss-120b", max_tokens=32)
    # a chat completion with tools, answered by the SGLang stand-in (its --tool-call-parser gpt-oss): SIMULATED
    call_a_tool(lab, result, "openai/gpt-oss-120b", proxied=topology == "2xsolo")
    for base in result["backends"] or [result["endpoint"]]:
        text = requests.get(base.removesuffix("/v1") + "/metrics", timeout=10).text
        assert "sglang:num_running_reqs" in text and "sglang:generation_tokens_total" in text
        assert "vllm:num_requests_running" not in text
        info = requests.get(base.removesuffix("/v1") + "/sim/info", timeout=10).json()  # SIMULATED, and says so
        assert info["model"] == "openai/gpt-oss-120b", info
    r = sd("top", "-i", inv, "--once", "--json")
    assert r.returncode == 0, failure(r)
    engines = [e for e in json.loads(r.stdout)["engines"] if e["container"] == "sparkdeploy-vllm"]
    assert engines and all(not e.get("error") and e["running"] is not None for e in engines), engines
    if topology == "cluster":  # the worker rank joined rank 0 over the fabric and serves no API
        r = sd("logs", "-i", inv, "--tail", "50")
        assert "joined rank 0 at" in r.stdout, failure(r)
