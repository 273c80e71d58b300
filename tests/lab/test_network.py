"""Real interfaces: the fabric link has jumbo frames end to end, under the Spark's interface name."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.lab


def _link(lab, node, iface):
    return json.loads(lab.ssh(node, f"ip -j addr show dev {iface}").stdout)[0]


def test_fabric_interface_name_address_and_mtu(lab):
    for node in lab.nodes:
        link = _link(lab, node, lab.spec.fabric_iface)
        assert link["mtu"] == 9000
        assert f"{node.fabric_ip}/{node.prefixlen}" in [f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"]]
        assert link["operstate"] == "UP"


def test_management_keeps_default_route(lab):
    for node in lab.nodes:
        route = json.loads(lab.ssh(node, "ip -j route show default").stdout)
        assert route[0]["gateway"] == lab.spec.gateway(lab.spec.mgmt_subnet)


def test_jumbo_frames_between_fabric_ips(lab):
    a, b = lab.nodes[0], lab.nodes[-1]
    assert a != b, "the lab has two nodes"
    ok = lab.ssh(a, f"ping -c 2 -W 2 -M do -s 8972 {b.fabric_ip}", check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    too_big = lab.ssh(a, f"ping -c 1 -W 2 -M do -s 8973 {b.fabric_ip}", check=False)
    assert too_big.returncode != 0
    assert "message too long" in (too_big.stdout + too_big.stderr).lower()
