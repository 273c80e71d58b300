#!/usr/bin/env python3
"""CI as a new machine runs it: a fresh clone, `CI=true bash .ci/run` twice in a row, the wall time of each.

The machine is first emptied (benchmarks/empty_machine.py: the engine stopped, images, labs, venvs and state
removed); the first run installs and builds everything, the second reuses what the first built. Both must pass.
Destructive for every checkout on this engine: run it only on a machine nobody else is using.

    python3 benchmarks/fresh_clone_ci.py [--ref HEAD] [--runs 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from empty_machine import make_empty

REPO = Path(__file__).resolve().parents[1]
GOAL_S = 30 * 60


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", default="HEAD", help="commit to clone (default: this checkout's HEAD)")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sparkdeploy-ci-"))
    clone = work / "main"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", args.ref], capture_output=True, text=True, check=True).stdout.strip()],
        check=True)
    shared = REPO.parent / "shared"
    if shared.is_dir():
        (work / "shared").symlink_to(shared)
    make_empty(clone)
    results = []
    for i in range(args.runs):
        log = work / f"ci-run{i + 1}.log"
        t0 = time.monotonic()
        with open(log, "w") as f:
            code = subprocess.run(["bash", ".ci/run"], cwd=clone, stdout=f, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env=dict(os.environ, CI="true")).returncode
        seconds = time.monotonic() - t0
        tail = [line for line in log.read_text().splitlines() if " passed" in line or " failed" in line]
        results.append((code, seconds, tail))
        print(f"run {i + 1}: exit {code}, {seconds / 60:.1f} min  ({'; '.join(tail[-2:])})  log {log}", flush=True)
    ok = all(code == 0 for code, _, _ in results)
    print(f"{'PASS' if ok else 'FAIL'}: " + ", ".join(f"{s / 60:.1f} min" for _, s, _ in results)
          + f"  (goal < {GOAL_S / 60:.0f} min each)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
