"""The guard in the lab (#29): a memory hog on one node beside a serving engine (2xsolo, vllm-sim: SIMULATED GPU).

The node's memory is its container's cgroup limit (the lab's stand-in for a Spark's unified memory), lowered for
this test with `docker update` until 1.5 GiB is available, so the hog needs little of the host's memory.
The guard's lines come from the inventory (cluster.guard). The hog (python over SSH, in the node's cgroup) grows
64 MiB every 0.1 s towards a target below the limit; the guard must stop the engine as the hard line is crossed.
Measured throughout: SSH to the node answers (a command every 0.5 s). Then: `status` says why, the other node's
engine is untouched (same container, no restart), `postmortem --json` shows the events, and `up` after the hog
ended converges (the engine serves again, the guard is back to ok).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import threading
import time

import pytest
import yaml

from tests.deploy.test_deploy_lab import _fail, sd

pytestmark = pytest.mark.lab

RECIPE = "openai-gpt-oss-120b"
GIB = 1 << 30
HARD_GIB, SOFT_GIB = 0.6, 0.9  # available memory, of the node's lowered limit (what leaves 1.5 GiB available)


def _status(inv: str) -> dict:
    r = sd("status", "-i", inv, "--json")
    assert r.returncode == 0, _fail(r)
    return json.loads(r.stdout)


def _containers(data: dict, node: str) -> dict[str, dict]:
    return {c["name"]: c for n in data["nodes"] if n["name"] == node for c in n["containers"]}


HOG = r"""
import sys, time
target = int(sys.argv[1]); chunks = []
while sum(len(c) for c in chunks) < target:
    chunks.append(bytearray(min(64 << 20, target - sum(len(c) for c in chunks))))  # bytearray: zeroed, resident
    time.sleep(0.1)
print("hog holds", sum(len(c) for c in chunks) >> 20, "MiB", flush=True)
time.sleep(4)
"""


def test_the_guard_stops_the_engine_before_a_hog_wedges_the_node(lab, tmp_path):
    spec = lab.spec
    if not spec.node_memory_mb:
        pytest.skip("the lab runs without node memory limits (SPARKDEPLOY_LAB_NODE_MEMORY_MB=0)")
    data = yaml.safe_load(spec.inventory_path.read_text())
    data["cluster"]["guard"] = {"soft_available_gib": SOFT_GIB, "hard_available_gib": HARD_GIB, "grace_s": 3}
    inv_path = spec.directory / "inventory-guard-test.yaml"  # beside the lab's: its relative paths hold
    inv_path.write_text(yaml.safe_dump(data))
    inv = str(inv_path)
    hog_node, other = lab.nodes[0], lab.nodes[1]
    container = spec.container_name(hog_node.name)
    try:
        r = sd("up", "-i", inv, "-r", RECIPE, "-t", "2xsolo", "--timeout", "300")
        assert r.returncode == 0, _fail(r)
        before = _status(inv)
        other_engine = _containers(before, other.name)["sparkdeploy-vllm"]
        assert other_engine["running"]
        seen = next(n for n in before["nodes"] if n["name"] == hog_node.name)["guard"]
        assert seen["memory_source"] == "cgroup" and "SIMULATED" in seen["memory_label"], seen
        # available = limit - usage + inactive file pages: lower the limit until the guard sees 1.5 GiB available
        limit = (seen["total_mb"] - seen["available_mb"]) * (1 << 20) + int(1.5 * GIB)
        subprocess.run(["docker", "update", "--memory", str(limit), "--memory-swap", str(limit), container], check=True)
        time.sleep(2)  # the guard reads the new limit on its next sample
        target = int(1.5 * GIB) - int(0.35 * GIB)  # stays below the limit: the guard, not the OOM killer, acts

        latencies: list[float] = []
        failures: list[str] = []
        stop = threading.Event()

        def probe() -> None:
            while not stop.is_set():
                t0 = time.monotonic()
                p = lab.ssh(hog_node, "true", check=False)
                latencies.append(time.monotonic() - t0)
                if p.returncode != 0:
                    failures.append(p.stderr[-200:])
                stop.wait(0.5)

        prober = threading.Thread(target=probe)
        prober.start()
        try:
            hog = lab.ssh(hog_node, f"python3 -c {shlex.quote(HOG)} {target}", check=False)
        finally:
            stop.set()
            prober.join()
        assert hog.returncode == 0 and "hog holds" in hog.stdout, hog.stderr[-500:]
        assert not failures and latencies, failures
        print(f"SSH during the hog: {len(latencies)} probes, max {max(latencies):.2f} s")

        after = _status(inv)
        guard = next(n for n in after["nodes"] if n["name"] == hog_node.name)["guard"]
        assert guard["state"] == "held" and "hard line" in guard["reason"], guard
        assert guard["last_stop"]["engines"] == ["sparkdeploy-vllm"], guard
        assert not _containers(after, hog_node.name)["sparkdeploy-vllm"]["running"]
        r = sd("status", "-i", inv)
        assert f"{hog_node.name} guard HELD" in r.stdout and "hard line" in r.stdout, _fail(r)
        untouched = _containers(after, other.name)["sparkdeploy-vllm"]
        assert untouched["running"] and untouched["started_at"] == other_engine["started_at"]
        assert untouched["restarts"] == other_engine["restarts"]

        r = sd("postmortem", hog_node.name, "-i", inv, "--json")
        assert r.returncode == 0, _fail(r)
        events = [e["ev"] for e in json.loads(r.stdout)["nodes"][0]["events"]]
        assert "hard" in events and "stopped" in events, events

        subprocess.run(
            [
                "docker",
                "update",
                "--memory",
                f"{spec.node_memory_mb}m",
                "--memory-swap",
                f"{spec.node_memory_mb}m",
                container,
            ],
            check=True,
        )
        r = sd("up", "-i", inv, "-r", RECIPE, "-t", "2xsolo", "--timeout", "300")
        assert r.returncode == 0, _fail(r)
        assert _containers(_status(inv), hog_node.name)["sparkdeploy-vllm"]["running"]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the guard sees the engine run again within its 5 s check
            guard = next(n for n in _status(inv)["nodes"] if n["name"] == hog_node.name)["guard"]
            if guard["state"] == "ok":
                break
            time.sleep(2)
        assert guard["state"] == "ok", guard

        # The black box after the guard itself was killed (SIGKILL: no clean exit) and came back 12 s later.
        lab.docker_exec(other, "docker", "kill", "sparkdeploy-guard")
        time.sleep(12)
        lab.docker_exec(other, "docker", "start", "sparkdeploy-guard")
        time.sleep(3)
        r = sd("postmortem", other.name, "-i", inv, "--json")
        assert r.returncode == 0, _fail(r)
        crash = json.loads(r.stdout)["nodes"][0]["crash"]
        assert crash["kind"] == "guard restarted" and crash["gap_s"] >= 10, crash
        r = sd("doctor", "-i", inv, "--only", "guard.crash", "--json")
        found = [c for c in json.loads(r.stdout)["results"] if c["node"] == other.name and c["check"] == "guard.crash"]
        assert found[0]["status"] == "warn" and "guard restarted" in found[0]["measured"], found
    finally:
        subprocess.run(
            [
                "docker",
                "update",
                "--memory",
                f"{spec.node_memory_mb}m",
                "--memory-swap",
                f"{spec.node_memory_mb}m",
                container,
            ],
            check=False,
        )
        sd("down", "-i", inv)
        inv_path.unlink(missing_ok=True)
