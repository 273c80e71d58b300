"""`recipes fit --inventory` against the lab: each engine node's memory read live over SSH through the fact
layer. The lab's nvidia-smi is a stand-in (SIMULATED): its figures, and the report saying so, are what this
proves, with one node's reported use changed from the host (the stand-in's override file) and restored."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.lab
OVERRIDES = "/etc/sparkdeploy-lab/gpu.json"  # images/lab-node/files/standins.py GPU_OVERRIDES


def fit(cli, lab, *args):
    code, out, err = cli("recipes", "fit", "openai-gpt-oss-120b", "-i", str(lab.spec.inventory_path), *args)
    return code, out, err


def test_recipes_fit_reads_each_nodes_live_memory(lab, cli):
    code, out, err = fit(cli, lab, "-t", "cluster", "--json")
    report = json.loads(out)
    assert code == 0, (out, err)
    assert report["live"] and report["fits"] and [n["node"] for n in report["nodes"]] == ["spark1", "spark2"]
    for n in report["nodes"]:
        assert n["simulated"] and n["source"] == "nvidia-smi (SIMULATED)", n
        assert n["total_bytes"] == 122570 * 2**20 and n["engine_size"] == 2

    spark2 = next(n for n in lab.nodes if n.name == "spark2")
    lab.docker_exec(
        spark2, "sh", "-c", f"mkdir -p /etc/sparkdeploy-lab && echo '{{\"memory.used\": 61440}}' > {OVERRIDES}"
    )
    try:
        code, out, err = fit(cli, lab, "-t", "cluster")
        assert code == 1, (out, err)
        assert "SIMULATED" in out and "does NOT fit" in out
        assert "spark2: fix: lower vllm.gpu_memory_utilization to 0.43" in out  # (122570 - 61440 MiB - 8 GiB) / total
        code, out, _ = fit(cli, lab, "-t", "cluster", "--json")
        nodes = {n["node"]: n for n in json.loads(out)["nodes"]}
        assert nodes["spark2"]["free_bytes"] == (122570 - 61440) * 2**20 and not nodes["spark2"]["fits"]
        assert nodes["spark1"]["fits"]  # the other node untouched
    finally:
        lab.docker_exec(spark2, "rm", "-f", OVERRIDES)
    code, _, _ = fit(cli, lab, "-t", "cluster")
    assert code == 0
