#!/usr/bin/env python3
"""How long a full `sparkdeploy doctor` (without --nccl) takes on the lab: two nodes vs one node alone.

Goals: two nodes under 10 s, and at most 1.5x one node alone (checks run in parallel across nodes over one
SSH connection each, so a second node should cost little). The one-node inventory is the lab's with only its
head node (paths made absolute). Each run is the real CLI in a fresh process (`python -m ... doctor --json`),
timed from start to exit, so Python start-up and imports count as a user would feel them; runs alternate
one/two nodes after one warm-up each, and the medians are compared.

    python benchmarks/doctor_time.py [--runs 5] [--recipe openai-gpt-oss-120b]

Needs the lab up (`sparkdeploy lab up`). Prints the figures; docs/benchmarks.md records them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

GOAL_TWO_NODES_S = 10.0
GOAL_RATIO = 1.5


def absolute_inventory(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    base = path.parent
    cluster = data.setdefault("cluster", {})
    for key in ("secrets_file", "known_hosts"):
        if cluster.get(key) and not os.path.isabs(os.path.expanduser(cluster[key])):
            cluster[key] = str(base / cluster[key])
    for node in data["nodes"]:
        ssh = node.get("ssh") or {}
        if ssh.get("key") and not os.path.isabs(os.path.expanduser(ssh["key"])):
            ssh["key"] = str(base / ssh["key"])
    return data


def run_doctor(inventory: Path, extra: list[str]) -> tuple[float, dict]:
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from sparkdeploy.cli.main import main; main()",
            "doctor",
            "-i",
            str(inventory),
            "--json",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    seconds = time.monotonic() - started
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise SystemExit(f"doctor printed no JSON (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}") from None
    return seconds, report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--recipe", default="openai-gpt-oss-120b", help="recipe for the image/memory/port checks ('' for none)"
    )
    parser.add_argument("--inventory", default=None, help="the lab's inventory (default: the default lab's)")
    parser.add_argument(
        "--cold",
        action="store_true",
        help="forget the image versions cached by image ID first (the first run reads them)",
    )
    args = parser.parse_args()

    from sparkdeploy.lab.spec import LabSpec

    lab_inv = Path(args.inventory) if args.inventory else LabSpec().inventory_path
    if not lab_inv.is_file():
        raise SystemExit(f"no lab inventory at {lab_inv}: run `sparkdeploy lab up` first")
    data = absolute_inventory(lab_inv)
    tmp = Path(tempfile.mkdtemp(prefix="doctor-bench-"))
    two = tmp / "two.yaml"
    two.write_text(yaml.safe_dump(data, sort_keys=False))
    one_data = dict(data, nodes=[n for n in data["nodes"] if n.get("role") == "head"])
    one = tmp / "one.yaml"
    one.write_text(yaml.safe_dump(one_data, sort_keys=False))
    rec = ["--recipe", args.recipe] if args.recipe else []
    cases = {"two nodes": (two, rec), "one node": (one, rec + (["--topology", "solo"] if rec else []))}

    times: dict[str, list[float]] = {k: [] for k in cases}
    inner: dict[str, list[float]] = {k: [] for k in cases}
    last: dict[str, dict] = {}
    from sparkdeploy.doctor.image import _cache_path

    if args.cold:
        _cache_path().unlink(missing_ok=True)
    cached_before = _cache_path().is_file()
    first: dict[str, float] = {}
    for name, (inv, extra) in cases.items():  # warm-up: page cache, SSH server side, image versions by ID
        first[name] = run_doctor(inv, extra)[0]
    for _ in range(args.runs):
        for name, (inv, extra) in cases.items():
            seconds, report = run_doctor(inv, extra)
            times[name].append(seconds)
            inner[name].append(report["seconds"])
            last[name] = report

    print(f"doctor (no --nccl), {args.runs} runs each, lab inventory {lab_inv}")
    for name in cases:
        s = last[name]["summary"]
        print(
            f"  {name:<9}: median {statistics.median(times[name]):.2f} s wall "
            f"(checks {statistics.median(inner[name]):.2f} s), min {min(times[name]):.2f}, "
            f"max {max(times[name]):.2f}; last run {s['pass']} pass {s['warn']} warn {s['fail']} fail "
            f"{s['skip']} skip"
        )
    print(
        f"  first runs (warm-up; image versions {'already cached' if cached_before else 'read by docker run'}): "
        + ", ".join(f"{k} {v:.2f} s" for k, v in first.items())
    )
    m2, m1 = statistics.median(times["two nodes"]), statistics.median(times["one node"])
    ratio = m2 / m1
    print(f"  two/one : {ratio:.2f}x (goal <= {GOAL_RATIO}x)  {'OK' if ratio <= GOAL_RATIO else 'MISSED'}")
    print(f"  two nodes under {GOAL_TWO_NODES_S:g} s: {'OK' if m2 < GOAL_TWO_NODES_S else 'MISSED'} ({m2:.2f} s)")
    return 0 if ratio <= GOAL_RATIO and m2 < GOAL_TWO_NODES_S else 1


if __name__ == "__main__":
    sys.exit(main())
