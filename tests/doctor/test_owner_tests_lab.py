"""doctor --tests on the lab: the shipped example checks on both nodes over the pinned SSH, and the host keys.

The lab's GPU, RDMA and NVIDIA hook are SIMULATED stand-ins (images/lab-node/files): rows whose commands read them
are marked SIMULATED and quote the stand-in's line; earlyoom is skipped (a lab node has no systemd) and says so."""

from __future__ import annotations

import json
import subprocess
import sys

import paramiko
import pytest

from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.doctor.testinfra_backend import host_for
from sparkdeploy.runtime.remote import HostKeyError, NodeConnection, fingerprint
from tests.doctor.test_doctor_lab import doctor, rows, show
from tests.doctor.test_owner_tests import EXAMPLES

pytestmark = pytest.mark.lab


def test_the_shipped_examples_pass_on_both_lab_nodes(lab, cli):
    code, report, _ = doctor(cli, lab.spec.inventory_path, "--tests", "@spark", "--only", "tests")
    assert code == 0, show(report)
    r = rows(report)
    for node in ("spark1", "spark2"):
        got = {check.removeprefix("tests:"): row for (check, n), row in r.items() if n == node and "::" in check}
        assert set(got) == EXAMPLES, show(report)
        assert got["test_memory.py::test_earlyoom"]["status"] == "skip"
        assert "SIMULATED lab node" in got["test_memory.py::test_earlyoom"]["measured"]
        assert all(row["status"] == "pass" for t, row in got.items() if t != "test_memory.py::test_earlyoom")
        driver = got["test_gpu_stack.py::test_driver"]
        assert driver["simulated"] and "SIMULATED" in driver["measured"] and driver["data"]["outcome"] == "passed"
        assert got["test_docker.py::test_engine_runs"]["simulated"] is False


def test_the_inventorys_doctor_tests_run_without_the_option(lab, cli, derived_inventory):
    path = derived_inventory(lambda d: d["cluster"].update(doctor_tests=["@spark"]))
    code, report, _ = doctor(cli, path, "--only", "tests")
    assert code == 0, show(report)
    got = {check for (check, node) in rows(report) if node == "spark2" and check.startswith("tests:")}
    assert got == {"tests:" + t for t in EXAMPLES}


def test_a_drifted_node_fails_with_the_assertion_text_and_exit_1(lab, cli):
    spark2 = lab.nodes[1]
    lab.docker_exec(spark2, "ip", "link", "set", "enp1s0f1np1", "mtu", "1500")
    try:
        code, report, _ = doctor(cli, lab.spec.inventory_path, "--tests", "@spark", "--only", "tests")
    finally:
        lab.docker_exec(spark2, "ip", "link", "set", "enp1s0f1np1", "mtu", "9000")
    assert code == 1
    r = rows(report)
    assert r[("tests:test_fabric.py::test_ports_up_at_mtu", "spark1")]["status"] == "pass"
    row = r[("tests:test_fabric.py::test_ports_up_at_mtu", "spark2")]
    assert row["status"] == "fail" and "enp1s0f1np1 has MTU 1500, not 9000" in row["measured"], show(report)


def test_an_unknown_or_changed_host_key_is_refused_and_no_test_runs(lab, cli, derived_inventory, tmp_path):
    empty = tmp_path / "known_hosts_empty"
    empty.write_text("")
    unknown = derived_inventory(lambda d: d["cluster"].update(known_hosts=str(empty)), name="unknown.yaml")
    # doctor: access.ssh fails, the owner's tests do not run there
    code, report, _ = doctor(cli, unknown, "--tests", "@spark", "--only", "tests")
    assert code == 1
    r = rows(report)
    assert (
        r[("access.ssh", "spark1")]["status"] == "fail"
        and "unknown SSH host key" in r[("access.ssh", "spark1")]["measured"]
    )
    assert r[("tests.owner", "spark1")]["status"] == "skip" and not any(k[0].startswith("tests:") for k in r)
    # the per-node runner itself refuses it too (it never falls back to testinfra's WarningPolicy backend)
    out = tmp_path / "rows.json"
    subprocess.run(
        [sys.executable, "-m", "sparkdeploy.doctor.testinfra_node", "--inventory", str(unknown), "--node", "spark1"]
        + ["--out", str(out), "@unused"],
        check=True,
        timeout=120,
    )
    (row,) = json.loads(out.read_text())["rows"]
    assert row["outcome"] == "error" and "unknown SSH host key" in row["message"], row
    assert not empty.read_text()  # nothing was added

    # a changed key: the backend's first command is refused with both fingerprints
    other = paramiko.Ed25519Key.from_private_key_file(str(lab.key))
    wrong = tmp_path / "known_hosts_wrong"
    good = lab.known_hosts.read_text().splitlines()
    lines = [ln for ln in good if not ln.startswith(lab.nodes[1].mgmt_ip + " ")]
    lines.append(f"{lab.nodes[1].mgmt_ip} {other.get_name()} {other.get_base64()}")
    wrong.write_text("\n".join(lines) + "\n")
    inv = load_inventory(str(derived_inventory(lambda d: d["cluster"].update(known_hosts=str(wrong)), name="c.yaml")))
    conn = NodeConnection(inv.nodes[1], inv)
    host = host_for(conn)
    with pytest.raises(HostKeyError, match="CHANGED") as refused:
        host.run("true")
    assert fingerprint(other) in str(refused.value)
    conn.close()
