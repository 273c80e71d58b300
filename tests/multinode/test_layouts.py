"""Layouts on N nodes, pure logic (no lab): cluster TP=N or TP=k x PP=N/k, replicas of TP=k, 2xsolo on N,
inventory groups, the model's heads, and the fabric (direct cable or switch) checks. The four-node lab tests
(test_four_nodes_lab.py) run these layouts for real."""

from __future__ import annotations

import copy

import pytest
import yaml

from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.errors import ConfigError
from sparkdeploy.topologies.context import load_deployment
from tests.conftest import TWO_NODES

RECIPE = "openai-gpt-oss-120b"  # architecture: 64 heads, 8 KV heads, 36 layers


def nodes(n: int) -> dict:
    data = copy.deepcopy(TWO_NODES)
    template = data["nodes"][1]
    data["nodes"] = data["nodes"][:1] + [
        dict(copy.deepcopy(template), name=f"spark{i}", mgmt_ip=f"192.0.2.{i}", fabric_ip=f"198.51.100.{i}/24")
        for i in range(2, n + 1)
    ]
    return data


@pytest.fixture
def four(write_inventory):
    return str(write_inventory(nodes(4)))


def args_of(dep, node: str) -> str:
    nd = dep.node(node)
    return next(f.content for f in nd.files if f.name.endswith(".entry.sh") and "litellm" not in f.name)


def env_of(dep, node: str) -> str:
    return dep.node(node).file("node.env").content


def test_cluster_on_four_is_tp4_by_default(four):
    dep = load_deployment(four, RECIPE, "cluster", "native")
    assert [nd.node.name for nd in dep.nodes] == ["spark1", "spark2", "spark3", "spark4"]
    for rank, nd in enumerate(dep.nodes):
        text = args_of(dep, nd.node.name)
        assert "--tensor-parallel-size 4" in text and "--pipeline-parallel-size" not in text
        assert f"--nnodes 4 --node-rank {rank} --master-addr 198.51.100.1" in text
    assert dep.engine_groups == [["spark1", "spark2", "spark3", "spark4"]]


@pytest.mark.parametrize("backend", ["ray", "torchrun", "native"])
def test_cluster_tp2_pp2_every_backend(four, backend):
    dep = load_deployment(four, RECIPE, "cluster", backend, sets=["tensor_parallel=2"])
    head = args_of(dep, "spark1")
    assert "--tensor-parallel-size 2 --pipeline-parallel-size 2" in head
    if backend == "ray":  # the head waits for all four Ray nodes before vLLM places the ranks
        assert "python3 - 4 600" in head and "--address=198.51.100.1:6379" in args_of(dep, "spark4")
    if backend == "torchrun":
        assert "--nnodes=4" in args_of(dep, "spark4") and "--node-rank=3" in args_of(dep, "spark4")


def test_replicas_tp2_on_four_nodes_is_two_engines(four):
    dep = load_deployment(four, RECIPE, "replicas", "native", sets=["tensor_parallel=2"])
    assert dep.engine_groups == [["spark1", "spark2"], ["spark3", "spark4"]]
    assert dep.backends == ["http://192.0.2.1:8000/v1", "http://192.0.2.3:8000/v1"]
    assert dep.endpoint == "http://192.0.2.1:4000/v1" and dep.proxied
    # each engine rendezvouses at its own rank 0
    assert "--nnodes 2 --node-rank 1 --master-addr 198.51.100.3" in args_of(dep, "spark4")
    assert "MASTER_ADDR=198.51.100.3" in env_of(dep, "spark4")
    assert "MASTER_ADDR=198.51.100.1" in env_of(dep, "spark2")
    config = yaml.safe_load(dep.node("spark1").file("litellm-config.yaml").content)
    assert [m["model_info"]["id"] for m in config["model_list"]] == ["spark1+spark2", "spark3+spark4"]
    # the default replica width is 2
    assert load_deployment(four, RECIPE, "replicas", "native").engine_groups == dep.engine_groups


def test_replicas_that_make_one_engine_warn(four, write_inventory):
    """Issue 30: replicas on two nodes (one TP=2 engine behind a proxy) was accepted silently."""
    two = load_deployment(str(write_inventory(TWO_NODES, name="two.yaml")), RECIPE, "replicas", "native")
    assert len(two.engine_groups) == 1
    assert any("one engine behind the proxy" in w and "--topology cluster" in w for w in two.warnings), two.warnings
    wide = load_deployment(four, RECIPE, "replicas", "native", sets=["tensor_parallel=4"])
    assert any("one engine behind the proxy" in w for w in wide.warnings)
    assert not any(
        "one engine behind the proxy" in w for w in load_deployment(four, RECIPE, "replicas", "native").warnings
    )


def test_2xsolo_on_four_nodes_is_four_engines(four):
    dep = load_deployment(four, RECIPE, "2xsolo")
    assert len(dep.backends) == 4 and dep.engine_groups == []


