"""The check context is a written interface (doctor/check_context.py): mypy rejects a preflight check that needs a
session on the node, whether its body asks for one or its type declares it; every preflight check of the
registry takes a CheckContext, and `up`'s PreflightRun offers no session."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

from sparkdeploy.deploy.preflight import PreflightRun
from sparkdeploy.doctor.check_context import CheckContext
from sparkdeploy.doctor.registry import PREFLIGHT

ROOT = Path(__file__).resolve().parents[1]
SNIPPET = ROOT / "tests" / "typing" / "preflight_needs_session.py"


def test_mypy_rejects_a_preflight_check_that_needs_a_session():
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--hide-error-context", str(SNIPPET)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in proc.stdout.splitlines() if ": error:" in line]
    expected = {n for n, text in enumerate(SNIPPET.read_text().splitlines(), 1) if "# ERROR" in text}
    assert {int(re.search(r":(\d+): error", e).group(1)) for e in errors} == expected, proc.stdout + proc.stderr
    assert any('"CheckContext" has no attribute "session"' in e for e in errors), errors
    assert any('to "preflight_check" has incompatible type' in e for e in errors), errors


def test_every_preflight_check_takes_a_check_context():
    for check in PREFLIGHT:
        first = next(iter(inspect.signature(check.fn).parameters.values()))
        assert first.annotation in ("CheckContext", CheckContext), (check.id, first.annotation)


def test_up_preflight_offers_no_session():
    assert not hasattr(PreflightRun, "session")
