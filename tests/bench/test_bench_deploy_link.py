"""The link to deploy: endpoint, key and metadata of a rendered deployment (nothing connects anywhere)."""

from __future__ import annotations

import pytest

from sparkdeploy.bench import deploy_link
from sparkdeploy.bench.deploy_link import endpoint_of
from sparkdeploy.errors import NothingDeployed, StepFailed

SECRET_KEY = "sk-SECRETmasterKEY456"  # tests/conftest.py's secrets file
STATUS = {
    "deployed": True,
    "healthy": True,
    "recipe": "openai-gpt-oss-120b-bench",
    "topology": "2xsolo",
    "backend": None,
    "model": "openai/gpt-oss-120b",
    "endpoint": "http://192.0.2.1:4000/v1",
    "nodes": [
        {
            "name": "spark1",
            "containers": [
                {"role": "backend", "image_id": "sha256:" + "a" * 64, "image": "sparkdeploy/vllm-sim:aaaaaaaaaaaa"},
                {"role": "proxy", "image_id": "sha256:" + "f" * 64, "image": "sparkdeploy/litellm-proxy:ffffffffffff"},
            ],
        },
        {
            "name": "spark2",
            "containers": [
                {"role": "backend", "image_id": "sha256:" + "a" * 64, "image": "sparkdeploy/vllm-sim:aaaaaaaaaaaa"}
            ],
        },
    ],
}


@pytest.mark.parametrize(
    "topology,variant,port,nodes",
    [("solo", "solo", 8000, 1), ("cluster", "cluster", 8000, 2), ("2xsolo", "2xsolo-shuffle", 4000, 2)],
)
def test_endpoint_of_each_topology(inventory_file, topology, variant, port, nodes):
    ep = endpoint_of(str(inventory_file), "openai-gpt-oss-120b-bench", topology, status=STATUS)
    assert ep.base_url == f"http://192.0.2.1:{port}/v1" and ep.model == "openai/gpt-oss-120b"
    assert ep.variant == variant and ep.api_key == SECRET_KEY and SECRET_KEY not in repr(ep)
    md = ep.metadata
    assert md["recipe"] == "openai-gpt-oss-120b-bench" and md["topology"] == topology and len(md["nodes"]) == nodes
    assert md["vllm_version"] and md["image"].startswith("sparkdeploy/")
    assert md["image_id"] == "sha256:" + "a" * 64  # the engines' image, not the proxy's
    assert (md["backend"] == "ray") == (topology == "cluster")


def test_routing_override_is_its_own_column(inventory_file):
    ep = endpoint_of(
        str(inventory_file), "openai-gpt-oss-120b-bench", "2xsolo", sets=["litellm.routing_strategy=least-busy"]
    )
    assert ep.variant == "2xsolo-least-busy" and ep.metadata["routing"] == "least-busy"


def test_current_endpoint_from_status(inventory_file, monkeypatch):
    monkeypatch.setattr(deploy_link, "status_json", lambda inv: dict(STATUS))
    ep = deploy_link.current_endpoint(str(inventory_file))
    assert ep.base_url == "http://192.0.2.1:4000/v1" and ep.variant == "2xsolo-shuffle" and ep.api_key == SECRET_KEY
    assert ep.metadata["image"] == "sparkdeploy/vllm-sim:aaaaaaaaaaaa"  # what runs, not what would render now
    monkeypatch.setattr(deploy_link, "status_json", lambda inv: dict(STATUS, deployed=False, endpoint=None))
    with pytest.raises(NothingDeployed, match=r"nothing of sparkdeploy's runs on"):
        deploy_link.current_endpoint(str(inventory_file))
    monkeypatch.setattr(deploy_link, "status_json", lambda inv: dict(STATUS, healthy=False))
    with pytest.raises(StepFailed, match="not healthy"):
        deploy_link.current_endpoint(str(inventory_file))


def test_expected_image_is_the_image_id_when_this_engine_has_the_tag(monkeypatch, inventory_file):
    import types

    from sparkdeploy.images import build

    ep = endpoint_of(str(inventory_file), "openai-gpt-oss-120b-bench", "solo")
    images = {ep.metadata["image"]: types.SimpleNamespace(id="sha256:" + "b" * 64)}

    def get(tag):
        if tag not in images:
            raise LookupError(tag)
        return images[tag]

    monkeypatch.setattr(build, "docker_client", lambda: types.SimpleNamespace(images=types.SimpleNamespace(get=get)))
    assert deploy_link.expected_image(ep) == {"image_id": "sha256:" + "b" * 64}
    images.clear()
    assert deploy_link.expected_image(ep) == {"image": ep.metadata["image"]}


@pytest.mark.parametrize(
    "recipe,engine,title,version",
    [
        ("qwen3-coder-30b", "vllm", "vLLM", "0.32.0"),
        ("sglang-gpt-oss-120b", "sglang", "SGLang", "0.5.23"),
        ("llamacpp-qwen3-coder-30b", "llamacpp", "llama.cpp", "b11434"),
    ],
)
def test_bench_metadata_names_the_engine_and_its_version(inventory_file, recipe, engine, title, version):
    """Issue 38: a result says which engine served it and its version, not always a vLLM version."""
    md = endpoint_of(str(inventory_file), recipe, "solo").metadata
    assert (md["engine"], md["engine_title"], md["engine_version"]) == (engine, title, version)
    assert (md["vllm_version"] is not None) == (engine == "vllm")
