#!/usr/bin/env python3
"""How long `sparkdeploy top --once --json` and `sparkdeploy logs --tail 100` take on two nodes.

Goal: each under 2 s on a two-node deployment (2xsolo: an engine on each node and the proxy on the head).
Each run is the real CLI in a fresh process, timed from start to exit, so Python start-up, imports, the SSH
connections (host keys checked) and the scrapes count as a user would feel them. `top --once` includes its
one sample gap (--sample-gap, 0.5 s by default: two scrapes that far apart give the token rates), so the
figure is also printed without it. One warm-up each, then the runs alternate; medians are compared with
the goal (ratio < 1 meets it).

    sparkdeploy up -i lab -t 2xsolo         # the deployment to watch (any two-node topology)
    python benchmarks/daytwo_time.py -i lab [--runs 7]

Prints the figures; docs/benchmarks.md records them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

GOAL_S = 2.0


def timed(argv: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", "from sparkdeploy.cli.main import main; main()", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"`sparkdeploy {' '.join(argv)}` exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return seconds, proc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-i", "--inventory", default="lab")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--sample-gap", type=float, default=0.5)
    args = parser.parse_args()
    top = ["top", "-i", args.inventory, "--once", "--json", "--sample-gap", str(args.sample_gap)]
    logs = ["logs", "-i", args.inventory, "--tail", "100"]
    _, first = timed(top)
    nodes = {e["node"] for e in json.loads(first.stdout)["engines"]}
    _, lines = timed(logs)
    log_nodes = {line.split("/", 1)[0] for line in lines.stdout.splitlines() if "/" in line.split(" ", 1)[0]}
    print(
        f"engines on {len(nodes)} node(s) ({', '.join(sorted(nodes))}); logs from {len(log_nodes)} node(s), "
        f"{len(lines.stdout.splitlines())} lines"
    )
    if len(nodes) < 2 or len(log_nodes) < 2:
        print("warning: fewer than two nodes serve: deploy a two-node topology first", file=sys.stderr)
    top_s, logs_s = [], []
    for _ in range(args.runs):
        top_s.append(timed(top)[0])
        logs_s.append(timed(logs)[0])
    rows = [
        ("top --once --json", statistics.median(top_s)),
        ("top --once, less the sample gap", statistics.median(top_s) - args.sample_gap),
        ("logs --tail 100", statistics.median(logs_s)),
    ]
    print(f"{'command':34} {'median s':>9} {'ratio to 2 s':>13}   runs: {args.runs}")
    for name, value in rows:
        print(f"{name:34} {value:9.2f} {value / GOAL_S:13.2f}")
    print(
        "all: " + ", ".join(f"{x:.2f}" for x in top_s) + " (top) | " + ", ".join(f"{x:.2f}" for x in logs_s) + " (logs)"
    )
    return 0 if rows[0][1] < GOAL_S and rows[2][1] < GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
