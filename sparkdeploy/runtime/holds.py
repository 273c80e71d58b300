"""Hold points: where a run can be made to wait, for the lab's fault tests (tests/faults)."""

from __future__ import annotations

import os
import sys
import threading
import time

from sparkdeploy.runtime.interrupts import Interrupt

# Fault-injection hook for the lab tests (tests/faults): with SPARKDEPLOY_HOLD_AT=PHASE a run stops at that point
# of PHASE (connect, preflight, write, start, health), says so on stderr and waits for Ctrl-C or for the file
# SPARKDEPLOY_HOLD_UNTIL names to exist (at most HOLD_MAX_S), so a test hits every phase deterministically
# (a Ctrl-C, or a fault injected while the run waits) instead of sleeping and hoping. Unset for users.
HOLD_ENV, HOLD_UNTIL_ENV = "SPARKDEPLOY_HOLD_AT", "SPARKDEPLOY_HOLD_UNTIL"
HOLD_PHASES = ("connect", "preflight", "write", "start", "health")
HOLD_MAX_S = 120.0
_held: set[str] = set()  # phases already announced (every node's thread holds; one line says so)
_hold_lock = threading.Lock()


def hold_point(phase: str, interrupt: Interrupt | None) -> None:
    if os.environ.get(HOLD_ENV) != phase or interrupt is None:
        return
    with _hold_lock:
        first = phase not in _held
        _held.add(phase)
    if first:
        print(f"hold: at {phase} (waiting for Ctrl-C)", file=sys.stderr, flush=True)
    release = os.environ.get(HOLD_UNTIL_ENV, "")
    deadline = time.monotonic() + HOLD_MAX_S
    while time.monotonic() < deadline and not interrupt.event.wait(0.1):
        if release and os.path.exists(release):
            return
