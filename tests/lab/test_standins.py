"""The SIMULATED hardware tools: marked as such, in the real tools' formats, derived from the real link."""

from __future__ import annotations

import ipaddress
import json

import pytest

pytestmark = pytest.mark.lab


def test_nvidia_smi_table_says_simulated_gb10(lab):
    for node in lab.nodes:
        out = lab.ssh(node, "nvidia-smi").stdout
        assert "SIMULATED" in out and "NVIDIA GB10" in out and "Driver Version: 580" in out
        assert "122570MiB" in out


def test_nvidia_smi_list_and_csv_query(lab):
    node = lab.nodes[0]
    listing = lab.ssh(node, "nvidia-smi -L").stdout.strip().splitlines()
    assert len(listing) == 1 and listing[0].startswith("GPU 0: NVIDIA GB10 (UUID: GPU-") and "SIMULATED" in listing[0]
    q = lab.ssh(
        node,
        "nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,temperature.gpu "
        "--format=csv,noheader,nounits",
    )
    assert q.stdout.strip().split(", ") == ["NVIDIA GB10", "580.95.05", "122570", "0", "41"]
    assert "SIMULATED" in q.stderr  # the CSV itself stays parseable
    header = lab.ssh(node, "nvidia-smi --query-gpu=name,memory.total --format=csv").stdout.splitlines()
    assert header == ["name, memory.total [MiB]", "NVIDIA GB10, 122570 MiB"]
    bad = lab.ssh(node, "nvidia-smi --query-gpu=bogus --format=csv", check=False)
    assert bad.returncode != 0 and "not a valid field" in bad.stderr


def test_nvidia_smi_fault_injection_file(scratch_lab):
    lab = scratch_lab
    node = lab.nodes[-1]
    lab.docker_exec(node, "sh", "-c", "echo '{\"temperature.gpu\": 93}' > /etc/sparkdeploy-lab/gpu.json")
    try:
        out = lab.ssh(node, "nvidia-smi --query-gpu=temperature.gpu --format=csv,noheader").stdout.strip()
        assert out == "93"
    finally:
        lab.docker_exec(node, "rm", "-f", "/etc/sparkdeploy-lab/gpu.json")
    assert lab.ssh(node, "nvidia-smi --query-gpu=temperature.gpu --format=csv,noheader").stdout.strip() == "41"


def test_rdma_twins_active_on_fabric_port(lab):
    for node in lab.nodes:
        devinfo = lab.ssh(node, "ibv_devinfo").stdout
        for hca in lab.spec.hcas:
            assert f"hca_id:\t{hca}" in devinfo
        assert devinfo.count("PORT_ACTIVE") == 2 and "SIMULATED" in devinfo
        assert "active_mtu:\t\t4096" in devinfo  # jumbo frames allow the 4096 RoCE MTU
        devices = lab.ssh(node, "ibv_devices").stdout
        assert all(h in devices for h in lab.spec.hcas)
        links = json.loads(lab.ssh(node, "rdma -j link").stdout)
        assert [(lk["ifname"], lk["state"], lk["netdev"]) for lk in links] == [
            (h, "ACTIVE", lab.spec.fabric_iface) for h in lab.spec.hcas
        ]


def test_show_gids_has_rocev2_gid_of_fabric_ip(lab):
    from sparkdeploy.lab.spec import ROCE_V2_GID_INDEX

    for node in lab.nodes:
        out = lab.ssh(node, "show_gids").stdout
        mapped = ipaddress.IPv6Address(f"::ffff:{node.fabric_ip}").exploded
        rows = [line.split() for line in out.splitlines() if line.startswith(lab.spec.hcas[0] + "\t")]
        v2 = [r for r in rows if r[3] == mapped and r[-2] == "v2"]
        assert len(v2) == 1 and int(v2[0][2]) == ROCE_V2_GID_INDEX and v2[0][4] == node.fabric_ip


def test_ethtool_reports_cx7_speed_for_fabric_only(lab):
    node = lab.nodes[0]
    fabric = lab.ssh(node, f"ethtool {lab.spec.fabric_iface}").stdout
    assert "Speed: 200000Mb/s" in fabric and "SIMULATED" in fabric
    mgmt = lab.ssh(node, "ethtool eth0").stdout
    assert "Speed: 200000Mb/s" not in mgmt  # the real tool for everything else


def test_standins_follow_the_real_link(scratch_lab):
    """Faults in the real parts show through: link down -> PORT_DOWN; MTU 1500 -> RoCE MTU 1024."""
    lab = scratch_lab
    node = lab.nodes[-1]
    iface = lab.spec.fabric_iface
    try:
        lab.docker_exec(node, "ip", "link", "set", "dev", iface, "mtu", "1500")
        assert "active_mtu:\t\t1024" in lab.ssh(node, "ibv_devinfo").stdout
        lab.docker_exec(node, "ip", "link", "set", "dev", iface, "down")
        assert lab.ssh(node, "ibv_devinfo").stdout.count("PORT_DOWN") == 2
        assert "state DOWN" in lab.ssh(node, "rdma link").stdout
    finally:
        lab.docker_exec(node, "ip", "link", "set", "dev", iface, "mtu", "9000")
        lab.docker_exec(node, "ip", "link", "set", "dev", iface, "up")
    assert lab.ssh(node, "ibv_devinfo").stdout.count("PORT_ACTIVE") == 2
