"""Inventory validation: one test per error message, and the shipped example."""

from __future__ import annotations

import copy

import pytest

from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.errors import ConfigError
from tests.conftest import REPO, TWO_NODES


def problems(write_inventory, mutate) -> list[str]:
    data = copy.deepcopy(TWO_NODES)
    mutate(data)
    path = write_inventory(data)
    with pytest.raises(ConfigError) as info:
        load_inventory(str(path))
    return [str(p) for p in info.value.problems]


def test_shipped_example_loads():
    inv = load_inventory(str(REPO / "inventory.yaml"))
    assert inv.head.name == "spark1"
    assert [w.name for w in inv.workers] == ["spark2"]
    assert inv.head.fabric_address == "192.168.100.10"


def test_hostname_is_rejected(write_inventory):
    out = problems(write_inventory, lambda d: d["nodes"][1].update(mgmt_ip="spark2.example.com"))
    assert out == [
        (
            f"{out[0].split(':')[0]}: nodes[1].mgmt_ip: 'spark2.example.com' is not an IP address "
            "(hostnames are not accepted) (fix: write the IP address)"
        )
    ]


def test_mdns_name_says_why(write_inventory):
    (line,) = problems(write_inventory, lambda d: d["nodes"][0].update(mgmt_ip="spark1.local"))
    assert "nodes[0].mgmt_ip" in line and "mDNS" in line and "do not resolve inside containers" in line


def test_mdns_fabric_name_is_rejected(write_inventory):
    (line,) = problems(write_inventory, lambda d: d["nodes"][1].update(fabric_ip="spark2.local/24"))
    assert "nodes[1].fabric_ip" in line and "mDNS" in line


def test_duplicate_management_ip(write_inventory):
    (line,) = problems(write_inventory, lambda d: d["nodes"][1].update(mgmt_ip="192.0.2.1"))
    assert "share the management IP 192.0.2.1" in line and "fix: give each node its own management IP" in line


def test_duplicate_fabric_ip(write_inventory):
    (line,) = problems(write_inventory, lambda d: d["nodes"][1].update(fabric_ip="198.51.100.1/24"))
    assert "share the fabric IP 198.51.100.1" in line


def test_duplicate_names(write_inventory):
    (line,) = problems(write_inventory, lambda d: d["nodes"][1].update(name="spark1"))
    assert "share the name spark1" in line


def test_fabric_ips_on_different_subnets(write_inventory):
    (line,) = problems(write_inventory, lambda d: d["nodes"][1].update(fabric_ip="198.51.101.2/24"))
    assert "fabric IPs are on different subnets (198.51.100.0/24, 198.51.101.0/24)" in line


def test_fabric_ip_needs_prefix(write_inventory):
    (line,) = problems(write_inventory, lambda d: d["nodes"][1].update(fabric_ip="198.51.100.2"))
    assert "has no prefix length" in line and "198.51.100.2/24" in line


def test_unknown_key_did_you_mean(write_inventory):
    def mutate(d):
        d["nodes"][0]["fabric_iface"] = d["nodes"][0].pop("fabric_ifaces")

    out = problems(write_inventory, mutate)
    assert any("nodes[0].fabric_iface: unknown key (fix: did you mean 'fabric_ifaces'?)" in p for p in out)


def test_unknown_cluster_key(write_inventory):
    (line,) = problems(write_inventory, lambda d: d["cluster"].update(proxy_prot=4000))
    assert "cluster.proxy_prot: unknown key (fix: did you mean 'proxy_port'?)" in line


def test_exactly_one_head(write_inventory):
    (line,) = problems(write_inventory, lambda d: d["nodes"][1].update(role="head"))
    assert "2 nodes have role head" in line


def test_bad_interface_name(write_inventory):
    (line,) = problems(write_inventory, lambda d: d["nodes"][0].update(fabric_ifaces=["eth0; reboot"]))
    assert "is not a Linux interface name" in line


def test_bad_hca_name(write_inventory):
    (line,) = problems(write_inventory, lambda d: d["nodes"][0].update(hcas=["$(id)"]))
    assert "is not an RDMA device name" in line


def test_state_dir_must_be_relative(write_inventory):
    (line,) = problems(write_inventory, lambda d: d["cluster"].update(state_dir="/etc"))
    assert "state_dir" in line and "relative to the SSH user's home" in line


def test_invalid_yaml(write_inventory):
    path = write_inventory("nodes: [\n")
    with pytest.raises(ConfigError) as info:
        load_inventory(str(path))
    assert "not valid YAML" in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_inventory(str(tmp_path / "nope.yaml"))
    assert "cannot read" in str(info.value)


def test_lab_alias_when_lab_is_down(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKDEPLOY_STATE", str(tmp_path))
    with pytest.raises(ConfigError) as info:
        load_inventory("lab")
    assert "the lab is not up" in str(info.value) and "sparkdeploy lab up" in str(info.value)


def test_paths_are_relative_to_the_inventory(inventory_file):
    inv = load_inventory(str(inventory_file))
    assert inv.local_path(inv.cluster.secrets_file) == inventory_file.parent / "secrets.env"
    assert inv.local_path("~/x") == __import__("pathlib").Path.home() / "x"
