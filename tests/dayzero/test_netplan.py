"""The fabric's netplan file: rendered from the inventory, parsed by the real netplan (lab: in the bare node image);
bad input refused."""

from __future__ import annotations

import pytest
import yaml

from sparkdeploy.config.inventory import Inventory
from sparkdeploy.dayzero import netplan
from sparkdeploy.dayzero.discover import DiscoveredNode
from sparkdeploy.errors import ConfigError
from tests.dayzero.netplan_real import files, generate


def inventory(nodes: int = 2, ifaces=(("enp1s0f1np1",), ("enP2p1s0f1np1",)), fabric=None) -> Inventory:
    data = {
        "cluster": {"name": "sparks", **({"fabric": fabric} if fabric else {})},
        "nodes": [
            {
                "name": f"spark{i + 1}",
                "role": "head" if i == 0 else "worker",
                "mgmt_ip": f"192.168.1.{101 + i}",
                "fabric_ip": f"192.168.100.{10 + i}/24",
                "fabric_ifaces": list(ifaces[i % len(ifaces)]),
            }
            for i in range(nodes)
        ],
    }
    return Inventory.model_validate(data)


def facts(node, extra: dict | None = None, max_mtu: int = 9216) -> DiscoveredNode:
    addresses = {"enP7s7": [f"{node.mgmt_ip}/24"], "enp1s0f1np1": [], "enP2p1s0f1np1": [], "enp1s0f0np0": []}
    addresses.update(extra or {})
    return DiscoveredNode(
        host=node.mgmt_ip, mgmt_iface="enP7s7", addresses=addresses, max_mtu=dict.fromkeys(addresses, max_mtu)
    )


def test_direct_cable_names_differing_per_node():
    inv = inventory()
    for node in inv.nodes:
        text = netplan.render_node(inv, node, facts(node))
        assert text.startswith(netplan.MARKER)
        data = yaml.safe_load(text)["network"]["ethernets"]
        own, other = node.fabric_ifaces[0], netplan.twin(node.fabric_ifaces[0])
        assert data[own]["addresses"] == [node.fabric_ip] and data[own]["mtu"] == 9000
        assert data[other] == {"dhcp4": False, "dhcp6": False, "link-local": [], "mtu": 9000}  # the twin: MTU


def test_both_ports_get_a_subnet_each_and_a_switch_of_four_one_subnet():
    inv = inventory(ifaces=(("enp1s0f0np0", "enp1s0f1np1"),))
    data = yaml.safe_load(netplan.render_node(inv, inv.nodes[1], None))["network"]["ethernets"]
    assert data["enp1s0f0np0"]["addresses"] == ["192.168.100.11/24"]
    assert data["enp1s0f1np1"]["addresses"] == ["192.168.101.11/24"]
    switch = inventory(nodes=4, ifaces=(("enp1s0f1np1",),), fabric="switch")
    texts = [netplan.render_node(switch, n, None) for n in switch.nodes]
    assert "switch" in texts[3] and yaml.safe_load(texts[3])["network"]["ethernets"]["enp1s0f1np1"]["addresses"] == [
        "192.168.100.13/24"
    ]


# Debian's real netplan on the files above: in the bare lab node image (built once in the lab suite, which the
# bare lab needs too), so the fast suite builds no image.


@pytest.mark.lab
def test_the_real_netplan_parses_a_direct_cable_both_ports_and_a_switch():
    inv = inventory()
    for node in inv.nodes:
        own, other = node.fabric_ifaces[0], netplan.twin(node.fabric_ifaces[0])
        r = generate(netplan.render_node(inv, node, facts(node)))
        assert r.returncode == 0, r.stderr
        generated = files(r.stdout)
        network = generated[f"10-netplan-{own}.network"]
        assert f"Address={node.fabric_ip}" in network and "MTUBytes=9000" in network
        assert "MTUBytes=9000" in generated[f"10-netplan-{other}.network"]
    both = inventory(ifaces=(("enp1s0f0np0", "enp1s0f1np1"),))
    r = generate(netplan.render_node(both, both.nodes[1], None))
    assert r.returncode == 0, r.stderr
    switch = inventory(nodes=4, ifaces=(("enp1s0f1np1",),), fabric="switch")
    r = generate(netplan.render_node(switch, switch.nodes[3], None))
    assert r.returncode == 0, r.stderr


@pytest.mark.lab
def test_networkmanager_renders_through_netplan():
    inv = inventory()
    text = netplan.render_node(inv, inv.nodes[0], None, renderer="NetworkManager")
    r = generate(text)
    assert r.returncode == 0, r.stderr
    assert any(name.endswith(".nmconnection") for name in files(r.stdout)), r.stdout


def test_a_node_value_cannot_inject_yaml():
    inv = inventory()
    node = inv.nodes[0].model_copy(update={"name": "a\nnetwork: {}"})
    text = netplan.render_node(inv, node, None)
    assert yaml.safe_load(text)["network"]["version"] == 2


def test_bad_input_one_line_each():
    inv = inventory(ifaces=(("enp1s0f9np9",), ("enP7s7",)))
    a, b = inv.nodes
    found = [str(p) for p in netplan.problems(inv, {"spark1": facts(a), "spark2": facts(b)})]
    assert any("enp1s0f9np9 is not an interface of spark1" in p for p in found), found
    assert any("enP7s7 carries spark2's management address" in p for p in found), found

    inv = inventory()
    a, b = inv.nodes
    found = [
        str(p)
        for p in netplan.problems(
            inv,
            {
                "spark1": facts(a, {"wlP9s9": ["192.168.100.77/24"]}, max_mtu=1500),
                "spark2": facts(b, {"docker0": ["192.168.100.10/16"]}),
            },
        )
    ]
    assert any("overlaps 192.168.100.0/24 of spark1's wlP9s9" in p for p in found), found
    assert any("192.168.100.10 is already in use on spark2 (docker0)" in p for p in found), found
    assert any("takes at most MTU 1500, not 9000" in p for p in found), found
    with pytest.raises(ConfigError):
        netplan.check(inv, {"spark1": facts(a, max_mtu=1500), "spark2": facts(b)})
    assert netplan.problems(inv, {"spark1": facts(a), "spark2": facts(b)}) == []
