"""The fabric gate in the shared lab (sparkdeploy/deploy/fabric_gate.py): a broken fabric is refused before any
engine container exists; `--no-fabric-gate` proceeds and says so; a changed cluster deployment runs the gate
(gloo over the fabric IPs: SIMULATED) and serves; the same `up` again skips it. In that order, so the lab
deploys twice in all. The lab's fabric is real (a Docker network); its GPUs are not."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from sparkdeploy.deploy.fabric_gate import TIMEOUT_ENV
from tests.deploy.test_deploy_lab import assert_nothing_of_ours, sd
from tests.support.cli_process import failure

pytestmark = pytest.mark.lab

RECIPE = "openai-gpt-oss-120b"
CHANGE = "vllm.max_model_len=32768"  # any value that restarts the engines
# The refusal of a broken fabric waits for the probe's timeout (40 s by default): here a shorter one, still far
# longer than the probe needs on a working fabric (the whole passing gate below: about 8 s).
BROKEN_FABRIC_TIMEOUT_S = "15"


@pytest.fixture(scope="module")
def inv(lab):
    path = str(lab.spec.inventory_path)
    r = sd("down", "-i", path)
    assert r.returncode == 0, failure(r)
    yield path
    sd("down", "-i", path)


def _up(inv: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return sd("up", "--recipe", RECIPE, "-t", "cluster", "-i", inv, "--timeout", "240", *extra, env=env)


def _iptables(lab, node: str, op: str) -> None:
    iface = lab.spec.fabric_iface_for(node)
    for chain, flag in (("INPUT", "-i"), ("OUTPUT", "-o")):
        cmd = ["docker", "exec", lab.spec.container_name(node), "iptables", op, chain, flag, iface, "-j", "DROP"]
        subprocess.run(cmd, check=op == "-I", capture_output=True)


def test_broken_fabric_is_refused_before_any_engine(lab, inv):
    _iptables(lab, "spark2", "-I")  # spark2 drops everything on its fabric port
    try:
        r = _up(inv, env={**os.environ, TIMEOUT_ENV: BROKEN_FABRIC_TIMEOUT_S})
    finally:
        _iptables(lab, "spark2", "-D")
    assert r.returncode == 1, failure(r)
    assert "fabric gate failed SIMULATED" in r.stderr and "nccl.allreduce" in r.stderr, failure(r)
    assert "fix: " in r.stderr and "No engine was started" in r.stderr
    for node in lab.spec.node_specs():  # one line per node
        assert f"{node.name} ({node.mgmt_ip}): the fabric gate refused; nothing changed here" in r.stdout, failure(r)
    assert "Traceback" not in r.stderr + r.stdout
    assert_nothing_of_ours(inv)  # no engine container on either node, spark1 included


def test_no_fabric_gate_proceeds_and_says_so(lab, inv):
    r = _up(inv, "--no-fabric-gate")
    assert r.returncode == 0, failure(r)
    assert "fabric gate: skipped (--no-fabric-gate)" in r.stdout, failure(r)


def test_changed_cluster_runs_the_gate_then_an_unchanged_one_skips_it(lab, inv):
    r = _up(inv, "--set", CHANGE, "--json")
    assert r.returncode == 0, failure(r)
    gate = json.loads(r.stdout)["fabric_gate"]
    assert gate["status"] == "passed", gate
    rows = {c["check"]: c for c in gate["checks"]}
    assert set(rows) >= {"image.same_id", "image.torch_nccl", "gpu.same_driver", "nccl.allreduce"}
    assert rows["nccl.allreduce"]["measured"].startswith("SIMULATED gloo/CPU over fabric IPs: peak busbw")
    assert "fabric gate passed" in r.stdout or gate["seconds"] > 0
    again = _up(inv, "--set", CHANGE)
    assert again.returncode == 0, failure(again)
    assert "fabric gate: skipped: the deployment is unchanged" in again.stdout, failure(again)
