#!/usr/bin/env python3
"""What `doctor --tests` costs, and that doctor without it costs what it did: two lab nodes.

Three cases, each the real CLI in a fresh process (`python -c ... doctor --json`), timed from start to exit
(Python start-up and imports count, as a user feels them), alternated after one warm-up each, medians compared:

  default          doctor as it runs without --tests (every check, the recipe's included), this tree
  baseline         the same command with another tree's sparkdeploy first on PYTHONPATH (--baseline DIR: e.g.
                   `git archive 382888e | tar -x -C DIR`, main before --tests), so "as fast as now" is a ratio
  --tests @spark   the default run plus the shipped example checks (sparkdeploy/doctor/spark_checks) on each node

    python benchmarks/doctor_tests_time.py [--runs 7] [--baseline DIR]

Needs the lab up (`sparkdeploy lab up`). Prints the figures; docs/benchmarks.md records them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

GOAL_DEFAULT_RATIO = 1.10  # the default run at most 10% slower than the baseline tree's (noise on a loaded machine)


def run(inventory: Path, extra: list[str], pythonpath: str | None) -> tuple[float, dict]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", "from sparkdeploy.cli.main import main; main()", "doctor", "-i", str(inventory)]
        + ["--json", *extra],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=pythonpath or None,
    )
    seconds = time.monotonic() - started
    try:
        return seconds, json.loads(proc.stdout)
    except ValueError:
        raise SystemExit(f"doctor printed no JSON (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}") from None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--recipe", default="openai-gpt-oss-120b")
    parser.add_argument("--baseline", default=None, help="a tree whose sparkdeploy/ is the baseline (main's)")
    parser.add_argument("--inventory", default=None, help="the lab's inventory (default: the default lab's)")
    args = parser.parse_args()

    from sparkdeploy.lab.spec import LabSpec

    inv = Path(args.inventory) if args.inventory else LabSpec().inventory_path
    if not inv.is_file():
        raise SystemExit(f"no lab inventory at {inv}: run `sparkdeploy lab up` first")
    rec = ["--recipe", args.recipe]
    cases: dict[str, tuple[list[str], str | None]] = {"default": (rec, None)}
    if args.baseline:
        cases["baseline"] = (rec, str(Path(args.baseline).resolve()))
    cases["--tests @spark"] = (rec + ["--tests", "@spark"], None)

    times: dict[str, list[float]] = {k: [] for k in cases}
    last: dict[str, dict] = {}
    for extra, path in cases.values():  # warm-up: page cache, image versions by ID
        run(inv, extra, path)
    for _ in range(args.runs):
        for name, (extra, path) in cases.items():
            seconds, report = run(inv, extra, path)
            times[name].append(seconds)
            last[name] = report

    load = os.getloadavg()
    print(f"doctor on two lab nodes, {args.runs} runs each (load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f})")
    for name in cases:
        s = last[name]["summary"]
        t = times[name]
        print(
            f"  {name:<15}: median {statistics.median(t):.2f} s, min {min(t):.2f}, max {max(t):.2f}; last run "
            f"{s['pass']} pass {s['warn']} warn {s['fail']} fail {s['skip']} skip (exit {last[name]['exit_code']})"
        )
    default = statistics.median(times["default"])
    with_tests = statistics.median(times["--tests @spark"])
    rows = sum(1 for r in last["--tests @spark"]["results"] if r["check"].startswith("tests:"))
    print(f"  --tests @spark adds {with_tests - default:.2f} s ({with_tests / default:.2f}x) for {rows} test rows")
    ok = True
    if "baseline" in times:
        ratio = default / statistics.median(times["baseline"])
        ok = ratio <= GOAL_DEFAULT_RATIO
        print(f"  default / baseline: {ratio:.2f}x (goal <= {GOAL_DEFAULT_RATIO}x)  {'OK' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
