"""The real CLI in a subprocess, for lab tests that need a fresh process per command (locks, signals, env)."""

from __future__ import annotations

import subprocess
import sys
import time


def sd(
    *args: str, timeout: float = 900, env: dict | None = None, transcript: list[str] | None = None
) -> subprocess.CompletedProcess:
    """Run `sparkdeploy ARGS`. The lab is shared: while another run holds the inventory's lock (another test
    deploying), wait for it rather than fail. `transcript` collects every command and its output."""
    deadline = time.monotonic() + 600
    while True:
        r = subprocess.run(
            [sys.executable, "-c", "from sparkdeploy.cli.main import main; main()", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
        if transcript is not None:
            transcript.append(f"$ sparkdeploy {' '.join(args)}\n{r.stdout}\n{r.stderr}")
        if "another sparkdeploy run" not in r.stderr or time.monotonic() > deadline:
            return r
        time.sleep(3)


def failure(r: subprocess.CompletedProcess, limit: int = 6000) -> str:
    """A failed command's exit code and the tail of its output, for an assertion message."""
    return f"exit {r.returncode}\nstdout:\n{r.stdout[-limit:]}\nstderr:\n{r.stderr[-limit:]}"
