"""discover.from_facts on the fact layer's DAYZERO set: a DGX Spark's output (real formats), the lab's stand-ins'
(SIMULATED), and the set read from a bare lab node (tests/facts/samples/lab-bare-dayzero.txt)."""

from __future__ import annotations

import json
from pathlib import Path

from sparkdeploy.dayzero.discover import from_facts
from sparkdeploy.facts import parse
from tests.dayzero.spark_samples import render_sections, spark_output

LAB_BARE = Path(__file__).parents[1] / "facts" / "samples" / "lab-bare-dayzero.txt"


def facts(**kw):
    mgmt = kw.get("mgmt", "192.168.1.101")
    return from_facts(mgmt, parse(mgmt, spark_output(**kw)), "SHA256:abc")


def test_a_spark_has_two_ports_each_with_both_names_and_both_hcas():
    f = facts()
    assert f.gb10 and f.gpus == ["NVIDIA GB10"] and f.driver == "580.95.05"
    assert [p.key for p in f.ports] == ["p1s0f0", "p1s0f1"]
    f1 = f.ports[1]
    assert f1.names == ["enp1s0f1np1", "enP2p1s0f1np1"]
    assert f1.hcas == ["rocep1s0f1", "roceP2p1s0f1"]
    assert f1.up and f1.speed_mbps == 200000 and f1.mtu == 1500 and f1.addresses == []
    assert not f.ports[0].up
    assert f.mgmt_iface == "enP7s7"  # the 10 GbE port is no CX7 port (no RDMA device)
    assert all("enP7s7" not in p.names for p in f.ports)
    assert f.simulated == []
    assert f.machine_id.startswith("0f3a")


def test_the_gid_index_is_the_roce_v2_entry_of_the_fabric_address():
    f = facts(fabric_addr="192.168.100.10/24", mtu=9000)
    port = f.ports[1]
    assert port.addresses == ["192.168.100.10/24"] and port.address_iface == "enp1s0f1np1"
    assert port.gid_index == 3


def test_no_nvidia_smi_is_no_gpu_with_the_reason():
    f = facts(gpu_rc=127)
    assert not f.gb10 and f.gpu_error == "nvidia-smi not found"


def test_the_lab_stand_ins_are_read_and_marked_simulated():
    links = [
        {
            "ifname": "eth0",
            "flags": ["UP", "LOWER_UP"],
            "mtu": 1500,
            "operstate": "UP",
            "addr_info": [{"family": "inet", "local": "172.31.81.11", "prefixlen": 24}],
        },
        {"ifname": "enP2p1s0f1np1", "flags": ["UP", "LOWER_UP"], "mtu": 1500, "operstate": "UP", "addr_info": []},
    ]
    rdma = [
        {"ifname": "rocep1s0f1", "port": 1, "state": "ACTIVE", "netdev": "enP2p1s0f1np1", "simulated": True},
        {"ifname": "roceP2p1s0f1", "port": 1, "state": "ACTIVE", "netdev": "enP2p1s0f1np1", "simulated": True},
    ]
    text = render_sections(
        {
            "home": ("/home/spark", "", 0),
            "machine_id": ("", "cat: /etc/machine-id: No such file or directory", 1),
            "hostname": ("spark2", "", 0),
            "gpu": (
                "0, NVIDIA GB10, 580.95.05, 122570, 0, 122570, 41",
                "nvidia-smi: SIMULATED (sparkdeploy lab stand-in)",
                0,
            ),
            "network": (
                json.dumps(links)
                + "\n@@ethtool enP2p1s0f1np1\n\tSpeed: 200000Mb/s (SIMULATED: the lab link underneath is a veth)",
                "",
                0,
            ),
            "max_mtu": ("[]", "", 0),
            "rdma_netdevs": ("@@rdma-link\n" + json.dumps(rdma), "", 0),
            "rdma": ("", "", 0),
        }
    )
    f = from_facts("172.31.81.11", parse("172.31.81.11", text))
    assert sorted(f.simulated) == ["gpu", "link-speed", "rdma"]
    assert len(f.ports) == 1 and f.ports[0].names == ["enP2p1s0f1np1"]
    assert f.ports[0].hcas == ["rocep1s0f1", "roceP2p1s0f1"] and f.ports[0].up
    assert f.machine_id == "" and f.mgmt_iface == "eth0"


def test_a_bare_lab_node_read_over_ssh():
    f = from_facts("172.31.85.11", parse("spark1", LAB_BARE.read_text()), "SHA256:lab")
    assert f.hostname == "spark1" and len(f.machine_id) == 32
    assert f.gb10 and f.driver == "580.95.05" and f.mgmt_iface == "eth0"
    assert sorted(f.simulated) == ["gpu", "link-speed", "rdma"]
    assert [p.names for p in f.ports] == [["enp1s0f1np1"]] and f.ports[0].hcas == ["rocep1s0f1", "roceP2p1s0f1"]
    assert f.ports[0].up and f.ports[0].speed_mbps == 200000 and f.ports[0].mtu == 1500
    assert f.max_mtu["enp1s0f1np1"] == 65535  # a veth (a ConnectX-7 port says 9978)
