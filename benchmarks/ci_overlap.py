#!/usr/bin/env python3
"""Whether CI's fast suite can run beside its lab suite on a 2-core machine (scripts/test.sh runs them so).

Three runs in this checkout's own lab (SPARKDEPLOY_LAB_INSTANCE, SPARKDEPLOY_LAB_SUBNETS, SPARKDEPLOY_STATE set),
each timed and its CPU seconds counted: the fast suite alone, one lab module alone (tests/deploy/test_deploy_lab.py
unless --module), then both at once as scripts/test.sh starts them. CPU seconds are what the run's own process tree used
(its rusage: pytest is the subreaper of what it starts) plus what this lab's node containers used (their cgroup
v1 cpuacct, sampled every second): a figure a busy machine changes little, unlike the wall time. Prints each
run's wall and CPU seconds, the cores each kept busy, and the ratio of the overlapped run's wall time to the two
alone (goal: well under 1, the fast suite hidden behind the lab suite).

    python3 benchmarks/ci_overlap.py [--module tests/deploy/test_deploy_lab.py]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not lab"]
LAB = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "lab"]
CPUACCT = Path("/sys/fs/cgroup/cpuacct/docker")


class LabCpu:
    """CPU seconds used by this lab instance's containers while it runs (sampled: a container removed between
    two samples loses at most its last second)."""

    def __init__(self, instance: str):
        import docker

        self.client, self.instance = docker.from_env(), instance
        self.first: dict[str, int] = {}
        self.last: dict[str, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            for c in self.client.containers.list(filters={"name": f"sparkdeploy-{self.instance}-"}):
                try:
                    used = int((CPUACCT / str(c.id) / "cpuacct.usage").read_text())
                except OSError:
                    continue
                self.first.setdefault(str(c.id), used)
                self.last[str(c.id)] = used
            self.stop.wait(1.0)

    def __enter__(self) -> LabCpu:
        self.thread.start()
        time.sleep(1.5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    @property
    def seconds(self) -> float:
        return sum(self.last[c] - self.first[c] for c in self.last) / 1e9


def run(name: str, argvs: list[list[str]], instance: str) -> dict[str, float]:
    """Start every argv at once; wait for all. Returns wall and CPU seconds."""
    with LabCpu(instance) as lab:
        t0 = time.monotonic()
        procs = [subprocess.Popen(a, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for a in argvs]
        cpu = 0.0
        for p in procs:
            _, status, usage = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            cpu += usage.ru_utime + usage.ru_stime
        wall = time.monotonic() - t0
    failed = [" ".join(a[-1:]) for a, p in zip(argvs, procs, strict=True) if p.returncode]
    out = {"wall": wall, "cpu": cpu + lab.seconds}
    print(
        f"{name:<22} wall {wall:7.1f} s  CPU {out['cpu']:7.1f} s  cores busy {out['cpu'] / wall:4.2f}"
        + (f"  FAILED: {failed}" if failed else ""),
        flush=True,
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--module", default="tests/deploy/test_deploy_lab.py", help="the lab module to run")
    args = ap.parse_args()
    instance = os.environ.get("SPARKDEPLOY_LAB_INSTANCE", "")
    if not instance:
        print(
            "set SPARKDEPLOY_LAB_INSTANCE, SPARKDEPLOY_LAB_SUBNETS and SPARKDEPLOY_STATE: this checkout's own lab",
            file=sys.stderr,
        )
        return 2
    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    fast = run("fast suite alone", [FAST], instance)
    lab = run("lab module alone", [[*LAB, args.module]], instance)
    both = run("both at once", [FAST, [*LAB, args.module]], instance)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    print(f"ratio both / (fast + lab) = {both['wall'] / (fast['wall'] + lab['wall']):.2f} (1.0: no gain)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
