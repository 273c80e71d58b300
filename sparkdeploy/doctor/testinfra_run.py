"""`doctor --tests PATH` (and the inventory's `cluster.doctor_tests`): the owner's testinfra modules on every node.

The check `tests.owner` runs on every node that answered SSH, in parallel like every node check: it starts
`python3 -m sparkdeploy.doctor.testinfra_node` (one pytest session per node, in its own process: pytest sessions
cannot share one) over the node's pinned SSH (testinfra_backend.py) and turns what it wrote into rows: one per test
(`tests:MODULE::TEST`: pass, fail with pytest's assertion text, error, skip) and one per module that does not import
or has no tests. A failed or broken test fails doctor (exit 1); doctor's default run never starts it.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sparkdeploy.checks import FAIL, PASS, SKIP, Result, fail
from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.config.userfile import load_json_file
from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.paths import PACKAGE_DIR

from .doctor_run import DoctorRun

CHECK_ID = "tests.owner"
ROW_PREFIX = "tests:"
TIMEOUT_S = 240.0  # the whole session on one node; the check's own timeout is a little longer
SHIPPED = "@spark"  # names the shipped example checks of a DGX Spark
SHIPPED_DIR = PACKAGE_DIR / "doctor" / "spark_checks"
STATUS = {"passed": PASS, "failed": FAIL, "error": FAIL, "skipped": SKIP}


def resolve_paths(given: tuple[str, ...], inventory: Inventory | None) -> tuple[str, ...]:
    """--tests PATHs (relative to the working folder), else the inventory's cluster.doctor_tests (relative to the
    inventory file); `@spark` is the shipped folder. A path that is not there is bad input (exit 2)."""
    if given:
        pairs = [(p, Path(p).expanduser(), "--tests", p) for p in given]
    elif inventory is not None and inventory.cluster.doctor_tests:
        where = str(inventory.path) if inventory.path else "inventory"
        named = inventory.cluster.doctor_tests
        pairs = [(p, inventory.local_path(p) or Path(p), where, "cluster.doctor_tests") for p in named]
    else:
        return ()
    out: list[str] = []
    problems: list[Problem] = []
    for raw, path, file, field in pairs:
        if raw == SHIPPED:
            out.append(str(SHIPPED_DIR))
        elif not path.exists():
            problems.append(
                Problem(file, field, f"{raw}: no such file or folder", f"a testinfra module or folder, or {SHIPPED}")
            )
        else:
            out.append(str(path.resolve()))
    if problems:
        raise ConfigError(problems)
    return tuple(out)


def node_tests(run: DoctorRun, node: Node) -> list[Result]:
    """The owner's tests on `node`: one row per test, per broken module (a check of scope node)."""
    if not run.options.tests:
        return [Result(SKIP, "no tests named (doctor --tests PATH, or the inventory's cluster.doctor_tests)")]
    inventory = run.inventory
    assert inventory is not None and inventory.path is not None  # node checks run only with a loaded inventory
    with tempfile.TemporaryDirectory(prefix="sparkdeploy-tests-") as tmp:
        out = Path(tmp) / "rows.json"
        argv = [
            sys.executable,
            "-m",
            "sparkdeploy.doctor.testinfra_node",
            "--inventory",
            str(inventory.path),
            "--node",
            node.name,
            "--out",
            str(out),
            *run.options.tests,
        ]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False, cwd=tmp)
        except subprocess.TimeoutExpired:
            return [fail(f"the tests ran past {TIMEOUT_S:g} s", "done in time", "look for a hung command in them")]
        if not out.exists():
            tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            return [fail(f"the test runner stopped (exit {proc.returncode}): {tail}", "", "rerun with --only tests")]
        written = load_json_file(out, "the test runner's result", "rerun with --only tests")
    rows: list[dict[str, Any]] = written["rows"]
    if not rows and written.get("pytest_exit") not in (0, 5):  # 5: nothing collected
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-2:])
        return [fail(f"pytest stopped (exit {written.get('pytest_exit')}): {tail}", "", "rerun with --only tests")]
    return [_row(r) for r in rows] or [Result(SKIP, "no tests collected", check=CHECK_ID)]


def _row(r: dict[str, Any]) -> Result:
    outcome = r["outcome"]
    simulated: list[str] = r.get("simulated") or []
    if not r["test"]:  # the runner could not reach the node: nothing ran
        return fail(r["message"], "a connection with the pinned host key", "see access.ssh", check=CHECK_ID)
    measured = {
        "passed": "passed",
        "failed": f"failed: {r['message']}",
        "error": f"error: {r['message']}",
        "skipped": f"skipped: {r['message']}",
    }[outcome]
    if simulated:
        measured += f" ({simulated[0]})"
    return Result(
        STATUS[outcome],
        measured,
        "the owner's test passes",
        "" if outcome in ("passed", "skipped") else "the test's own message says what to fix",
        simulated=bool(simulated),
        data={"test": r["test"], "outcome": outcome, "simulated_lines": simulated},
        check=ROW_PREFIX + r["test"],
    )
