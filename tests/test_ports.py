"""Issue 35 item 4: one port map per node (sparkdeploy/topologies/ports.py), from the containers as rendered.

Before, `vllm_port: 6379` (= ray_port) rendered a cluster that started Ray and vLLM on 6379, and a stack put a
solo engine on the port a cluster deployment's Ray head uses on the same node: both passed. Now every collision
is refused before anything starts, naming both owners and proposing a free port.
"""

from __future__ import annotations

import json

import pytest
import yaml

from sparkdeploy.config.secrets import Secrets
from sparkdeploy.deploy.stack.file import load_stack
from sparkdeploy.errors import ConfigError
from sparkdeploy.recipes.recipe import resolve
from sparkdeploy.topologies import build_deployment
from tests.conftest import TWO_NODES


def _inventory(write_inventory, **cluster):
    data = json.loads(json.dumps(TWO_NODES))
    data["cluster"].update(cluster)
    return write_inventory(data)


@pytest.mark.parametrize(
    "args, cluster, owners, fix",
    [
        (
            ["-t", "cluster", "--backend", "ray"],
            {"vllm_port": 6379},
            "port 6379 on spark1: vLLM (cluster.vllm_port) and the Ray head (cluster.ray_port)",
            "set cluster.ray_port to a port free on spark1, e.g. 6380",
        ),
        (
            ["-t", "cluster", "--backend", "torchrun"],
            {"vllm_port": 29500},
            "port 29500 on spark1: vLLM (cluster.vllm_port) and torchrun's rendezvous (cluster.master_port)",
            "e.g. 29501",
        ),
        (
            ["-t", "cluster", "--backend", "native"],
            {"master_port": 8000},
            "port 8000 on spark1: vLLM (cluster.vllm_port) and vLLM's multi-node master (cluster.master_port)",
            "e.g. 8001",
        ),
        (
            ["-t", "2xsolo"],
            {"proxy_port": 8000},
            "port 8000 on spark1: vLLM (cluster.vllm_port) and the LiteLLM proxy (cluster.proxy_port)",
            "e.g. 8001",
        ),
        (
            ["-t", "solo", "--metrics"],
            {"metrics_port": 8000},
            "port 8000 on spark1: vLLM (cluster.vllm_port) and Prometheus (cluster.metrics_port)",
            "e.g. 8001",
        ),
    ],
)
def test_one_deployment_s_ports_collide_on_a_node(cli, write_inventory, args, cluster, owners, fix):
    inv = _inventory(write_inventory, **cluster)
    code, _out, err = cli("run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", str(inv), *args)
    assert code == 2 and "Traceback" not in err, err
    assert owners in err and fix in err, err


def test_distinct_ports_render_and_the_map_lists_every_listener(write_inventory):
    from sparkdeploy.config.inventory import load_inventory
    from sparkdeploy.topologies.ports import PortMap

    inv = load_inventory(_inventory(write_inventory, metrics=True))
    dep = build_deployment(inv, resolve("openai-gpt-oss-120b", "cluster", "ray"), Secrets())
    ports = PortMap()
    ports.add_deployment(dep)
    on_head = {p: [o.listen.what for o in owners] for p, owners in ports.owners["spark1"].items()}
    assert on_head == {8000: ["vLLM"], 6379: ["the Ray head"], 9090: ["Prometheus"], 7390: ["the guard's watcher"]}
    assert ports.problems("inventory.yaml") == []


def _stack(tmp_path, deployments, **gateway):
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump({"deployments": deployments, **({"gateway": gateway} if gateway else {})}))
    return str(path)


@pytest.mark.parametrize(
    "backend, port, owner",
    [("ray", 6379, "big's the Ray head"), ("torchrun", 29500, "big's torchrun's rendezvous")],
)
def test_a_stack_engine_on_a_cluster_member_s_ray_or_torchrun_port(tmp_path, inventory_file, backend, port, owner):
    path = _stack(
        tmp_path,
        [
            {"name": "big", "recipe": "openai-gpt-oss-120b", "topology": "cluster", "backend": backend, "memory": 0.3},
            {"name": "small", "recipe": "openai-gpt-oss-20b", "topology": "solo", "nodes": ["spark1"], "port": port},
        ],
    )
    with pytest.raises(ConfigError) as exc:
        load_stack(path, str(inventory_file))
    (line,) = [str(p) for p in exc.value.problems]
    assert f"port {port} on spark1: {owner}" in line and "small's vLLM (deployments[1].port)" in line, line
    assert f"set deployments[1].port to a port free on spark1, e.g. {port + 1}" in line, line


def test_a_stack_engine_on_the_gateway_port_names_both(tmp_path, inventory_file):
    path = _stack(
        tmp_path, [{"name": "a", "recipe": "openai-gpt-oss-20b", "topology": "solo", "port": 8000}], port=8000
    )
    with pytest.raises(ConfigError) as exc:
        load_stack(path, str(inventory_file))
    assert "port 8000 on spark1: the gateway (gateway.port) and a's vLLM (deployments[0].port)" in str(exc.value)
