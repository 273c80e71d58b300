#!/usr/bin/env python3
"""CI as a new machine runs it: a fresh clone, `CI=true bash .ci/run` twice in a row, the wall time of each.

The machine is first emptied, in two steps: `benchmarks/empty_machine.py --yes` (everything sparkdeploy made:
every lab of any checkout on this engine, sparkdeploy's images, the clone's venvs, the state folder; nothing
else), then pip's download cache, emptied here (`pip cache dir`, else pip's default folder): CI must pass with
nothing downloaded before. The Docker engine keeps running (CI's .ci/start-docker.sh finds it answering; the
empty_machine script never stops an engine). The first run installs and builds everything, the second reuses
what the first built. Both must pass. It removes the labs of every checkout on this engine and the user's pip
cache: run it only on a machine nobody else is using.

    python3 benchmarks/fresh_clone_ci.py [--ref HEAD] [--runs 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import empty_machine

REPO = Path(__file__).resolve().parents[1]
GOAL_S = 30 * 60


def pip_cache_dir() -> Path:
    """pip's download cache: where `pip cache dir` says (its config files included), else pip's default."""
    asked = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True)
    if asked.returncode == 0 and asked.stdout.strip():
        return Path(asked.stdout.strip())
    if os.environ.get("PIP_CACHE_DIR"):
        return Path(os.environ["PIP_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pip"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", default="HEAD", help="commit to clone (default: this checkout's HEAD)")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sparkdeploy-ci-"))
    clone = work / "main"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(clone),
            "checkout",
            "-q",
            subprocess.run(
                ["git", "-C", str(REPO), "rev-parse", args.ref], capture_output=True, text=True, check=True
            ).stdout.strip(),
        ],
        check=True,
    )
    shared = REPO.parent / "shared"
    if shared.is_dir():
        (work / "shared").symlink_to(shared)
    if empty_machine.main(["--yes", "--repo", str(clone)]) != 0:
        print("FAIL: the machine could not be emptied (above)")
        return 1
    cache = pip_cache_dir()
    shutil.rmtree(cache, ignore_errors=True)
    print(f"emptied pip's download cache: {cache}", flush=True)
    results = []
    for i in range(args.runs):
        log = work / f"ci-run{i + 1}.log"
        t0 = time.monotonic()
        with open(log, "w") as f:
            code = subprocess.run(
                ["bash", ".ci/run"],
                cwd=clone,
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(os.environ, CI="true"),
            ).returncode
        seconds = time.monotonic() - t0
        tail = [line for line in log.read_text().splitlines() if " passed" in line or " failed" in line]
        results.append((code, seconds, tail))
        print(f"run {i + 1}: exit {code}, {seconds / 60:.1f} min  ({'; '.join(tail[-2:])})  log {log}", flush=True)
    ok = all(code == 0 for code, _, _ in results)
    print(
        f"{'PASS' if ok else 'FAIL'}: "
        + ", ".join(f"{s / 60:.1f} min" for _, s, _ in results)
        + f"  (goal < {GOAL_S / 60:.0f} min each)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
