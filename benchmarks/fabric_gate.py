#!/usr/bin/env python3
"""What the fabric gate (sparkdeploy/deploy/fabric_gate.py) costs `up -t cluster` on the lab's nodes, against the
goal of under 20 s on two nodes.

Each round changes the deployment twice (a --set value that restarts every engine; an unchanged deployment skips
the gate): once `up --no-fabric-gate` (the baseline), once `up` with the gate. Prints each round, the median of
the gate's own time (`fabric_gate.seconds` of `up --json`), the medians of both `up`s, and the ratios. The lab's
GPUs are simulated: the probe is gloo on CPU over the real fabric network (SIMULATED); on a pair of Sparks the
probe runs NCCL over the CX7 link (see docs/multinode.md for the command an owner runs).

    python benchmarks/fabric_gate.py [--inventory lab] [--runs 3] [--down]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GOAL_S = 20.0
RECIPE = "openai-gpt-oss-120b"
CLI = [sys.executable, "-c", "from sparkdeploy.cli.main import main; main()"]
LENGTHS = ("32768", "16384")  # vllm.max_model_len: each change restarts every engine


def sd_timed(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    """The CLI and its wall time; a run refused because another holds the inventory's lock waits and retries."""
    while True:
        t0 = time.monotonic()
        r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=900)
        seconds = time.monotonic() - t0
        if "another sparkdeploy run" not in r.stderr:
            return r, seconds
        time.sleep(3)


def up(inventory: str, length: str, *extra: str) -> tuple[dict, float]:
    args = ("up", "-r", RECIPE, "-t", "cluster", "-i", inventory, "--set", f"vllm.max_model_len={length}", "--json")
    r, seconds = sd_timed(*args, *extra)
    if r.returncode != 0:
        raise SystemExit(f"`sparkdeploy {' '.join(args + extra)}` failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return json.loads(r.stdout), seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inventory", default="lab")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--down", action="store_true", help="sparkdeploy down at the end")
    a = p.parse_args()
    without, with_gate, gate = [], [], []
    nodes = 0
    for i in range(a.runs):
        _res, t_off = up(a.inventory, LENGTHS[0], "--no-fabric-gate")
        res, t_on = up(a.inventory, LENGTHS[1])
        g = res["fabric_gate"]
        if g["status"] != "passed":
            raise SystemExit(f"round {i + 1}: the gate did not run and pass: {g}")
        nodes = len({c["node"] for c in g["checks"] if c.get("node") and "," not in c["node"]})
        without.append(t_off)
        with_gate.append(t_on)
        gate.append(g["seconds"])
        probe = next(c for c in g["checks"] if c["check"] == "nccl.allreduce")
        print(
            f"round {i + 1}: up --no-fabric-gate {t_off:.1f} s; up {t_on:.1f} s; gate {g['seconds']:.1f} s "
            f"({probe['measured']})"
        )
    m_off, m_on, m_gate = (statistics.median(x) for x in (without, with_gate, gate))
    sim = " SIMULATED (gloo on CPU over the lab's fabric network)" if res["fabric_gate"]["simulated"] else ""
    print(f"nodes: {nodes}; runs: {a.runs}{sim}")
    print(f"median up --no-fabric-gate: {m_off:.1f} s; median up with the gate: {m_on:.1f} s (x{m_on / m_off:.2f})")
    print(f"median gate: {m_gate:.1f} s; goal < {GOAL_S:g} s: {m_gate / GOAL_S:.2f} of the goal")
    if a.down:
        sd_timed("down", "-i", a.inventory)
    return 0 if m_gate < GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
