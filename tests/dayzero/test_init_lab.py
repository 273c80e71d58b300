"""`sparkdeploy init` against the lab's nodes (real sshd, host-key checking on; GPU and RDMA SIMULATED)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from sparkdeploy.config.inventory import load_inventory
from tests.support.cli_process import failure, sd

pytestmark = pytest.mark.lab


def _init(lab, tmp_path, *extra: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    hosts = ",".join(n.mgmt_ip for n in lab.nodes)
    argv = ["init", "--hosts", hosts, "--user", "spark", "--key", str(lab.key), "--known-hosts", str(tmp_path / "kh")]
    return subprocess.run(
        [sys.executable, "-c", "from sparkdeploy.cli.main import main; main()", *argv, *extra],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_init_shows_each_key_pins_only_what_was_confirmed_and_writes_a_working_inventory(lab, tmp_path):
    out = tmp_path / "inventory.yaml"
    refused = _init(lab, tmp_path, "--out", str(out), stdin="n\n" * len(lab.nodes))
    assert refused.returncode == 1, failure(refused)
    assert "SHA256:" in refused.stdout and "not trusted: nothing was recorded" in refused.stdout
    assert not out.exists() and not (tmp_path / "kh").exists()

    dry = _init(lab, tmp_path, "--out", str(out), "--dry-run", "--yes")
    assert dry.returncode == 0, failure(dry)
    assert "SIMULATED" in dry.stdout and "role: head" in dry.stdout
    assert not out.exists() and not (tmp_path / "kh").exists()  # a dry run pins nothing

    r = _init(lab, tmp_path, "--out", str(out), stdin="y\n" * len(lab.nodes))
    assert r.returncode == 0, failure(r)
    pinned = (tmp_path / "kh").read_text().splitlines()
    assert sorted(line.split()[0] for line in pinned) == sorted(n.mgmt_ip for n in lab.nodes)
    inv = load_inventory(out)
    assert [n.mgmt_ip for n in inv.nodes] == [n.mgmt_ip for n in lab.nodes]
    assert inv.head.mgmt_ip == lab.nodes[0].mgmt_ip
    for node, spec in zip(inv.nodes, lab.nodes, strict=True):
        assert node.fabric_ip == spec.fabric_cidr and node.fabric_ifaces == [lab.spec.fabric_iface]
        assert node.hcas == list(lab.spec.hcas) and node.gid_index == 3
    assert "# The GPUs, RDMA devices and link speeds below are SIMULATED" in out.read_text()

    # the inventory works: sparkdeploy reaches every node with it, host keys checked against what init pinned
    status = sd("status", "--inventory", str(out), "--json")
    assert status.returncode in (0, 1) and "unknown SSH host key" not in status.stderr, failure(status)

    again = _init(lab, tmp_path, "--out", str(out), "--json")  # keys pinned now: no question; merged into the file
    assert again.returncode == 0, failure(again)
    merged = yaml.safe_load(again.stdout)
    assert merged["merged"] and merged["changes"] == [] and merged["backup"].endswith(".bak"), merged
    assert load_inventory(out).nodes == inv.nodes  # nothing of the nodes changed: only the header's date
    forced = _init(lab, tmp_path, "--out", str(out), "--force", "--json")
    assert forced.returncode == 0, failure(forced)
    report = yaml.safe_load(forced.stdout)
    assert {k["status"] for k in report["host_keys"]} == {"pinned"} and report["backup"].endswith(".bak")
    # every en* port's ethtool read (facts/ network fact, EVERY_PORT): the stand-ins' speed, marked SIMULATED
    assert {p["speed_mbps"] for n in report["nodes"] for p in n["ports"]} == {200000}
    assert [sorted(n["simulated"]) for n in report["nodes"]] == [["gpu", "link-speed", "rdma"]] * len(lab.nodes)


def test_init_refuses_a_changed_host_key(lab, tmp_path):
    first = lab.nodes[0].mgmt_ip
    ktype, blob = (lab.spec.directory / "hostkeys" / "spark2_ed25519.pub").read_text().split()[:2]
    kh = tmp_path / "kh"
    kh.write_text(f"{first} {ktype} {blob}\n")  # another node's key pinned for the first node
    r = _init(lab, tmp_path, "--out", str(tmp_path / "inv.yaml"), "--yes")
    assert r.returncode == 1, failure(r)
    assert f"{first}: the host key CHANGED" in r.stdout and f"ssh-keygen -R {first}" in r.stdout
    assert kh.read_text().splitlines()[0] == f"{first} {ktype} {blob}"  # the pinned line stays
    assert not (tmp_path / "inv.yaml").exists()
