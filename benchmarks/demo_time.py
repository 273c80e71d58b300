#!/usr/bin/env python3
"""How long the README's main job takes to its first answer, by phase, against the 300 s goal.

Runs `bash scripts/demo.sh` and reads the `demo:` step lines it prints (seconds since its start) and the
`lab up` phase summary, then prints one table and the total. With --from-empty it first puts this machine
in the state of a fresh one as far as sparkdeploy goes (`benchmarks/empty_machine.py --yes`: every lab, sparkdeploy's
images, this checkout's venvs and wheels, the state folder; nothing else: the engine keeps running and pip's
download cache stays). That REMOVES the labs and images of every checkout on this engine: run it on a machine
nobody else is using.

    python3 benchmarks/demo_time.py --from-empty      # what a new user waits for
    python3 benchmarks/demo_time.py                   # again, with what the first run built
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

import empty_machine

REPO = Path(__file__).resolve().parents[1]
GOAL_S = 300.0
STEP = re.compile(r"^demo: (?P<what>.+?)\s+done at\s+(?P<at>[\d.]+) s$")
LAB_PHASES = re.compile(r"^time: (?P<phases>.*lab images.*)$")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from-empty", action="store_true", help="wipe to a fresh machine's state first")
    args = parser.parse_args()
    if args.from_empty and empty_machine.main(["--yes", "--repo", str(REPO)]) != 0:
        print("the machine could not be emptied (above)")
        return 1
    t0 = time.monotonic()
    proc = subprocess.Popen(
        ["bash", "scripts/demo.sh"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    steps: list[tuple[str, float]] = []
    lab_phases = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        text = line.strip()
        if m := STEP.match(text):
            steps.append((m["what"], float(m["at"])))
        elif m := LAB_PHASES.match(text):
            lab_phases = m["phases"]
    code = proc.wait()
    total = time.monotonic() - t0
    print(f"\n== demo to first answer ({'from empty' if args.from_empty else 'warm'}), exit {code} ==")
    before = 0.0
    for what, at in steps:
        print(f"  {what:<38} {at - before:7.1f} s  (at {at:6.1f} s)")
        before = at
    if lab_phases:
        print(f"  lab up phases: {lab_phases}")
    print(f"  total {total:.1f} s   goal <= {GOAL_S:.0f} s   ratio {total / GOAL_S:.2f}")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
