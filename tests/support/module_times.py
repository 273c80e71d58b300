"""Where a suite's time goes, per test module (CI's lab suite must stay under its budget; scripts/test.sh).

The pytest plugin (tests/conftest.py loads it) adds up each module's setup, call and teardown seconds, the
session fixtures included (a module whose first test brings up the shared lab is charged with it), and prints the
modules by time at the end of a run that took more than a minute. With SPARKDEPLOY_MODULE_TIMES=PATH it also
writes them as JSON ({"wall": the session's seconds, "modules": {module: seconds}}): the figures a split of the lab
suite between workers would be balanced by (docs/benchmarks.md, "CI's time").
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict

import pytest

TIMES_ENV = "SPARKDEPLOY_MODULE_TIMES"
SHOWN_AFTER_S = 60.0

_seconds: dict[str, float] = defaultdict(float)
_started = [0.0]


def pytest_sessionstart(session: pytest.Session) -> None:
    _started[0] = time.monotonic()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds[report.nodeid.split("::", 1)[0]] += report.duration


def totals() -> dict[str, float]:
    """module -> seconds, the slowest first."""
    return {m: round(s, 1) for m, s in sorted(_seconds.items(), key=lambda kv: -kv[1])}


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    wall = time.monotonic() - _started[0]
    found = totals()
    path = os.environ.get(TIMES_ENV)
    if path:
        with open(path, "w") as fh:
            json.dump({"wall": round(wall, 1), "modules": found}, fh, indent=1)
    if wall < SHOWN_AFTER_S or not found:
        return
    terminalreporter.write_sep("=", f"seconds per module ({len(found)} modules, {wall:.0f} s in all)")
    for module, seconds in found.items():
        terminalreporter.write_line(f"{seconds:8.1f}s {module}")
