"""No process the tests start outlives its test, and none outlives the suite (issue 44).

- `spawn(argv, **popen)`: subprocess.Popen for a process a test will signal. It starts with SIGINT and SIGQUIT at
  their defaults, whatever this process has: a suite started as `cmd &` by a non-interactive shell runs with
  them ignored, every child inherits that, and a Ctrl-C the test sends would be ignored. It leads a process
  group of its own, so its children can be found and stopped with it.
- `descendants()`, `kill_tree()`: the processes below one, found in /proc (Linux).
- The pytest plugin (tests/conftest.py loads it):
  - pytest becomes a child subreaper: a process whose parent died (a CLI killed while its child ran) is
    re-parented to pytest, not to init, so it is still seen as the suite's;
  - after each test (in its teardown, which runs whatever the test did), every process started during the test
    that is still alive is killed, with its children: a failing test leaves nothing behind;
  - when the session ends (every fixture torn down), a process of the suite still alive fails the run, named,
    and is killed. What is started on purpose to outlive the suite (the Docker engine ensure_engine may start)
    is declared with `outliving()`; a container's shim, and what runs below it, is the engine's (`_engines`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
DEFAULT_SIGNALS = (signal.SIGINT, signal.SIGQUIT)  # what a shell ignores for `cmd &`
Proc = tuple[int, int]  # (pid, start time in clock ticks): a pid the kernel reused is another process

_outliving: set[Proc] = set()
SHIM = "containerd-shim"  # a container's shim's command name (containerd-shim-runc-v2, cut to 15 characters)


def _defaults() -> None:  # in the child, between fork and exec: async-signal-safe calls only
    for sig in DEFAULT_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def spawn(argv: list[str], **popen) -> subprocess.Popen:
    """Popen(argv, **popen), started with SIGINT and SIGQUIT at their defaults, in a process group of its own."""
    popen.setdefault("process_group", 0)
    return subprocess.Popen(argv, preexec_fn=_defaults, **popen)  # signal() only: safe between fork and exec


def _stat(pid: int) -> tuple[int, str] | None:
    """(start time, state) of a process; None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[19]), fields[0]


def _children(pid: int) -> list[int]:
    """Its children, from /proc/PID/task/*/children (only the subtree is read: the whole /proc costs ms)."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            out += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except OSError:
            continue  # a thread that ended while we looked
    return out


def _engines(pid: int) -> bool:
    """Whether it is a container's shim: the Docker engine's, not the suite's. It daemonizes, so when the suite
    started the engine (ensure_engine) it is re-parented to pytest; its container is stopped by Docker, and every
    process in it (a lab node's Docker engine restarting a container inside) is Docker's too. Counted as the
    suite's, a lab gateway restarted during one test was killed at its end (the next test: connection refused)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().startswith(SHIM)
    except OSError:
        return False


def descendants(pid: int | None = None, spare: frozenset[Proc] = frozenset()) -> set[Proc]:
    """The live processes below `pid` (default: this one), zombies left out; `spare`: not them, nor below them,
    nor containers' shims and what runs below them (_engines)."""
    found: set[Proc] = set()
    todo = [os.getpid() if pid is None else pid]
    while todo:
        for child in _children(todo.pop()):
            stat = _stat(child)
            if stat is None or (child, stat[0]) in spare or _engines(child):
                continue
            todo.append(child)
            if stat[1] != "Z":
                found.add((child, stat[0]))
    return found


def _alive(procs: set[Proc]) -> set[Proc]:
    alive = set()
    for pid, start in procs:
        stat = _stat(pid)
        if stat is not None and stat[0] == start and stat[1] != "Z":
            alive.add((pid, start))
    return alive


def kill(procs: set[Proc]) -> None:
    """SIGKILL each process still alive (a reused pid is left alone)."""
    for pid, _ in _alive(procs):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # gone, or not ours to kill (a daemon started with sudo)
            pass


def kill_tree(pid: int) -> None:
    """SIGKILL the process and everything below it (all found before the first kill: no orphan is lost)."""
    family = descendants(pid)
    stat = _stat(pid)
    if stat is not None:
        family.add((pid, stat[0]))
    kill(family)


def _describe(procs: set[Proc]) -> list[str]:
    lines = []
    for pid, _ in sorted(procs):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            cmd = "?"
        lines.append(f"pid {pid}: {cmd[:300]}")
    return lines


@contextmanager
def outliving() -> Iterator[None]:
    """Processes started in this block (and, later, their children) are meant to outlive the suite."""
    before = suite_processes()
    yield
    _outliving.update(suite_processes() - before)


def suite_processes() -> set[Proc]:
    """Every live process below pytest, but those declared outliving() and theirs."""
    return descendants(spare=frozenset(_outliving))


# -- the plugin -----------------------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


@pytest.fixture(autouse=True)
def _no_process_left_behind() -> Iterator[None]:
    """Set up before the test's own function fixtures, torn down after them: whatever they and the test started
    and did not stop is killed here, with its children (processes of module and session fixtures, set up
    before, are theirs to stop)."""
    before = suite_processes()
    try:
        yield
    finally:
        left = suite_processes() - before
        if left:
            kill(left)
            deadline = time.monotonic() + 5
            while _alive(left) and time.monotonic() < deadline:
                time.sleep(0.05)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Every fixture is torn down by now: a process of the suite still alive is a leak. Fail the run, naming it."""
    left = suite_processes()
    if not left:
        return
    names = _describe(left)
    kill(left)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    text = "processes the suite started are still alive (killed now):\n  " + "\n  ".join(names)
    if reporter is not None:
        reporter.write_line(f"ERROR: {text}", red=True)
    else:
        print(f"ERROR: {text}", file=sys.stderr)
    if session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
