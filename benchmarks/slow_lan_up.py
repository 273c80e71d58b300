#!/usr/bin/env python3
"""Idempotent `sparkdeploy up` on a slow LAN: 300 ms added on every packet the lab nodes send on the management
network (tc netem inside each node, or where the kernel lacks netem the same delay through an NFQUEUE:
tests/faults/latency.py), against the goal of < 10 s and the same run on the plain lab network.

The deployment is brought up once (not timed). Then, --runs times each: `sparkdeploy up` with the same inputs as
a CLI subprocess on the plain network (the baseline), and the same with netem's delay on every node's management
interface. Every timed run must report 0 changed. Prints each run, both medians, the slow/plain ratio and the
slow median's ratio to the goal; removes the delay whatever happens. Exit 1 when the slow median misses the goal.

    python benchmarks/slow_lan_up.py [--runs 3] [--delay-ms 300] [--topology cluster] [--down]

Needs the lab (`sparkdeploy lab up`); the delay goes in as root with `docker exec`.
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

GOAL_S = 10.0
RECIPE = "openai-gpt-oss-120b"
CLI = [sys.executable, "-c", "from sparkdeploy.cli.main import main; main()"]


def sd_timed(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=900)
    return r, time.monotonic() - t0


def set_delay(nodes: list[tuple[str, str]], delay_ms: int | None) -> None:
    from tests.faults.latency import add_delay, remove_delay

    for container, iface in nodes:
        remove_delay(container, iface)
        if delay_ms:
            print(f"{container} {iface}: +{delay_ms} ms ({add_delay(container, iface, delay_ms)})")


def timed_runs(args: list[str], runs: int, label: str) -> list[float]:
    samples = []
    for i in range(runs):
        r, seconds = sd_timed("up", *args, "--json")
        if r.returncode != 0 or json.loads(r.stdout)["changed"] != 0:
            raise SystemExit(
                f"{label} run {i + 1} failed or changed something:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
            )
        samples.append(seconds)
        print(f"{label} run {i + 1}: {seconds:.2f} s, 0 changed")
    return samples


def main() -> int:
    from sparkdeploy.lab import LabSpec
    from tests.faults.latency import mgmt_iface

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--delay-ms", type=int, default=300)
    ap.add_argument("--topology", default="cluster", choices=["cluster", "2xsolo", "solo"])
    ap.add_argument("--backend", default="native", choices=["ray", "torchrun", "native"])
    ap.add_argument("--down", action="store_true", help="run `sparkdeploy down` at the end")
    opts = ap.parse_args()

    spec = LabSpec()
    inventory = str(spec.inventory_path)
    nodes = [
        (spec.container_name(n.name), mgmt_iface(spec.container_name(n.name), n.mgmt_ip)) for n in spec.node_specs()
    ]
    args = ["--recipe", RECIPE, "-t", opts.topology, "-i", inventory, "--timeout", "300"]
    if opts.topology == "cluster":
        args += ["-b", opts.backend]
    r, _ = sd_timed("up", *args)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:], sep="\n")
        return 1
    plain = timed_runs(args, opts.runs, "plain network")
    try:
        set_delay(nodes, opts.delay_ms)
        slow = timed_runs(args, opts.runs, f"+{opts.delay_ms} ms")
    finally:
        set_delay(nodes, None)
    mp, ms = statistics.median(plain), statistics.median(slow)
    print(
        f"\nidempotent `sparkdeploy up` ({opts.topology}, {len(nodes)} lab nodes), median of {opts.runs}: "
        f"plain {mp:.2f} s, +{opts.delay_ms} ms on the management network {ms:.2f} s "
        f"(min {min(slow):.2f}, max {max(slow):.2f}); slow/plain = {ms / mp:.1f}x; goal < {GOAL_S:g} s; "
        f"ratio median/goal = {ms / GOAL_S:.2f}"
    )
    if opts.down:
        sd_timed("down", "-i", inventory)
    return 0 if ms < GOAL_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
