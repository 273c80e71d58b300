#!/usr/bin/env python3
"""Day zero on the bare lab: from two new (virtual) Sparks to the first answer, by phase.

`sparkdeploy lab up --bare` (its own lab, on free subnets, beside any other) -> `init` -> `setup ssh` (password
from the lab's 0600 file, --grant-sudo) -> `setup network` -> `run-recipe` (pushes the engine images: none is
preloaded) -> one chat answer; then `lab down` of that lab. Prints each phase's seconds, the total, and what
day zero's own three commands cost as a share of it (the baseline: the rest, what `run-recipe` on an already
configured cluster costs). GPU, RDMA, link speed and systemd-networkd are SIMULATED in the lab.

    python3 benchmarks/dayzero_time.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAME = "bench-bare"


def sd(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run(
        [sys.executable, "-c", "from sparkdeploy.cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=REPO,
    )
    if r.returncode != 0:
        raise SystemExit(f"sparkdeploy {' '.join(args)} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def main() -> int:
    phases: dict[str, float] = {}
    tmp = Path(tempfile.mkdtemp(prefix="sparkdeploy-dayzero-"))
    last = time.monotonic()

    def mark(what: str) -> None:
        nonlocal last
        now = time.monotonic()
        phases[what], last = now - last, now
        print(f"dayzero: {what:<28} {phases[what]:6.1f} s", flush=True)

    sd("lab", "down", "--name", NAME)
    up = json.loads(sd("lab", "up", "--bare", "--name", NAME, "--json").stdout)
    notes = json.loads(Path(up["inventory"]).read_text())
    mark("lab up --bare")
    try:
        out, pw = tmp / "inventory.yaml", ["--password-file", notes["password_file"]]
        sd(
            "init",
            "--hosts",
            ",".join(notes["hosts"]),
            "--user",
            notes["user"],
            *pw,
            "--key",
            str(tmp / "id"),
            "--known-hosts",
            str(tmp / "known_hosts"),
            "--out",
            str(out),
            "--yes",
        )
        mark("init")
        sd("setup", "ssh", "-i", str(out), *pw, "--grant-sudo")
        mark("setup ssh")
        sd("setup", "network", "-i", str(out))
        mark("setup network")
        lab_inv = out  # init found these hosts in the bare lab's notes: the lab's settings are in it
        sd("run-recipe", "openai-gpt-oss-120b", "--inventory", str(lab_inv))
        mark("run-recipe (push, serve)")
        chat = subprocess.run(
            [sys.executable, "scripts/chat.py", "--inventory", str(lab_inv), "What is a DGX Spark?"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
        )
        if chat.returncode != 0 or not chat.stdout.strip():
            raise SystemExit(f"no answer: {chat.stdout}{chat.stderr}")
        mark("first answer")
    finally:
        subprocess.run(
            [sys.executable, "-c", "from sparkdeploy.cli.main import main; main()", "lab", "down", "--name", NAME],
            capture_output=True,
            cwd=REPO,
        )
    total = sum(phases.values())
    own = phases["init"] + phases["setup ssh"] + phases["setup network"]
    rest = total - own
    print(
        f"dayzero: bare lab to first answer {total:.1f} s; init + setup ssh + setup network {own:.1f} s "
        f"= {own / total:.0%} of it; ratio to the rest (lab up, serve, answer: {rest:.1f} s) {own / rest:.2f} "
        f"(SIMULATED: GPU, RDMA, link speed, systemd-networkd; {os.cpu_count()} cores)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
