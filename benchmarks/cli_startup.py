#!/usr/bin/env python3
"""CLI startup against a baseline commit (#25: function-local imports only where a measured startup cost justifies
them, and no slower): `sparkdeploy <command> --help` for each command group, this checkout's sparkdeploy/ against
the baseline's (`git archive REV sparkdeploy` into a temporary folder), run alternately so that the load of the
machine falls on both alike. Prints, per command, the median CPU time (user + sys of the child, less noisy than
wall time on a shared machine), the ratio new/base and the number of modules loaded.

    python3 benchmarks/cli_startup.py --base c1d06e5 --runs 9
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS = [
    "",
    "up",
    "status",
    "images push",
    "bench sweep",
    "lab up",
    "models pull",
    "doctor",
    "top",
    "logs",
    "advise",
]
# The editable install's finder would import this checkout's package whatever sys.path says: drop it first.
PROGRAM = (
    "import os, sys\n"
    "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]\n"
    "sys.path.insert(0, os.environ['SPARKDEPLOY_SRC'])\n"
    "sys.argv = ['sparkdeploy', *sys.argv[1:]]\n"
    "from sparkdeploy.cli.main import main\n"
    "try:\n"
    "    main()\n"
    "except SystemExit:\n"
    "    pass\n"
    "assert sys.modules['sparkdeploy'].__file__.startswith(os.environ['SPARKDEPLOY_SRC'])\n"
    "print(len(sys.modules), file=sys.stderr)\n"
)


def run(src: Path, args: list[str]) -> tuple[float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, *args, "--help"],
        env=dict(os.environ, SPARKDEPLOY_SRC=str(src)),
        capture_output=True,
        text=True,
        check=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, int(done.stderr.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the baseline commit")
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "archive", args.base, "sparkdeploy"], cwd=REPO, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        print(f"{'command':16} {'base ms':>8} {'new ms':>8} {'new/base':>9} {'modules base/new':>17}")
        for command in COMMANDS:
            base, new = [], []
            for i in range(args.runs):  # alternate which goes first: neither gets the warmer caches
                for which in ("base", "new") if i % 2 == 0 else ("new", "base"):
                    t, mods = run(Path(tmp) if which == "base" else REPO, command.split())
                    if which == "base":
                        base.append(t)
                        base_mods = mods
                    else:
                        new.append(t)
                        new_mods = mods
            b, n = statistics.median(base) * 1000, statistics.median(new) * 1000
            print(f"{'[' + command + ']':16} {b:8.0f} {n:8.0f} {n / b:9.2f} {base_mods:>8}/{new_mods}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
