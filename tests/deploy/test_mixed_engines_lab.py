"""A stack of three engines behind one gateway (issue 38 items 6 and 7): vLLM (vllm-sim, SIMULATED), llama.cpp (the
REAL CPU llama-server with the tiny GGUF) and SGLang (vllm-sim as SGLang, SIMULATED), each answering through the
gateway; a key limited to one model is refused the others; `status` lists all three; `down` leaves nothing."""

from __future__ import annotations

import json

import openai
import pytest

from sparkdeploy.config.secrets import parse_env_file
from tests.deploy.test_llamacpp_lab import SETS, llama_image, pull_tiny_gguf  # noqa: F401 - llama_image: a fixture
from tests.support.cli_process import failure, sd

pytestmark = pytest.mark.lab

GGUF_SETS = ", ".join(json.dumps(s) for s in SETS)
STACK = f"""
deployments:
  - {{name: chat, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark1], memory: 0.3}}
  - {{name: gguf, recipe: llamacpp-qwen3-coder-30b, topology: solo, nodes: [spark1], memory: 0.2, set: [{GGUF_SETS}]}}
  - {{name: big, recipe: sglang-gpt-oss-120b, topology: solo, nodes: [spark2], memory: 0.7}}
"""
MODELS = {"chat": "glm-4.7-flash", "gguf": "qwen3-coder-30b-gguf", "big": "openai/gpt-oss-120b"}


@pytest.fixture(scope="module")
def inv(lab, llama_image, tmp_path_factory) -> str:  # noqa: F811 - the fixture imported above
    path = str(lab.spec.inventory_path)
    r = sd("down", "-i", path)
    assert r.returncode == 0, failure(r)
    pull_tiny_gguf(lab, tmp_path_factory.mktemp("gguf"))
    yield path
    sd("keys", "revoke", "gguf-only", "-i", path)
    r = sd("down", "-i", path)
    assert r.returncode == 0, failure(r)


def test_three_engines_behind_one_gateway_with_keys(lab, inv, tmp_path):
    stack = tmp_path / "stack.yaml"
    stack.write_text(STACK)
    r = sd("up", "--stack", str(stack), "-i", inv, "--timeout", "240", "--json")
    assert r.returncode == 0, failure(r)
    key = parse_env_file(lab.spec.directory / "secrets.env")["LITELLM_MASTER_KEY"]
    base = f"http://{lab.nodes[0].mgmt_ip}:4000/v1"
    admin = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=60)
    hi = [{"role": "user", "content": "hi"}]
    for model in MODELS.values():
        answer = admin.chat.completions.create(model=model, messages=hi, max_tokens=32)
        assert answer.choices[0].message is not None, answer
    sd("keys", "revoke", "gguf-only", "-i", inv)  # a previous run's
    r = sd("keys", "create", "gguf-only", "--models", MODELS["gguf"], "-i", inv, "--json")
    assert r.returncode == 0, failure(r)
    user = openai.OpenAI(base_url=base, api_key=json.loads(r.stdout)["key"], max_retries=0, timeout=60)
    assert user.chat.completions.create(model=MODELS["gguf"], messages=hi, max_tokens=4).model
    with pytest.raises(openai.PermissionDeniedError, match="may not use model"):
        user.chat.completions.create(model=MODELS["big"], messages=hi, max_tokens=4)
    r = sd("status", "-i", inv, "--json")
    assert r.returncode == 0, failure(r)
    for name in MODELS:
        assert f"sparkdeploy-{name}-vllm" in r.stdout, (name, r.stdout[:3000])
