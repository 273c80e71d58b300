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

INTERVAL = "5s"
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
