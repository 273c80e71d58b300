"""One engine over several nodes (a cluster's ranks, each replica of `replicas`) lives and dies as one: a rank
that stops takes the engine with it, and a rank that comes back alone cannot rejoin the others' run. So a group
is whole only while no rank last exited after another rank's current run, still running, began.

`lost_rank` is that rule, in one place: `up`'s plan (sparkdeploy/deploy/plan.py) applies it to the nodes' facts, and the
node-side watcher (watch.py) to what its node's Docker engine and the group's other watchers say. Standard
library only (this folder runs on the nodes).
"""

import re
from collections.abc import Sequence
from datetime import datetime

# A rank's exit counts only when it came this long after another rank's current run began: the clocks of two
# nodes may differ by that much (NTP keeps them far closer), and a group restart stops every rank before the
# first one starts again, so its own stops never count.
SLACK_S = 5.0
_TIME = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)?")


def docker_time(text: object) -> float | None:
    """Docker's RFC 3339 time (nanoseconds, Z) as epoch seconds; None for its zero time or anything else."""
    m = _TIME.fullmatch(str(text or "").strip())
    if not m or m.group(1).startswith("0001-"):
        return None
    tz = m.group(3) or "Z"
    try:
        base = datetime.fromisoformat(m.group(1) + ("+00:00" if tz == "Z" else tz))
    except ValueError:
        return None
    return base.timestamp() + float("0" + (m.group(2) or ".0")[:10])


def lost_rank(ranks: Sequence[tuple[str, float | None, float | None, bool]]) -> tuple[str, float] | None:
    """ranks: [(label, started, finished, running)] in rank order, times in epoch seconds (None: unknown or never).
    The first rank whose last exit came more than SLACK_S after the current start of another rank that still
    runs, as (label, finished): that one served on without it, so every rank must restart. None: the group is
    whole (or nothing of it runs: then each stopped container is a difference of its own)."""
    for label, _started, finished, _running in ranks:
        if finished is None:
            continue
        for other, started, _, running in ranks:
            if other != label and running and started is not None and finished > started + SLACK_S:
                return label, finished
    return None
