#!/usr/bin/env python3
"""CI's time with the lab suite split in two (scripts/test.sh, tests/support/lab_shards.py) against one lab suite.

Runs `bash scripts/test.sh` (what CI runs: setup, lint and types, the lab suite, then the fast suite) once per
mode, in this checkout's own lab (SPARKDEPLOY_LAB_INSTANCE, SPARKDEPLOY_LAB_SUBNETS, SPARKDEPLOY_STATE set; shard 2
derives its own lab from them): SPARKDEPLOY_LAB_SHARDS=1 (one lab suite on one lab, as before) and
SPARKDEPLOY_LAB_SHARDS=2 (two at once, each on its own lab). Prints each run's wall time, exit status, the test
counts it reported, its CPU seconds (the run's process tree, its rusage, plus this instance's node containers,
ci_overlap.LabCpu: a figure a busy shared machine changes little, unlike wall time) and the cores they kept busy,
the most memory the machine had in use (MemTotal - MemAvailable, sampled every 2 s: the
2-core CI machine has 23 GB) and the ratio split / single (goal: the split run under 30 minutes). Each run's log
goes to --logs. Run it with the labs already up (a first run brings them up) for CI's case, the lab kept.

    python3 benchmarks/ci_shards.py [--modes 1,2] [--logs DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from ci_overlap import LabCpu  # noqa: E402 - a sibling benchmark's sampler

COUNTS = re.compile(r"^=* ?(\d+ (?:passed|failed|error|errors|skipped|deselected)\b.*) in [\d.]+s", re.M)


def memory_in_use_mb() -> int:
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
    kb = int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])
    return kb // 1024


class PeakMemory:
    """The most memory in use on the machine while a run goes (sampled)."""

    def __init__(self) -> None:
        self.peak = memory_in_use_mb()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(2.0):
            self.peak = max(self.peak, memory_in_use_mb())

    def __enter__(self) -> PeakMemory:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def run(shards: int, logs: Path) -> dict[str, object]:
    log = logs / f"test-sh-shards{shards}.log"
    env = {**os.environ, "SPARKDEPLOY_LAB_SHARDS": str(shards)}
    load = os.getloadavg()[0]
    with LabCpu(os.environ["SPARKDEPLOY_LAB_INSTANCE"]) as nodes, PeakMemory() as memory, open(log, "w") as out:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            ["bash", "scripts/test.sh", "-p", "no:cacheprovider"], cwd=REPO, env=env, stdout=out, stderr=out
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - t0
    rc = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime + nodes.seconds
    counts = COUNTS.findall(log.read_text(errors="replace"))
    print(
        f"{shards} lab suite(s): exit {rc}, wall {wall:7.1f} s ({wall / 60:.1f} min), CPU {cpu:.0f} s "
        f"(cores busy {cpu / wall:.2f}), peak memory in use {memory.peak} MB, load average {load:.1f} at the start; "
        f"{' | '.join(counts)}; log {log}",
        flush=True,
    )
    return {"wall": wall, "rc": rc, "cpu": cpu}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="1,2", help="lab suites at once, one run each, in this order (default 1,2)")
    ap.add_argument("--logs", type=Path, default=None, help="folder for each run's log (default: a new temp folder)")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",")]
    if not modes or any(m not in ("1", "2") for m in modes):
        print(f"ci_shards: --modes {args.modes!r}: give 1, 2 or 1,2", file=sys.stderr)
        return 2
    if not os.environ.get("SPARKDEPLOY_LAB_INSTANCE"):
        print(
            "set SPARKDEPLOY_LAB_INSTANCE, SPARKDEPLOY_LAB_SUBNETS and SPARKDEPLOY_STATE: this checkout's own lab",
            file=sys.stderr,
        )
        return 2
    logs = args.logs or Path(tempfile.mkdtemp(prefix="ci-shards-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} cores, {memory_in_use_mb()} MB in use at the start", flush=True)
    walls = {m: run(int(m), logs)["wall"] for m in modes}
    if "1" in walls and "2" in walls:
        print(f"ratio split / single = {float(walls['2']) / float(walls['1']):.2f} (1.0: no gain; goal: under 30 min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
