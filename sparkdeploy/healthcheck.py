"""Docker's own health check on every container that serves HTTP (engines and the proxy).

`up`'s health gate asks each endpoint once, from this machine. Between runs only the node's engine watches,
and it marks a container unhealthy when its endpoint stops answering: a wedged engine that still runs. `status`
and `doctor`'s engine.crashes read that mark ("health failing since 3m ago").

The probe runs inside the container, on 127.0.0.1 (the containers share the host's network), with the python3
every serving image has: no curl in the image is assumed. vLLM can take many minutes to load a large model, so
failures in the first START_PERIOD do not count; the first success ends that period early.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from datetime import datetime, timedelta

INTERVAL_S = 5
INTERVAL = f"{INTERVAL_S}s"
TIMEOUT = "3s"
RETRIES = 3  # unhealthy after ~15 s of failures: one slow answer is not a wedged engine
START_PERIOD = "30m"  # the largest recipes take ~20 min to load on a Spark

# One line on failure, not a traceback (Docker keeps the last 5 outputs in the container's health log).
_PROBE = (
    "import sys, urllib.request as u; sys.excepthook = lambda t, e, b: print(e); u.urlopen(sys.argv[1], timeout=2.5)"
)


@dataclass(frozen=True)
class HealthCheck:
    cmd: str  # run by Docker with /bin/sh -c inside the container
    interval: str = INTERVAL
    timeout: str = TIMEOUT
    retries: int = RETRIES
    start_period: str = START_PERIOD


def for_port(port: int, path: str) -> HealthCheck:
    return HealthCheck(cmd=shlex.join(["python3", "-c", _PROBE, f"http://127.0.0.1:{int(port)}{path}"]))


def failing_since(probes: list[tuple[datetime, bool]], streak: int) -> datetime | None:
    """When the current run of failed probes began. probes: the health log's (start, passed), oldest first.
    Docker keeps only the last 5 probes but counts the run (FailingStreak): a run the log still holds starts at
    its first failed probe; a longer one goes back from the oldest failure it holds by the probes' own spacing
    (a probe starts INTERVAL_S after the previous one ended; one that times out takes longer) for each probe the
    log has dropped. So read again later, it gives the same time (within a spacing), never "now"."""
    if not probes or streak <= 0:
        return None
    failed = 0
    for _start, passed in reversed(probes):
        if passed:
            break
        failed += 1
    if failed == 0:
        return None
    first_held = probes[len(probes) - min(failed, streak)][0]
    if streak <= failed:
        return first_held
    starts = [t for t, _ in probes]
    spacing = (starts[-1] - starts[0]).total_seconds() / (len(starts) - 1) if len(starts) > 1 else INTERVAL_S
    return first_held - timedelta(seconds=spacing * (streak - failed))
