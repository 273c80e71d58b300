"""A direct mesh of three Sparks and a ring of four: one /30 per cable, each node's cabled ports rendered with
their cable's address at MTU 9000 and parsed by Debian's real netplan; every cable pinged from its own port;
bad cabling refused one line each before anything connects."""

from __future__ import annotations

import ipaddress

import pytest
import yaml
from pydantic import ValidationError

from sparkdeploy.config.inventory import Inventory, load_inventory
from sparkdeploy.config.schema import problems_from_validation
from sparkdeploy.dayzero import netplan
from sparkdeploy.dayzero.network_setup import ping_targets
from sparkdeploy.errors import ConfigError
from tests.dayzero.netplan_real import files, generate
from tests.test_render import deployment

P0, P1 = "enp1s0f0np0", "enp1s0f1np1"


def wired(n: int, layout: str, cabling: dict[int, list[tuple[str, int]]] | None = None, **cluster) -> dict:
    """n nodes; default cabling: a ring, node i's P0 to node i+1's P1 (for three nodes, the full mesh)."""
    if cabling is None:
        cabling = {i: [] for i in range(n)}
        for i in range(n):
            j = (i + 1) % n
            cabling[i].append((P0, j))
            cabling[j].append((P1, i))
    return {
        "cluster": {"name": "sparks", "fabric": layout, **cluster},
        "nodes": [
            {
                "name": f"spark{i + 1}",
                "role": "head" if i == 0 else "worker",
                "mgmt_ip": f"192.168.1.{101 + i}",
                "fabric_ip": f"192.168.1.{101 + i}/24",  # the meeting address: the management one
                "fabric_ifaces": [P0, P1],
                "socket_iface": "enP7s7",
                "hcas": ["rocep1s0f0", "roceP2p1s0f0", "rocep1s0f1", "roceP2p1s0f1"],
                "links": [{"port": port, "peer": f"spark{j + 1}"} for port, j in cabling.get(i, [])],
            }
            for i in range(n)
        ],
    }


LAYOUTS = [(3, "mesh"), (4, "ring")]


@pytest.mark.parametrize(("n", "layout"), LAYOUTS)
def test_every_node_gets_its_cables_addresses(n, layout):
    inv = Inventory.model_validate(wired(n, layout))
    cables = inv.cables
    assert len(cables) == n
    nets = [c.network for c in cables]
    assert all(not a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1 :]), nets
    assert all(net.subnet_of(ipaddress.ip_network("192.168.200.0/24")) and net.prefixlen == 30 for net in nets)
    addresses: dict[str, str] = {}
    for node in inv.nodes:
        eth = yaml.safe_load(netplan.render_node(inv, node, None))["network"]["ethernets"]
        assert set(eth) == {P0, P1}, eth  # both ports cabled, the fabric_ip on none of them
        for port, conf in eth.items():
            assert conf["mtu"] == 9000
            (addr,) = conf["addresses"]
            addresses[f"{node.name}:{port}"] = addr
    # the two ends of every cable share its /30, and no address repeats
    assert len(set(addresses.values())) == 2 * n
    for c in cables:
        a, b = addresses[f"{c.a.node}:{c.a.port}"], addresses[f"{c.b.node}:{c.b.port}"]
        assert ipaddress.ip_interface(a).network == ipaddress.ip_interface(b).network == c.network


@pytest.mark.lab  # Debian's real netplan runs in the bare lab node image (built once, for the bare lab too)
@pytest.mark.parametrize(("n", "layout"), LAYOUTS)
def test_the_real_netplan_parses_every_nodes_cables(n, layout):
    inv = Inventory.model_validate(wired(n, layout))
    for node in inv.nodes:
        text = netplan.render_node(inv, node, None)
        eth = yaml.safe_load(text)["network"]["ethernets"]
        r = generate(text)
        assert r.returncode == 0, r.stderr
        out = files(r.stdout)
        for port in (P0, P1):
            network = out[f"10-netplan-{port}.network"]
            assert f"Address={eth[port]['addresses'][0]}" in network and "MTUBytes=9000" in network


def test_addresses_are_deterministic_and_follow_the_inventory_order():
    inv = Inventory.model_validate(wired(3, "mesh", mesh_subnet="10.77.0.0/28"))
    got = [(c.a.node, c.a.port, c.a.address, c.b.node, c.b.port, c.b.address) for c in inv.cables]
    assert got == [
        ("spark1", P0, "10.77.0.1/30", "spark2", P1, "10.77.0.2/30"),
        ("spark1", P1, "10.77.0.5/30", "spark3", P0, "10.77.0.6/30"),
        ("spark2", P0, "10.77.0.9/30", "spark3", P1, "10.77.0.10/30"),
    ]
    assert got == [
        (c.a.node, c.a.port, c.a.address, c.b.node, c.b.port, c.b.address)
        for c in Inventory.model_validate(wired(3, "mesh", mesh_subnet="10.77.0.0/28")).cables
    ]


def test_every_cable_is_pinged_from_its_own_port():
    inv = Inventory.model_validate(wired(4, "ring"))
    spark1 = inv.nodes[0]
    targets = dict(ping_targets(inv, spark1))
    # spark1's P0 goes to spark2's P1 (cable 0: .0/30), its P1 to spark4's P0 (cable 1: .4/30, spark4 .6);
    # spark3 is no neighbour: no ping to it
    assert targets == {P0: ["192.168.200.2"], P1: ["192.168.200.6"]}, targets
    direct = Inventory.model_validate(
        {
            "nodes": [
                {
                    "name": "a",
                    "role": "head",
                    "mgmt_ip": "10.0.0.1",
                    "fabric_ip": "192.168.100.1/24",
                    "fabric_ifaces": [P1],
                },
                {"name": "b", "mgmt_ip": "10.0.0.2", "fabric_ip": "192.168.100.2/24", "fabric_ifaces": [P1]},
            ]
        }
    )
    assert ping_targets(direct, direct.nodes[0]) == [(P1, ["192.168.100.2"])]


