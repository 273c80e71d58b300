"""The facts day zero reads (sets DAYZERO and ACCESS), each parser fed real output: tests/facts/samples/
lab-bare-dayzero.txt and lab-bare-access.txt were read from a bare lab node (`sparkdeploy lab up --bare`: Debian,
real ip, hostname, /etc/machine-id, sudo and id; nvidia-smi, rdma, ibv_devinfo and ethtool are the lab's
SIMULATED stand-ins) over a password login, with `facts.command("dayzero", FactArgs(fabric_ifaces=(EVERY_PORT,)))`
and `facts.command("access", FactArgs(sudo_programs=("python3",)))`. And the script run here, for real."""

from __future__ import annotations

import subprocess
from pathlib import Path

from sparkdeploy import facts
from sparkdeploy.facts import FACTS, parse, parse_sections
from sparkdeploy.facts.catalog import ACCESS, DAYZERO

SAMPLES = Path(__file__).parent / "samples"
DAYZERO_SAMPLE = (SAMPLES / "lab-bare-dayzero.txt").read_text()
ACCESS_SAMPLE = (SAMPLES / "lab-bare-access.txt").read_text()


def test_the_samples_hold_exactly_their_sets():
    assert set(parse_sections(DAYZERO_SAMPLE)) == set(DAYZERO)
    assert set(parse_sections(ACCESS_SAMPLE)) == set(ACCESS)


def test_machine_id_hostname_and_max_mtu_of_a_lab_node():
    f = parse("spark1", DAYZERO_SAMPLE)
    assert f.machine_id == "5635ce856853b0671e841ef4071a6641" and f.hostname == "spark1"
    assert f.max_mtu == {"lo": 0, "docker0": 65535, "eth0": 65535, "enp1s0f1np1": 65535}  # as the kernel says


def test_every_en_interface_gets_its_ethtool_speed_with_the_stand_ins_mark():
    f = parse("spark1", DAYZERO_SAMPLE)
    assert f.network is not None and f.network.speeds == {"enp1s0f1np1": 200000}
    assert f.network.simulated_ifaces == {"enp1s0f1np1"} and f.network.simulated_speed
    assert f.network.links["eth0"].addresses == ["172.31.85.11/24"]


def test_rdma_devices_to_netdevs_from_the_rdma_link_stand_in():
    f = parse("spark1", DAYZERO_SAMPLE)
    assert f.rdma_netdevs == {"rocep1s0f1": "enp1s0f1np1", "roceP2p1s0f1": "enp1s0f1np1"}
    assert f.rdma_netdevs_simulated
    assert f.rdma is not None and [g.index for g in f.rdma.gids if g.dev == "rocep1s0f1"] == [0, 1]


def test_rdma_netdevs_from_sysfs_win_and_are_real():
    text = "@@sparkdeploy-facts@@ rdma_netdevs\nsys rocep1s0f1 enp1s0f1np1\nsys roceP2p1s0f1 enP2p1s0f1np1\n"
    f = parse("spark", text)
    assert f.rdma_netdevs == {"rocep1s0f1": "enp1s0f1np1", "roceP2p1s0f1": "enP2p1s0f1np1"}
    assert not f.rdma_netdevs_simulated


def test_sudo_user_and_groups_of_a_lab_node_before_setup_ssh():
    f = parse("spark1", ACCESS_SAMPLE)
    assert f.user == "spark" and f.groups == ["spark", "sudo", "docker"]
    assert f.sudo == {"python3": "missing"} and f.sudo_paths == {"python3": "/usr/bin/python3"}


def test_unreadable_machine_id_and_a_missing_program_degrade_to_what_they_say():
    text = (
        "@@sparkdeploy-facts@@ machine_id\n@@sparkdeploy-facts@@ machine_id.err\ncat: /etc/machine-id: No such file"
        "\n@@sparkdeploy-facts@@ machine_id.rc 1\n@@sparkdeploy-facts@@ sudo\nnope absent -\n"
        "@@sparkdeploy-facts@@ max_mtu\nnot json\n"
    )
    f = parse("spark", text)
    assert f.machine_id == "" and f.sudo == {"nope": "absent"} and f.sudo_paths == {} and f.max_mtu == {}
    cut = parse("spark", "@@sparkdeploy-facts@@ machine_id\n0f3a9c\n@@sparkdeploy-facts@@ machine_id.rc 1\n")
    assert cut.machine_id == ""  # a read that failed midway is no machine-id


def test_the_script_runs_here_for_real():
    """Run the DAYZERO and ACCESS sets on this machine: every section comes back framed with its exit code."""
    names = (*DAYZERO, *ACCESS)
    cmd = facts.command(names, facts.FactArgs(fabric_ifaces=(facts.EVERY_PORT,), sudo_programs=("sh", "nope-x")))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    sections = parse_sections(out)
    assert set(sections) == set(names) and all(s.rc is not None for s in sections.values())
    f = parse("here", out)
    assert f.hostname and f.sudo["nope-x"] == "absent" and f.sudo["sh"] in ("ok", "missing")
    assert all(FACTS[n] for n in names)
