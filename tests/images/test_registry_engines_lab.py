"""A registry image of another engine than vLLM (issue 38 item 2): `images pull RECIPE` of an SGLang recipe pulls it
once, checks its digest and spreads it over the fabric, without reading a vLLM CLI from it (SGLang's flags are
checked against its pinned parser, images/engine-args/). The image here is the lab's litellm-proxy republished to
the lab registry: like SGLang's, it has Python and no `vllm` (reading a vLLM CLI from it fails, as it would from
lmsysorg/sglang)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
import yaml

from sparkdeploy.images.build import docker_client
from sparkdeploy.images.definitions import load_definition
from sparkdeploy.lab import registry_server as lab_registry
from tests.support.cli_process import failure, sd

pytestmark = pytest.mark.lab


def test_images_pull_of_an_sglang_recipe_spreads_its_registry_image(lab, tmp_path):
    client = docker_client()
    lab_registry.ensure(client, lab.spec)
    tag = f"s{secrets.token_hex(4)}"
    pinned = lab_registry.publish(client, lab.spec, load_definition("litellm-proxy").tag, "lab/sglang-like", tag, tag)
    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "recipes" / "sglang-gpt-oss-120b.yaml").read_text())
    data.update(name="sglang-lab", image=pinned)
    (tmp_path / "sglang-lab.yaml").write_text(yaml.safe_dump(data))
    inv = str(lab.spec.inventory_path)
    r = sd("images", "pull", "sglang-lab", "--recipes-dir", str(tmp_path), "-i", inv, "--json")
    assert r.returncode == 0, failure(r)
    result = json.loads(r.stdout)
    assert result["digest"] == pinned.split("@", 1)[1] and result["pulled"], result
    assert result["vllm_version"] == ""  # no vLLM CLI read from it
    assert sorted(p["node"] for p in result["pushed"]) == sorted(n.name for n in lab.nodes[1:]), result
    assert "reading the vLLM CLI" not in r.stderr
