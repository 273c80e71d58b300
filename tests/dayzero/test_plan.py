"""plan: the proposed inventory and one line per problem, from parsed facts of Spark-format output."""

from __future__ import annotations

import json

import pytest
import yaml

from sparkdeploy.cli.common import run_cli
from sparkdeploy.cli.main import cli
from sparkdeploy.config.inventory import Inventory
from sparkdeploy.dayzero import inventory_text
from sparkdeploy.dayzero.discover import from_facts
from sparkdeploy.dayzero.init import lab_notes
from sparkdeploy.dayzero.proposal import inventory_data, merge, plan
from sparkdeploy.errors import ConfigError
from sparkdeploy.facts import parse
from tests.dayzero.spark_samples import spark_output


def node(mgmt: str, key: str = "", **kw):
    kw.setdefault("machine_id", "m-" + mgmt)
    kw.setdefault("hostname", "spark-" + mgmt.rsplit(".", 1)[1])
    return from_facts(mgmt, parse(mgmt, spark_output(mgmt=mgmt, **kw)), key or "SHA256:" + mgmt)


def pair(**kw):
    return [node("192.168.1.101", **kw), node("192.168.1.102", **kw)]


def lines(result):
    return [f"{f.severity} {f.line()}" for f in result.findings]


def test_a_new_pair_gets_one_subnet_proposed_and_a_valid_commented_inventory():
    result = plan(pair())
    assert lines(result) == []
    assert result.subnet == "192.168.100.0/24"
    data = inventory_data(result, "spark", None, "/tmp/kh")
    a, b = data["nodes"]
    assert (a["role"], b["role"]) == ("head", "worker")
    assert (a["fabric_ip"], b["fabric_ip"]) == ("192.168.100.10/24", "192.168.100.11/24")
    assert a["fabric_ifaces"] == ["enp1s0f1np1"] and a["hcas"] == ["rocep1s0f1", "roceP2p1s0f1"]
    assert "gid_index" not in a  # no address on the link yet: unknown
    text = inventory_text.render(result, data, ["192.168.1.101", "192.168.1.102"])
    assert yaml.safe_load(text) == data
    Inventory.model_validate(yaml.safe_load(text))
    assert "PROPOSED" in text and "enp1s0f1np1/enP2p1s0f1np1" in text and "SIMULATED" not in text


def test_addresses_the_link_has_are_kept_with_their_gid_index():
    a = node("192.168.1.101", fabric_addr="10.9.0.1/30", mtu=9000)
    b = node("192.168.1.102", fabric_addr="10.9.0.2/30", mtu=9000)
    result = plan([a, b])
    data = inventory_data(result, None, None, "/tmp/kh")
    assert [n["fabric_ip"] for n in data["nodes"]] == ["10.9.0.1/30", "10.9.0.2/30"]
    assert [n["gid_index"] for n in data["nodes"]] == [3, 3]


def test_a_proposed_subnet_avoids_the_management_network():
    result = plan([node("192.168.100.5"), node("192.168.100.6")])
    assert result.subnet == "192.168.101.0/24"


def test_problems_one_line_each_and_nothing_is_proposed_for_a_broken_pair():
    result = plan([node("192.168.1.101", gpu_rc=127), node("192.168.1.102", up_port=None)])
    assert lines(result) == [
        (
            "error 192.168.1.101: no GB10 GPU: nvidia-smi says nvidia-smi not found (fix: is this a DGX Spark? "
            "check the address, and `nvidia-smi` on its console)"
        ),
        (
            "error 192.168.1.102: no ConnectX-7 port is up: enp1s0f0np0/enP2p1s0f0np0 down, "
            "enp1s0f1np1/enP2p1s0f1np1 down (fix: plug the QSFP cable into the same port on both Sparks (the one "
            "nearer the edge), then run init again)"
        ),
    ]


def test_two_addresses_of_one_machine():
    a = node("192.168.1.101", machine_id="same")
    b = node("192.168.1.102", machine_id="same")
    assert [f.message for f in plan([a, b]).errors] == [
        "is the same machine as 192.168.1.101: the same machine-id (same...)"
    ]
    c = node("192.168.1.103", machine_id="", key="SHA256:k")
    d = node("192.168.1.104", machine_id="", key="SHA256:k")
    assert "the same SSH host key (SHA256:k)" in plan([c, d]).errors[0].message


def test_the_cable_in_different_ports_is_a_warning_and_each_node_keeps_its_names():
    result = plan([node("192.168.1.101", up_port="f1"), node("192.168.1.102", up_port="f0")])
    assert result.errors == []
    assert len(result.warnings) == 1 and "different ports" in result.warnings[0].message
    data = inventory_data(result, None, None, "/tmp/kh")
    assert [n["fabric_ifaces"] for n in data["nodes"]] == [["enp1s0f1np1"], ["enp1s0f0np0"]]


def test_a_host_reached_over_its_cx7_port_is_refused():
    f = node("192.168.100.10", fabric_addr="192.168.100.10/24")
    assert any("not of the management network" in x.message for x in plan([f, node("192.168.1.102")]).errors)


