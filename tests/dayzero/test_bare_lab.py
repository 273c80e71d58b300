"""The bare lab is what a new pair of Sparks looks like, and day zero's first two commands work on it."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support.cli_process import failure, sd

pytestmark = pytest.mark.lab


def _exec(container: str, command: str) -> str:
    return subprocess.run(["docker", "exec", container, "sh", "-c", command], capture_output=True, text=True).stdout


def test_bare_nodes_then_init_and_setup_ssh(bare_lab, tmp_path):
    names = bare_lab.notes["fabric_ifaces"]
    assert names == {"spark1": "enp1s0f1np1", "spark2": "enP2p1s0f1np1"}  # the names differ between nodes
    for node, iface in names.items():
        link = json.loads(_exec(bare_lab.container(node), f"ip -j addr show dev {iface}"))[0]
        assert link["mtu"] == 1500 and "UP" in link["flags"]
        assert [a for a in link["addr_info"] if a["family"] == "inet"] == []  # up, no address
        assert _exec(bare_lab.container(node), "test -e /home/spark/.ssh/authorized_keys || echo none") == "none\n"
        assert "netplan" in _exec(bare_lab.container(node), "dpkg-query -W netplan.io")
    machine_ids = {_exec(bare_lab.container(n), "cat /etc/machine-id") for n in names}
    assert len(machine_ids) == 2

    hosts = ",".join(bare_lab.hosts)
    key, out = tmp_path / "id_ed25519", tmp_path / "inventory.yaml"
    base = ["--user", "spark", "--password-file", str(bare_lab.password_file)]
    r = sd(
        "init",
        "--hosts",
        hosts,
        *base,
        "--key",
        str(key),
        "--known-hosts",
        str(tmp_path / "kh"),
        "--fabric-subnet",
        bare_lab.notes["fabric_subnet"],
        "--out",
        str(out),
        "--yes",
    )
    assert r.returncode == 0, failure(r)
    text = out.read_text()
    assert "enp1s0f1np1" in text and "enP2p1s0f1np1" in text and "PROPOSED" in text

    nokey = sd("setup", "ssh", "-i", str(out), "--json")  # no password given: the nodes take no key yet
    assert nokey.returncode == 1 and "does not accept the key yet" in nokey.stdout, failure(nokey)
    r = sd("setup", "ssh", "-i", str(out), "--password-file", str(bare_lab.password_file), "--grant-sudo", "--json")
    assert r.returncode == 0, failure(r)
    nodes = json.loads(r.stdout)["nodes"]
    assert [(n["login"], n["key"], n["key_login"], n["sudo"]) for n in nodes] == [
        ("password", "added", True, {"python3": "granted"})
    ] * 2
    again = sd("setup", "ssh", "-i", str(out), "--json")
    assert again.returncode == 0, failure(again)
    assert [(n["login"], n["key"], n["sudo"]) for n in json.loads(again.stdout)["nodes"]] == [
        ("key", "present", {"python3": "ok"})
    ] * 2
