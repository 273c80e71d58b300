"""Day zero on the bare lab (nodes as a new pair of Sparks arrives): init -> setup ssh -> setup network -> up ->
a first answer, end to end; and a change that cuts the management network, undone by the node itself."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import yaml

from sparkdeploy.dayzero import netplan
from sparkdeploy.dayzero.network_setup import Prepared, _prepare, apply_node
from sparkdeploy.inventory import load_inventory
from tests.support.cli_process import failure, sd

pytestmark = pytest.mark.lab


def _exec(container: str, command: str) -> str:
    return subprocess.run(["docker", "exec", container, "sh", "-c", command], capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def day_zero(bare_lab, tmp_path_factory):
    """init and setup ssh on the bare nodes, as an owner runs them (password from the lab's 0600 file)."""
    tmp = tmp_path_factory.mktemp("dayzero")
    key, out = tmp / "id_ed25519", tmp / "inventory.yaml"
    pw = ["--password-file", str(bare_lab.password_file)]
    t0 = time.monotonic()
    init = sd(
        "init",
        "--hosts",
        ",".join(bare_lab.hosts),
        "--user",
        "spark",
        *pw,
        "--key",
        str(key),
        "--known-hosts",
        str(tmp / "kh"),
        "--fabric-subnet",
        bare_lab.notes["fabric_subnet"],
        "--out",
        str(out),
        "--yes",
    )
    nokey = sd("setup", "ssh", "-i", str(out), "--json")
    ssh = sd("setup", "ssh", "-i", str(out), *pw, "--grant-sudo", "--json")
    again = sd("setup", "ssh", "-i", str(out), "--json")
    return {"out": out, "init": init, "nokey": nokey, "ssh": ssh, "again": again, "t0": t0}


def test_bare_nodes_look_like_a_new_pair(bare_lab):
    names = bare_lab.notes["fabric_ifaces"]
    assert names == {"spark1": "enp1s0f1np1", "spark2": "enP2p1s0f1np1"}  # the names differ between nodes
    for node, iface in names.items():
        link = json.loads(_exec(bare_lab.container(node), f"ip -j addr show dev {iface}"))[0]
        assert link["mtu"] == 1500 and "UP" in link["flags"]
        assert [a for a in link["addr_info"] if a["family"] == "inet"] == []  # up, no address
        assert _exec(bare_lab.container(node), "test -e /home/spark/.ssh/authorized_keys || echo none") == "none\n"
        assert "netplan" in _exec(bare_lab.container(node), "dpkg-query -W netplan.io")
    assert len({_exec(bare_lab.container(n), "cat /etc/machine-id") for n in names}) == 2


def test_init_and_setup_ssh_over_the_password(day_zero):
    assert day_zero["init"].returncode == 0, failure(day_zero["init"])
    text = day_zero["out"].read_text()
    assert "enp1s0f1np1" in text and "enP2p1s0f1np1" in text and "PROPOSED" in text
    nokey = day_zero["nokey"]  # no password given: the nodes take no key yet
    assert nokey.returncode == 1 and "does not accept the key yet" in nokey.stdout, failure(nokey)
    ssh = day_zero["ssh"]
    assert ssh.returncode == 0, failure(ssh)
    assert [(n["login"], n["key"], n["key_login"], n["sudo"]) for n in json.loads(ssh.stdout)["nodes"]] == [
        ("password", "added", True, {"python3": "granted"})
    ] * 2
    again = day_zero["again"]
    assert again.returncode == 0, failure(again)
    assert [(n["login"], n["key"], n["sudo"]) for n in json.loads(again.stdout)["nodes"]] == [
        ("key", "present", {"python3": "ok"})
    ] * 2


def test_setup_network_then_up_and_a_first_answer(bare_lab, day_zero):
    inv = str(day_zero["out"])
    c1 = bare_lab.container("spark1")
    dry = sd("setup", "network", "-i", inv, "--dry-run", "--json")
    assert dry.returncode == 0 and {n["state"] for n in json.loads(dry.stdout)["nodes"]} == {"dry-run"}, failure(dry)
    assert _exec(c1, "ls /etc/netplan") == ""  # a dry run changes nothing

    r = sd("setup", "network", "-i", inv, "--json")
    assert r.returncode == 0, failure(r)
    nodes = json.loads(r.stdout)["nodes"]
    peers = {n.name: n.fabric_address for n in load_inventory(inv).nodes}
    for n in nodes:
        assert n["state"] == "confirmed" and n["standin"] is True  # the lab's networkd stand-in: SIMULATED
        (other,) = [peers[x] for x in peers if x != n["node"]]
        assert n["pings"] == {other: "ok"} and n["rdma_up"] and n["gid_index"] == 3
    assert "mtu 9000" in _exec(bare_lab.container("spark2"), "ip link show enP2p1s0f1np1")
    again = sd("setup", "network", "-i", inv, "--json")
    assert {n["state"] for n in json.loads(again.stdout)["nodes"]} == {"unchanged"}, failure(again)

    # a file the owner wrote for the port: refused with its diff; --replace takes over; --restore puts it back
    owner = "network:\n  version: 2\n  ethernets:\n    enp1s0f1np1:\n      mtu: 1500\n"
    _exec(c1, f"printf '{owner}' > /etc/netplan/50-owner.yaml && chmod 600 /etc/netplan/50-owner.yaml")
    refused = sd("setup", "network", "-i", inv)
    assert refused.returncode == 1 and "50-owner.yaml configures the fabric" in refused.stdout, failure(refused)
    assert "-      mtu: 1500" in refused.stdout and "+      mtu: 9000" in refused.stdout
    replaced = sd("setup", "network", "-i", inv, "--replace")
    assert replaced.returncode == 0, failure(replaced)
    assert _exec(c1, "ls /etc/netplan").split() == [netplan.PATH.rsplit("/", 1)[1]]
    restored = sd("setup", "network", "-i", inv, "--restore")
    assert restored.returncode == 0, failure(restored)
    assert _exec(c1, "ls /etc/netplan").split() == ["50-owner.yaml"] and "mtu 1500" in _exec(
        c1, "ip link show enp1s0f1np1"
    )
    _exec(c1, "rm /etc/netplan/50-owner.yaml")
    assert sd("setup", "network", "-i", inv).returncode == 0

    # the lab's own settings (SIMULATED engine, its model hub, its secrets), then serve and ask
    data = yaml.safe_load(day_zero["out"].read_text())
    data["cluster"].update(bare_lab.notes["lab_cluster"])
    lab_inv = day_zero["out"].with_name("inventory-lab.yaml")
    lab_inv.write_text(yaml.safe_dump(data, sort_keys=False))
    up = sd("run-recipe", "openai-gpt-oss-120b", "--inventory", str(lab_inv))
    assert up.returncode == 0, failure(up)
    chat = subprocess.run(
        [sys.executable, "scripts/chat.py", "--inventory", str(lab_inv), "What is a DGX Spark?"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert chat.returncode == 0 and chat.stdout.strip(), failure(chat)
    print(f"dayzero: bare lab to first answer in {time.monotonic() - day_zero['t0']:.1f} s (init onwards)")
    # the cluster serves over this fabric: --restore (there is something to restore) names it and refuses
    t0 = time.monotonic()
    refused = sd("setup", "network", "-i", str(lab_inv), "--restore")
    assert refused.returncode == 1, failure(refused)
    line = "setup network --restore would break openai-gpt-oss-120b / cluster"
    assert line in refused.stderr and "--stop-deployments" in refused.stderr, failure(refused)
    assert _exec(c1, "ls /etc/netplan").split() == [netplan.PATH.rsplit("/", 1)[1]]  # nothing restored
    status = json.loads(sd("status", "-i", str(lab_inv), "--json").stdout)
    assert status["healthy"], status  # still serving
    print(f"dayzero: setup network --restore refused with a cluster serving in {time.monotonic() - t0:.1f} s")
    down = sd("down", "--inventory", str(lab_inv))
    assert down.returncode == 0, failure(down)


def test_a_change_that_cuts_management_is_undone_by_the_node(bare_lab, day_zero):
    inv = load_inventory(day_zero["out"])
    node = inv.nodes[1]
    prepared: Prepared = _prepare(inv, node)
    mgmt = prepared.facts.mgmt_iface
    cut = prepared.result.text + f'    "{mgmt}":\n      addresses: ["10.254.254.1/24"]\n'  # management moves away
    prepared.result.text = cut
    start = time.monotonic()
    apply_node(inv, prepared, [], rollback_s=15)
    assert prepared.result.state == "rolled-back", prepared.result.detail
    assert "cut spark2 off the management network" in prepared.result.detail
    assert time.monotonic() - start < 90
    container = bare_lab.container("spark2")
    assert f"{node.mgmt_ip}/24" in _exec(container, f"ip -br addr show {mgmt}")  # back as it was
    assert "10.254.254.1" not in _exec(container, "cat /etc/netplan/*.yaml")
    assert sd("setup", "network", "-i", str(day_zero["out"])).returncode == 0  # and it still works
