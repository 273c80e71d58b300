"""An agent client through the default gpt-oss recipe (issue 27, item 5), and an eugr recipe served as it is.

The OpenAI Python client (the one agent frameworks use) sends `tools` with `tool_choice: "auto"` to the endpoint
`up` reports, on every topology and cluster backend, and gets a tool call back: before issue 27 the default
recipe had no tool-call parser and this request got HTTP 400. The engines are vllm-sim: SIMULATED (no model
runs; the sim writes gpt-oss's harmony markup for the recipe's `--tool-call-parser openai --reasoning-parser
openai_gptoss` and the server parses it back, images/vllm-sim/vllm_sim/formats.py). Each engine's /sim/info
is checked, so a response can never pass for a real model's.

These deployments are also the lab cases of the default recipe in test_every_recipe_lab.py (DEPLOYED_ELSEWHERE).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import openai
import pytest
import requests

from sparkdeploy.config.secrets import parse_env_file
from tests.deploy.test_deploy_lab import containers, expected_containers
from tests.sim.chat_suite import MARKUP, WEATHER
from tests.support.cli_process import failure, sd

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
RECIPE = "openai-gpt-oss-120b"
CASES = [("solo", None), ("cluster", "ray"), ("cluster", "torchrun"), ("cluster", "native"), ("2xsolo", None)]
EUGR_RECIPE = REPO / "tests" / "fixtures" / "eugr" / "openai-gpt-oss-120b.yaml"
GATE_TIMEOUT = "240"


@pytest.fixture(scope="module")
def inv(lab) -> str:
    path = str(lab.spec.inventory_path)
    r = sd("down", "-i", path)
    assert r.returncode == 0, failure(r)
    yield path
    r = sd("down", "-i", path)
    assert r.returncode == 0, failure(r)


def up(inv: str, *args: str) -> dict:
    t0 = time.monotonic()
    # the fabric gate is tested in test_fabric_gate_lab.py and test_deploy_lab.py's cluster-ray: not again here
    gate = ["--no-fabric-gate"] if "cluster" in args else []
    r = sd("up", *args, "-i", inv, "--timeout", GATE_TIMEOUT, "--json", *gate)
    assert r.returncode == 0, failure(r)
    result = json.loads(r.stdout)
    assert result["ok"] and result["health"]["ok"], result
    print(f"up {' '.join(args)}: {time.monotonic() - t0:.1f} s")
    return result


def call_a_tool(lab, result: dict, model: str, proxied: bool) -> None:
    """The OpenAI client's tool call through the endpoint; SIMULATED engines behind it (checked)."""
    key = parse_env_file(lab.spec.directory / "secrets.env")["LITELLM_MASTER_KEY"] if proxied else "none"
    client = openai.OpenAI(base_url=result["endpoint"], api_key=key, timeout=120, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}],
        tools=[WEATHER],
        tool_choice="auto",
        max_tokens=300,
    )
    resp = raw.parse()
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls", resp
    calls = choice.message.tool_calls or []
    assert len(calls) == 1 and calls[0].type == "function" and calls[0].function.name == "get_weather", calls
    args = json.loads(calls[0].function.arguments)
    assert isinstance(args["city"], str) and isinstance(args["days"], int), args
    assert not choice.message.content  # the call is the whole turn; no harmony markup leaks as text
    extra = choice.message.model_extra or {}
    reasoning = extra.get("reasoning") or extra.get("reasoning_content") or ""  # LiteLLM: reasoning_content
    assert reasoning and not any(m in reasoning for m in MARKUP), reasoning
    if not proxied:  # the engine answers directly: its label is on the response
        assert raw.headers.get("x-simulated-by") == "vllm-sim"
    for base in result["backends"] or [result["endpoint"]]:
        info = requests.get(base.removesuffix("/v1") + "/sim/info", timeout=10).json()
        assert info["model"] == "openai/gpt-oss-120b", info  # SIMULATED: the sim served it


@pytest.mark.parametrize("topology,backend", CASES, ids=[t + (f"-{b}" if b else "") for t, b in CASES])
def test_openai_client_gets_a_tool_call_from_the_default_gpt_oss_recipe(lab, inv, topology, backend):
    result = up(inv, "--recipe", RECIPE, "-t", topology, *(["-b", backend] if backend else []))
    assert {n: set(c) for n, c in containers(inv).items()} == expected_containers(topology)
    call_a_tool(lab, result, "openai/gpt-oss-120b", proxied=topology == "2xsolo")


def test_eugr_recipe_serves_as_it_is_and_once_imported(lab, inv, tmp_path):
    """eugr's published gpt-oss recipe, unchanged (tests/fixtures/eugr): `up -r FILE` serves it; `recipes import`
    writes a sparkdeploy recipe that is the same deployment (its `up` changes nothing) and serves the same way."""
    result = up(inv, "-r", str(EUGR_RECIPE), "-t", "solo")
    call_a_tool(lab, result, "openai/gpt-oss-120b", proxied=False)
    r = sd("recipes", "import", str(EUGR_RECIPE), "--out", str(tmp_path))
    assert r.returncode == 0, failure(r)
    before = containers(inv)
    result = up(inv, "-r", str(tmp_path / "openai-gpt-oss-120b.yaml"), "-t", "solo")
    assert containers(inv) == before  # the same container, not restarted: the import is the recipe run-recipe ran
    call_a_tool(lab, result, "openai/gpt-oss-120b", proxied=False)