def test_explicit_groups_pick_the_pairs(write_inventory):
    data = nodes(4)
    data["groups"] = [["spark2", "spark4"], ["spark3", "spark1"]]
    inv = str(write_inventory(data))
    dep = load_deployment(inv, RECIPE, "replicas", "native")
    # the head's group goes first, the head as its rank 0
    assert dep.engine_groups == [["spark1", "spark3"], ["spark2", "spark4"]]
    dep = load_deployment(inv, RECIPE, "cluster", "native")
    assert dep.engine_groups == [["spark1", "spark3", "spark2", "spark4"]]
    assert "--tensor-parallel-size 2 --pipeline-parallel-size 2" in args_of(dep, "spark1")


def test_tp_must_divide_the_nodes(four):
    with pytest.raises(ConfigError) as err:
        load_deployment(four, RECIPE, "cluster", "native", sets=["tensor_parallel=3"])
    assert "TP=3 does not split 4 nodes" in str(err.value) and "(1, 2, 4)" in str(err.value)


def test_a_layout_the_heads_refuse_says_why(write_inventory):
    inv = str(write_inventory(nodes(4)))
    with pytest.raises(ConfigError) as err:  # 18 heads: TP=4 does not divide them; TP=2 x PP=2 does
        load_deployment(
            inv, RECIPE, "cluster", "native", sets=["architecture.attention_heads=18", "architecture.kv_heads=6"]
        )
    text = str(err.value)
    assert "cannot run TP=4 x PP=1: TP=4 does not divide its 18 attention heads" in text and "--tp 2" in text
    dep = load_deployment(
        inv,
        RECIPE,
        "cluster",
        "native",
        sets=["architecture.attention_heads=18", "architecture.kv_heads=6", "tensor_parallel=2"],
    )
    assert "--pipeline-parallel-size 2" in args_of(dep, "spark1")


def test_kv_heads_split_or_replicated(write_inventory):
    inv = str(write_inventory(nodes(4)))
    # 8 KV heads on 4 ranks split; 2 KV heads on 4 ranks are replicated (4 % 2 == 0): both allowed
    load_deployment(inv, RECIPE, "cluster", "native", sets=["architecture.kv_heads=2"])
    with pytest.raises(ConfigError, match="neither divides its 3 KV heads"):
        load_deployment(
            inv, RECIPE, "cluster", "native", sets=["architecture.attention_heads=24", "architecture.kv_heads=3"]
        )


@pytest.mark.parametrize(
    "groups,message",
    [
        ([["spark1", "spark2"], ["spark3"]], "groups of 1, 2 nodes"),
        ([["spark1", "spark2"], ["spark3", "spark9"]], "names 'spark9', not a node"),
        ([["spark1", "spark2"], ["spark2", "spark3"]], "spark2 is in group 0 and group 1"),
        ([["spark1", "spark2"]], "spark3, spark4 in no group"),
    ],
)
def test_bad_groups_are_refused_one_line_each(write_inventory, groups, message):
    data = nodes(4)
    data["groups"] = groups
    with pytest.raises(ConfigError) as err:
        load_inventory(write_inventory(data))
    assert message in str(err.value) and "groups" in str(err.value)


def test_groups_and_tp_must_agree(write_inventory):
    data = nodes(4)
    data["groups"] = [["spark1", "spark2"], ["spark3", "spark4"]]
    with pytest.raises(ConfigError, match="groups of 2 nodes, but tensor_parallel"):
        load_deployment(str(write_inventory(data)), RECIPE, "cluster", "native", sets=["tensor_parallel=4"])


def test_fabric_direct_cable_or_switch(write_inventory):
    data = nodes(4)
    assert load_inventory(write_inventory(data)).fabric == "switch"
    assert load_inventory(write_inventory(nodes(2))).fabric == "direct"
    data["cluster"]["fabric"] = "direct"
    with pytest.raises(ConfigError, match="a direct cable links two nodes, this inventory has 4"):
        load_inventory(write_inventory(data))
    data = nodes(4)
    data["nodes"][3]["fabric_ip"] = "198.51.101.4/24"
    with pytest.raises(ConfigError, match="fabric_ip on the switch's one subnet"):
        load_inventory(write_inventory(data))


def test_cli_tp_option_is_the_recipe_field(four, cli, tmp_path):
    code, _out, err = cli(
        "render", RECIPE, "-t", "replicas", "--tp", "4", "-b", "native", "-i", four, "--out", str(tmp_path / "r")
    )
    assert code == 0, err
    assert "--tensor-parallel-size 4" in (tmp_path / "r" / "spark1" / "vllm.entry.sh").read_text()
    code, _out, err = cli("render", RECIPE, "-t", "cluster", "--tp", "3", "-i", four, "--out", str(tmp_path / "s"))
    assert code == 2 and "TP=3 does not split 4 nodes" in err and "Traceback" not in err