def _lines(data: dict) -> list[str]:
    """The problems users see (one line each, file, field and fix) for an inventory that does not validate."""
    with pytest.raises(ValidationError) as exc:
        Inventory.model_validate(data)
    return [str(p) for p in problems_from_validation(exc.value, "inventory.yaml", Inventory) if p.fix]


def test_one_end_only_port_twice_and_unknown_peer():
    data = wired(3, "mesh")
    data["nodes"][1]["links"] = [{"port": P1, "peer": "spark1"}]  # spark2 forgets its cable to spark3
    lines = _lines(data)
    assert any("spark3's enp1s0f1np1 goes to spark2, but spark2 lists no cable to spark3" in x for x in lines), lines
    data = wired(3, "mesh")
    data["nodes"][0]["links"][1]["port"] = P0
    lines = _lines(data)
    assert any("port enp1s0f0np0 of spark1 is listed twice" in x for x in lines), lines
    data = wired(3, "mesh")
    data["nodes"][0]["links"][0]["peer"] = "spark9"
    assert any("goes to spark9, not a node of this inventory" in x for x in _lines(data))
    data = wired(3, "mesh")
    data["nodes"][0]["links"][0]["port"] = "enp9s0"
    assert any("enp9s0 is not in spark1's fabric_ifaces" in x for x in _lines(data))


def test_node_counts_the_layout_cannot_wire():
    lines = _lines(wired(4, "mesh"))
    assert any("a full mesh of 4 nodes needs 3 ConnectX-7 ports per node and a Spark has 2" in x for x in lines)
    assert any("fabric: ring" in x for x in lines)
    assert any("links three or more nodes, this inventory has 2" in x for x in _lines(wired(2, "mesh")))
    # a ring of four where two pairs are cabled to each other: two loops, not one ring
    two_loops = wired(
        4, "ring", {0: [(P0, 1), (P1, 1)], 1: [(P1, 0), (P0, 0)], 2: [(P0, 3), (P1, 3)], 3: [(P1, 2), (P0, 2)]}
    )
    assert any("cabled 2 times" in x for x in _lines(two_loops))
    missing = wired(3, "mesh", {0: [(P0, 1)], 1: [(P1, 0)], 2: []})
    assert any("spark1 and spark3 have no cable" in x for x in _lines(missing))


def test_overlapping_subnets_and_links_outside_a_mesh():
    lines = _lines(wired(3, "mesh", mesh_subnet="192.168.1.0/24"))
    assert any("cluster.mesh_subnet: 192.168.1.0/24 overlaps spark1's mgmt_ip 192.168.1.101" in x for x in lines)
    assert any("holds 1 cables of /30" in x for x in _lines(wired(3, "mesh", mesh_subnet="10.9.0.0/30")))
    switch = wired(3, "mesh")
    switch["cluster"]["fabric"] = "switch"
    for node in switch["nodes"]:
        node["fabric_ip"] = node["mgmt_ip"].replace("192.168.1.", "192.168.100.") + "/24"
        del node["socket_iface"]
    assert any("cables are listed for a direct mesh or ring only" in x for x in _lines(switch))


def test_bad_cabling_is_one_line_each_exit_2_and_nothing_connects(cli, tmp_path):
    data = wired(4, "mesh")
    for i, node in enumerate(data["nodes"]):
        node["mgmt_ip"] = f"192.0.2.{10 + i}"  # TEST-NET: a connection attempt would hang, not pass
        node["fabric_ip"] = f"192.0.2.{10 + i}/24"
    data["nodes"][0]["links"].append({"port": P0, "peer": "spark3"})
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError):
        load_inventory(path)
    code, out, err = cli("setup", "network", "-i", str(path), "--dry-run")
    assert code == 2, (out, err)
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "inventory.yaml" in line]
    assert any("full mesh of 4 nodes" in line for line in lines), err
    assert any("port enp1s0f0np0 of spark1 is listed twice" in line for line in lines), err
    assert len(lines) == len(set(lines)) >= 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inventory.yaml"]


def test_the_mesh_node_env_meets_on_the_socket_iface_and_uses_every_hca():
    inv = wired(3, "mesh")
    dep = deployment("cluster", "ray", recipe="glm-4.7-flash-int4", inventory=inv)
    env = dict(line.split("=", 1) for line in dep.nodes[1].file("node.env").content.splitlines() if "=" in line)
    for key in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
        assert env[key] == "enP7s7", env  # the interface of VLLM_HOST_IP / MASTER_ADDR, not the cables
    assert env["VLLM_HOST_IP"] == "192.168.1.102" and env["MASTER_ADDR"] == "192.168.1.101"
    assert env["NCCL_IB_HCA"] == "rocep1s0f0,roceP2p1s0f0,rocep1s0f1,roceP2p1s0f1"
    assert env["NCCL_IB_SUBNET_AWARE_ROUTING"] == "1" and env["NCCL_IB_MERGE_NICS"] == "0"
    del inv["nodes"][2]["socket_iface"]
    assert any("nodes[2].socket_iface: in a mesh no cable reaches every node" in x for x in _lines(inv))
