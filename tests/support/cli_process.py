"""The real CLI in a subprocess, for tests that need a fresh process per command (locks, signals, env)."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.support.processes import spawn


def cli_argv(*args: str) -> list[str]:
    """`sparkdeploy ARGS` as an argv, with this interpreter (the venv's)."""
    return [sys.executable, "-c", "from sparkdeploy.cli.main import main; main()", *args]


def spawn_cli(*args: str, **popen) -> subprocess.Popen:
    """`sparkdeploy ARGS` in the background, for a test that signals it: SIGINT at its default whatever the suite
    was started with (tests/support/processes.spawn), text pipes unless told otherwise."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    popen.setdefault("text", True)
    return spawn(cli_argv(*args), **popen)


def sd(
    *args: str, timeout: float = 900, env: dict | None = None, transcript: list[str] | None = None
) -> subprocess.CompletedProcess:
    """Run `sparkdeploy ARGS`. The lab is shared: while another run holds the inventory's lock (another test
    deploying), wait for it rather than fail. `transcript` collects every command and its output."""
    deadline = time.monotonic() + 600
    while True:
        r = subprocess.run(
            cli_argv(*args),
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
