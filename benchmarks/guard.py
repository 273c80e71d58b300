#!/usr/bin/env python3
"""The memory guard's figures in the lab (issue #29), against its goals:

1. from the hard line crossed to the node's engine stopped: goal < 1 s. The line is crossed in one step: the
   node's cgroup limit (the lab's SIMULATED unified memory) is lowered with `docker update` until the guard sees
   0.3 GiB available, below its 0.6 GiB hard line. t0 is when `docker update` returns (the line is crossed then),
   t1 the guard's own record of the engine stopped (status.json last_stop.at: the same host clock). Between runs
   the limit is restored and `up` starts the engine again. Includes the guard's sampling interval (0.2 s) and
   Docker's stop of the engine (SIGTERM; vllm-sim exits on it; SIGKILL after grace_s would add up to 3 s).
2. the guard's own cost over --seconds on a quiet node: CPU (utime + stime of its process, /proc/1/stat in its
   container) as % of one core, and its resident memory (VmRSS): goals < 1% and < 50 MB.

    python benchmarks/guard.py [--inventory lab] [--runs 3] [--seconds 60] [--down]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.lab import LabSpec
from sparkdeploy.runtime.session import Session

GOAL_STOP_S, GOAL_CPU_PCT, GOAL_RSS_MB = 1.0, 1.0, 50.0
RECIPE = "openai-gpt-oss-120b"
CLI = [sys.executable, "-c", "from sparkdeploy.cli.main import main; main()"]
HARD_GIB, SOFT_GIB = 0.6, 0.9
GIB = 1 << 30


def sd(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        sys.exit(f"sparkdeploy {' '.join(args)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r


def node_sh(inventory: str, node: str, command: str) -> str:
    inv = load_inventory(inventory)
    with Session.open(inv) as session:
        return session.conn(node).run(["bash", "-c", command], timeout=60).stdout


def guard_status(inventory: str, node: str) -> dict:
    return json.loads(node_sh(inventory, node, "cat ~/.sparkdeploy/guard/status.json"))


def set_limit(container: str, limit: int | str) -> None:
    subprocess.run(
        ["docker", "update", "--memory", str(limit), "--memory-swap", str(limit), container],
        check=True,
        capture_output=True,
    )


def cost(inventory: str, node: str, seconds: float) -> tuple[float, float]:
    """(CPU % of one core, RSS MB) of the guard's process over `seconds`."""
    read = "docker exec sparkdeploy-guard cat /proc/1/stat; docker exec sparkdeploy-guard grep VmRSS /proc/1/status"
    tick = int(node_sh(inventory, node, "getconf CLK_TCK"))

    def sample() -> tuple[float, float, float]:
        out = node_sh(inventory, node, read).splitlines()
        fields = out[0].rsplit(")", 1)[1].split()
        return time.monotonic(), (int(fields[11]) + int(fields[12])) / tick, int(out[1].split()[1]) / 1024

    t0, cpu0, _ = sample()
    time.sleep(seconds)
    t1, cpu1, rss = sample()
    return 100 * (cpu1 - cpu0) / (t1 - t0), rss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--down", action="store_true", help="remove the deployment at the end")
    args = ap.parse_args()
    spec = LabSpec()
    if not spec.node_memory_mb:
        sys.exit("the lab runs without node memory limits: unset SPARKDEPLOY_LAB_NODE_MEMORY_MB")
    data = yaml.safe_load(spec.inventory_path.read_text())
    data["cluster"]["guard"] = {"soft_available_gib": SOFT_GIB, "hard_available_gib": HARD_GIB, "grace_s": 3}
    inv_path = spec.directory / "inventory-guard-bench.yaml"
    inv_path.write_text(yaml.safe_dump(data))
    inventory, node = str(inv_path), data["nodes"][0]["name"]
    container = spec.container_name(node)
    try:
        sd("up", "-i", inventory, "-r", RECIPE, "-t", "2xsolo", "--timeout", "300")
        time.sleep(3)
        cpu, rss = cost(inventory, node, args.seconds)
        times = []
        for run in range(args.runs):
            seen = guard_status(inventory, node)
            assert seen["state"] == "ok", seen
            limit = (seen["total_mb"] - seen["available_mb"]) * (1 << 20) + int(0.3 * GIB)
            t0 = time.time()
            set_limit(container, limit)
            deadline = time.time() + 30
            while time.time() < deadline:
                g = guard_status(inventory, node)
                if g.get("last_stop") and g["last_stop"]["at"] > t0:
                    break
                time.sleep(0.5)
            else:
                sys.exit(f"the guard did not stop the engine within 30 s: {g}")
            took = g["last_stop"]["at"] - t0
            times.append(took)
            print(
                f"run {run + 1}: hard line -> engine stopped {took:.3f} s (Docker stop {g['last_stop']['stop_s']} s; "
                f"{g['last_stop']['reason']})"
            )
            set_limit(container, f"{spec.node_memory_mb}m")
            sd("up", "-i", inventory, "-r", RECIPE, "-t", "2xsolo", "--timeout", "300")
            time.sleep(6)  # the guard sees the engine again (its 5 s check) and is back to ok
        median = statistics.median(times)
        print(
            f"hard line -> engine stopped: median {median:.3f} s of {len(times)} (max {max(times):.3f} s); "
            f"goal {GOAL_STOP_S:g} s: ratio {median / GOAL_STOP_S:.2f}"
        )
        print(
            f"guard cost over {args.seconds:g} s: CPU {cpu:.2f}% of a core (goal {GOAL_CPU_PCT:g}%: ratio "
            f"{cpu / GOAL_CPU_PCT:.2f}), RSS {rss:.1f} MB (goal {GOAL_RSS_MB:g} MB: ratio {rss / GOAL_RSS_MB:.2f})"
        )
        return 0 if median < GOAL_STOP_S and cpu < GOAL_CPU_PCT and rss < GOAL_RSS_MB else 1
    finally:
        set_limit(container, f"{spec.node_memory_mb}m")
        if args.down:
            sd("down", "-i", inventory)
        inv_path.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
