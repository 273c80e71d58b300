"""Hand-built deployments and facts for the fast tests of tests/deploy (no node, no image definition)."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

from sparkdeploy.config.inventory import Inventory
from sparkdeploy.config.secrets import Secrets
from sparkdeploy.facts import ContainerFact, FileFact, NodeFacts
from sparkdeploy.images.definitions import ImageDefinition
from sparkdeploy.recipes.recipe import Recipe, ResolvedRecipe
from sparkdeploy.topologies.deployment import ContainerSpec, Deployment, FileSpec, Listen, NodeDeployment

SECRET_HF = "hf_UNITtestSECRETvalue789"
SECRET_KEY = "sk-UNITtestMASTERkey012"
IMAGE = "sparkdeploy/vllm-sim:0123456789ab"
PROXY_IMAGE = "sparkdeploy/litellm-proxy:ba9876543210"
IMAGE_ID = "sha256:" + "a" * 64
PROXY_ID = "sha256:" + "b" * 64

INVENTORY = {
    "cluster": {"name": "unit", "default_recipe": "r"},
    "nodes": [
        {
            "name": "spark1",
            "role": "head",
            "mgmt_ip": "192.0.2.1",
            "fabric_ip": "198.51.100.1/24",
            "fabric_ifaces": ["enp1s0f1np1"],
            "ssh": {"user": "spark"},
        },
        {
            "name": "spark2",
            "role": "worker",
            "mgmt_ip": "192.0.2.2",
            "fabric_ip": "198.51.100.2/24",
            "fabric_ifaces": ["enp1s0f1np1"],
            "ssh": {"user": "spark"},
        },
    ],
}


def _hash(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def make_deployment(topology: str = "solo", value: str = "1", worker_value: str | None = None) -> Deployment:
    """A deployment shaped like the real topologies: node.env, secrets.env, entry + run scripts, containers.
    `value` stands for a recipe value (it changes the files and the config hash of every engine);
    `worker_value` changes only the worker's."""
    inv = Inventory.model_validate(copy.deepcopy(INVENTORY))
    recipe = Recipe.model_validate(
        {
            "name": "r",
            "description": "d",
            "model": "org/model",
            "image": "vllm-node",
            "topologies": ["solo", "cluster", "2xsolo"],
            "default_topology": "solo",
            "weights_gb": 65,
        }
    )
    resolved = ResolvedRecipe(recipe, topology, "ray" if topology == "cluster" else "", Path("r.yaml"))
    secrets = Secrets({"HF_TOKEN": SECRET_HF, "LITELLM_MASTER_KEY": SECRET_KEY}, "unit")
    nodes = []
    used = inv.nodes[:1] if topology == "solo" else inv.nodes
    for node in used:
        v = worker_value if (worker_value is not None and node.role == "worker") else value
        role = {"solo": "solo", "2xsolo": "backend"}.get(topology, "head" if node.role == "head" else "worker")
        files = [
            FileSpec("node.env", f"# {node.name}\nVALUE={v}\n"),
            FileSpec("secrets.env", f"HF_TOKEN={SECRET_HF}\nLITELLM_MASTER_KEY={SECRET_KEY}\n", 0o600, True),
            FileSpec("vllm.entry.sh", f"exec vllm serve --x {v}\n", 0o755),
            FileSpec("vllm.run.sh", "docker run ...\n", 0o755),
        ]
        ports = (Listen(8000, "vLLM", "cluster.vllm_port"),) if role != "worker" else ()
        containers = [
            ContainerSpec(
                "sparkdeploy-vllm", role, IMAGE, "vllm.run.sh", _hash(topology, v), ports, 8000 if ports else None
            )
        ]
        if topology == "2xsolo" and node.role == "head":
            files += [FileSpec("litellm-config.yaml", "model_list: []\n"), FileSpec("litellm.run.sh", "run\n", 0o755)]
            containers.append(
                ContainerSpec(
                    "sparkdeploy-litellm",
                    "proxy",
                    PROXY_IMAGE,
                    "litellm.run.sh",
                    _hash("proxy"),
                    (Listen(4000, "the LiteLLM proxy", "cluster.proxy_port"),),
                    4000,
                )
            )
        nodes.append(NodeDeployment(node=node, state_dir=".sparkdeploy", files=files, containers=containers))
    head = inv.head
    endpoint = f"http://{head.mgmt_ip}:{4000 if topology == '2xsolo' else 8000}/v1"
    backends = [f"http://{n.mgmt_ip}:8000/v1" for n in inv.nodes] if topology == "2xsolo" else []
    return Deployment(
        inventory=inv,
        recipe=resolved,
        image=ImageDefinition(name="vllm-node"),
        image_tag=IMAGE,
        nodes=nodes,
        endpoint=endpoint,
        backends=backends,
        secrets=secrets,
    )


def empty_facts(node: str) -> NodeFacts:
    return NodeFacts(
        node=node,
        home="/home/spark",
        docker_ok=True,
        docker_version="28.0",
        images={IMAGE: IMAGE_ID, PROXY_IMAGE: PROXY_ID},
        mem_total_mb=122570,
        mem_available_mb=120000,
        disk_free_mb={"home": 500_000, "hf_cache": 500_000, "docker": 500_000},
        resources=True,
    )


def converged_facts(dep: Deployment, node: str) -> NodeFacts:
    """Facts of a node where `dep` was applied completely (what a second `up` reads)."""
    from sparkdeploy.deploy.plan import manifest_text

    f = empty_facts(node)
    nd = next((n for n in dep.nodes if n.node.name == node), None)
    if nd is None:
        return f
    f.state_dir_mode = 0o700
    for spec in nd.files:
        f.files[spec.name] = FileFact(spec.name, spec.mode, spec.sha256)
    manifest = FileSpec("manifest.json", manifest_text(dep, nd))
    f.files["manifest.json"] = FileFact("manifest.json", 0o644, manifest.sha256)
    f.manifest = json.loads(manifest.content)
    for i, c in enumerate(nd.containers):
        f.containers.append(
            ContainerFact(
                id=f"{i}" * 64,
                name=c.name,
                image_id=f.images[c.image] or "",
                image_ref=c.image,
                labels={
                    "io.sparkdeploy.managed": "true",
                    "io.sparkdeploy.recipe": dep.recipe.name,
                    "io.sparkdeploy.topology": dep.topology,
                    "io.sparkdeploy.role": c.role,
                    "io.sparkdeploy.config-hash": c.config_hash,
                },
                status="running",
                running=True,
                started_at="2026-01-01T00:00:00.123456789Z",
            )
        )
        f.listening.update(c.ports)
    return f