def test_a_slow_link_is_a_warning():
    assert "100 Gb/s" in plan(pair(speed=100000)).warnings[0].message


def test_a_fabric_subnet_that_overlaps_the_management_network_is_bad_input():
    with pytest.raises(ConfigError) as exc:
        plan(pair(), fabric_subnet="192.168.1.0/24")
    assert "overlaps 192.168.1.101/24" in str(exc.value) and "--fabric-subnet" in str(exc.value)


def test_comments_cannot_add_lines_from_what_a_node_says():
    f = node("192.168.1.101")
    f.hostname = "evil\nnodes: []"  # set after parsing: the parser itself keeps only the first line
    result = plan([f, node("192.168.1.102")])
    data = inventory_data(result, None, None, "/tmp/kh")
    text = inventory_text.render(result, data, ["192.168.1.101", "192.168.1.102"])
    assert yaml.safe_load(text) == data and "\nnodes: []" not in text


def test_bad_hosts_one_line_each_exit_2(tmp_path, capsys):
    argv = ["init", "--hosts", "spark1.local,10.0.0.1,10.0.0.1,224.0.0.1", "--out", str(tmp_path / "i")]
    assert run_cli(cli, argv) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(lines) == 3, lines
    assert "mDNS" in lines[0] and "10.0.0.1 is given twice" in lines[1] and "multicast" in lines[2]
    assert not (tmp_path / "i").exists()


def test_init_again_merges_the_new_readings_into_the_owners_inventory():
    """The owner's values win (cluster settings, names, addresses, ssh, other keys); what init reads from a node
    (interfaces, RDMA devices, the GID index) replaces the old; --hosts orders the nodes and names the head; a node
    no longer in --hosts is dropped and said."""
    result = plan(
        [node("192.168.1.101", fabric_addr="10.9.0.1/24", mtu=9000), node("192.168.1.102", fabric_addr="10.9.0.2/24")]
    )
    new = inventory_data(result, "spark", None, "/tmp/kh")
    old = {
        "cluster": {"name": "home", "default_recipe": "glm-4.7-flash", "known_hosts": "/mine/kh"},
        "nodes": [
            {**new["nodes"][0], "name": "left", "fabric_ip": "10.9.0.5/24", "hcas": ["old"], "ssh": {"port": 2222}},
            {**new["nodes"][1], "role": "head"},
            {"name": "gone", "role": "worker", "mgmt_ip": "192.168.1.103", "fabric_ip": "10.9.0.6/24"},
        ],
        "groups": [["left", "spark-102"]],
    }
    for n in old["nodes"][:2]:
        n.pop("gid_index", None)
    merged, changes = merge(old, new)
    assert merged["cluster"] == {"name": "home", "known_hosts": "/mine/kh", "default_recipe": "glm-4.7-flash"}
    assert merged["groups"] == old["groups"]
    a, b = merged["nodes"]
    assert (a["name"], a["fabric_ip"], a["role"], b["role"]) == ("left", "10.9.0.5/24", "head", "worker")
    assert a["hcas"] == new["nodes"][0]["hcas"] and a["gid_index"] == new["nodes"][0]["gid_index"]
    assert a["ssh"] == {"port": 2222, "user": "spark"}
    assert "left.hcas: ['old'] -> " in changes[0] and "(read from the node now)" in changes[0]
    assert any(c.startswith("spark-102.role: head -> worker") for c in changes)
    assert changes[-1] == "node gone (192.168.1.103) is dropped: not in --hosts"
    text = inventory_text.render(result, merged, ["192.168.1.101", "192.168.1.102"], "bare")
    assert "These nodes are the sparkdeploy lab `bare`" in text
    Inventory.model_validate(yaml.safe_load(text))


def test_the_comments_init_writes_are_told_from_the_owners():
    text = inventory_text.render(plan(pair()), inventory_data(plan(pair()), "spark", None, "/kh"), ["a", "b"], "bare")
    comments = [line for line in text.splitlines() if line.lstrip().startswith("#")]
    assert comments and all(inventory_text.ours(line) for line in comments)
    assert not inventory_text.ours("# my own note") and not inventory_text.ours("  # spark1 is the one by the door")


def test_hosts_of_a_bare_lab_are_found_in_its_notes(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKDEPLOY_STATE", str(tmp_path))
    (tmp_path / "lab-bare").mkdir()
    notes = {"hosts": ["172.30.100.11", "172.30.100.12"], "fabric_subnet": "172.30.101.0/24", "lab_cluster": {}}
    (tmp_path / "lab-bare" / "bare.json").write_text(json.dumps(notes))
    assert lab_notes(["172.30.100.11", "172.30.100.12"])["name"] == "bare"
    assert lab_notes(["172.30.100.12"])["fabric_subnet"] == "172.30.101.0/24"
    assert lab_notes(["172.30.100.11", "192.168.1.102"]) is None
