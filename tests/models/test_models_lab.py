"""`models pull | list` and `up`'s model check on the lab: the lab hub (a real hub-API server, shaped with tc)
serves lab/tiny-model (~25 MB); huggingface_hub downloads it on spark1, spark1 copies it to spark2 over the
fabric network. Bytes are counted where they really flow: the hub's own counter and each node container's
interface statistics."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from sparkdeploy.lab import hub
from sparkdeploy.lab.hub_repo import TINY

pytestmark = pytest.mark.lab

REPO_DIR = "~/.cache/huggingface/hub/models--lab--tiny-model"
RECORD_DIR = "~/.cache/huggingface/sparkdeploy-models/models--lab--tiny-model"


def sparkdeploy(lab, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from sparkdeploy.cli.main import main; main()",
            *args,
            "--inventory",
            str(lab.spec.inventory_path),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def rx_bytes(lab, node, iface: str) -> int:
    return int(lab.docker_exec(node, "cat", f"/sys/class/net/{iface}/statistics/rx_bytes").stdout)


def hub_bytes(lab) -> int:
    return hub.stats(lab.spec)["repos"].get(TINY, {}).get("bytes", 0)


def forget(lab, *nodes) -> None:
    for node in nodes:
        lab.ssh(node, f"rm -rf {REPO_DIR} {RECORD_DIR}")


def listing(lab) -> dict:
    run = sparkdeploy(lab, "models", "list", "--json")
    rows = json.loads(run.stdout)["nodes"]
    return {r["node"]: r for r in rows if r.get("model") == TINY}, run


def test_pull_downloads_once_and_copies_over_the_fabric(lab):
    spark1, spark2 = lab.nodes[:2]
    forget(lab, spark1, spark2)
    served, fabric, mgmt = hub_bytes(lab), rx_bytes(lab, spark2, lab.spec.fabric_iface), rx_bytes(lab, spark2, "eth0")

    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from sparkdeploy.cli.main import main; main()",
            "models",
            "pull",
            TINY,
            "--json",
            "--inventory",
            str(lab.spec.inventory_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    overlapped = False  # spark2 held copied bytes while spark1 was still downloading: forwarded as it arrived
    while proc.poll() is None and not overlapped:
        copied = lab.ssh(spark2, f"cat {REPO_DIR}/blobs/* 2>/dev/null | head -c 1 | wc -c", check=False).stdout
        downloading = lab.ssh(spark1, f"ls {REPO_DIR}/blobs 2>/dev/null", check=False).stdout
        overlapped = copied.strip() == "1" and ".incomplete" in downloading
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    assert overlapped, "spark2 received nothing until spark1's download had ended"
    result = json.loads(out)
    size = result["size"]
    assert result["nodes"]["spark1"]["action"] == "downloaded"
    assert result["nodes"]["spark2"] == {
        **result["nodes"]["spark2"],
        "action": "copied",
        "source": "spark1",
        "via": f"{spark1.fabric_ip} -> {spark2.fabric_ip}",
    }
    assert hub_bytes(lab) - served == size  # the hub served the model once, for both nodes
    assert rx_bytes(lab, spark2, lab.spec.fabric_iface) - fabric >= size  # spark2's copy came over the fabric...
    assert rx_bytes(lab, spark2, "eth0") - mgmt < size / 5  # ...not over the management network

    rows, run = listing(lab)
    assert run.returncode == 0 and rows["spark1"]["complete"] and rows["spark2"]["complete"], run.stdout
    assert rows["spark2"]["commit"] == result["commit"] and rows["spark2"]["size"] == size

    again = sparkdeploy(lab, "models", "pull", TINY, "--json")  # idempotent: nothing moves
    assert again.returncode == 0, again.stderr
    assert {n: r["action"] for n, r in json.loads(again.stdout)["nodes"].items()} == {
        "spark1": "present",
        "spark2": "present",
    }
    assert hub_bytes(lab) - served == size

    # bad input: one line naming the problem and the fix, exit 2, nothing half-made
    bad = sparkdeploy(lab, "models", "pull", TINY, "--revision", "no-such-branch")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    lines = [ln for ln in bad.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "no-such-branch" in lines[0] and "spark1" in lines[0] and "fix:" in lines[0]
    assert "Traceback" not in bad.stderr


def test_a_copy_cut_midway_resumes_and_is_never_taken_for_complete(lab):
    spark1, spark2 = lab.nodes[:2]
    forget(lab, spark2)  # (spark1 keeps what an earlier test pulled; if it has nothing, it downloads first)
    # slow spark1's fabric link down (tc), so the copy is still running when spark2's receiver is killed
    iface = lab.spec.fabric_iface
    lab.docker_exec(
        spark1,
        "tc",
        "qdisc",
        "replace",
        "dev",
        iface,
        "root",
        "tbf",
        "rate",
        "40mbit",
        "burst",
        "64kb",
        "latency",
        "400ms",
    )
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from sparkdeploy.cli.main import main; main()",
                "models",
                "pull",
                TINY,
                "--json",
                "--inventory",
                str(lab.spec.inventory_path),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            sizes = lab.ssh(spark2, f"stat -c %s {REPO_DIR}/blobs/*.sparkdeploy-partial 2>/dev/null || true").stdout
            if sum(int(s) for s in sizes.split()) > 4_000_000:
                break
            time.sleep(0.2)
        # the receiving end dies midway (nodeside's `models receive`, shipped in its command line)
        lab.docker_exec(spark2, "pkill", "-f", "sparkdeploy-nodeside.* models receive ")
        out, err = proc.communicate(timeout=120)
    finally:
        lab.docker_exec(spark1, "tc", "qdisc", "del", "dev", iface, "root", check=False)
    assert proc.returncode == 1, out + err
    cut = json.loads(out)["nodes"]["spark2"]
    assert cut["action"] == "failed" and "run the pull again" in cut["error"] and "spark2" in cut["error"]
    rows, _ = listing(lab)
    assert "spark2" not in rows  # half a copy is never recorded as a model
    kept = lab.ssh(spark2, f"stat -c %s {REPO_DIR}/blobs/*.sparkdeploy-partial").stdout
    assert int(kept.split()[0]) > 0

    resumed = sparkdeploy(lab, "models", "pull", TINY, "--json")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    node = json.loads(resumed.stdout)["nodes"]["spark2"]
    assert node["action"] == "copied" and 0 < node["bytes"] < json.loads(resumed.stdout)["size"] - 3_000_000
    rows, run = listing(lab)
    assert rows["spark2"]["complete"], run.stdout


def test_a_corrupt_file_on_one_node_is_caught_by_list_and_up(lab):
    spark2 = lab.nodes[1]
    assert sparkdeploy(lab, "models", "pull", TINY).returncode == 0
    blob = lab.ssh(spark2, f"readlink -f {REPO_DIR}/snapshots/*/model.safetensors").stdout.strip()
    lab.docker_exec(spark2, "sh", "-c", f"printf X | dd of='{blob}' bs=1 seek=5000 conv=notrunc status=none")

    listed = sparkdeploy(lab, "models", "list")
    assert listed.returncode == 1
    assert "spark2" in listed.stdout and "model.safetensors" in listed.stdout, listed.stdout

    up = sparkdeploy(lab, "up", "-t", "2xsolo", "--set", f"model={TINY}", "--dry-run")
    assert up.returncode == 1, up.stdout + up.stderr
    assert "spark2 model" in up.stderr and f"sparkdeploy models pull {TINY}" in up.stderr, up.stderr

    fixed = sparkdeploy(lab, "models", "pull", TINY, "--json")  # the bad file is sent again, the rest kept
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert json.loads(fixed.stdout)["nodes"]["spark2"]["action"] == "copied"
    rows, run = listing(lab)
    assert run.returncode == 0 and rows["spark2"]["complete"]


def engine_env(lab, node) -> list[str]:
    out = lab.ssh(node, "docker inspect --format '{{range .Config.Env}}{{println .}}{{end}}' sparkdeploy-vllm").stdout
    return out.split()


def test_up_pulls_a_missing_model_only_when_asked(lab):
    """spark2 lacks the model (spark1 has it: a model absent from EVERY node passes with the simulated engine,
    which reads no weights). `up` refuses in preflight with the command that fixes it and starts nothing;
    `up --pull-model` copies it to spark2 over the fabric first, and the engines run with HF_HUB_OFFLINE=1."""
    spark1, spark2 = lab.nodes[:2]
    up = ("up", "-t", "2xsolo", "--set", f"model={TINY}", "--timeout", "240")
    assert sparkdeploy(lab, "models", "pull", TINY).returncode == 0
    forget(lab, spark2)
    ours = "docker ps -a --filter name=sparkdeploy- --format '{{.Names}} {{.ID}}' | sort"
    before = {n.name: lab.ssh(n, ours).stdout for n in (spark1, spark2)}
    served = hub_bytes(lab)
    try:
        refused = sparkdeploy(lab, *up)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "Traceback" not in refused.stderr
        error = [ln for ln in refused.stderr.splitlines() if ln.startswith("error:")]
        assert len(error) == 1 and "preflight failed on spark2" in error[0], refused.stderr
        assert f"sparkdeploy models pull {TINY} --inventory" in error[0] and "--pull-model" in error[0], error
        assert "Nothing was changed on any node" in error[0]
        assert {n.name: lab.ssh(n, ours).stdout for n in (spark1, spark2)} == before  # no container started

        pulled = sparkdeploy(lab, *up, "--pull-model", "--json")
        assert pulled.returncode == 0, pulled.stdout[-3000:] + pulled.stderr[-3000:]
        rows, run = listing(lab)
        assert rows["spark1"]["complete"] and rows["spark2"]["complete"], run.stdout
        assert rows["spark1"]["commit"] == rows["spark2"]["commit"]
        assert hub_bytes(lab) == served  # spark2's copy came from spark1, not from the hub
        for node in (spark1, spark2):  # both are engine nodes in 2xsolo
            assert "HF_HUB_OFFLINE=1" in engine_env(lab, node), node.name
    finally:
        sparkdeploy(lab, "down")
