"""doctor's `guard.crash` (registered in doctor/registry.py): a crash, power-off or guard kill in the node's black
box, with its evidence (postmortem.evidence), or that the guard has stopped the node's engines."""

from __future__ import annotations

import time
from typing import Any

from sparkdeploy.checks import Result, ok, skip, warn
from sparkdeploy.config.inventory import Node
from sparkdeploy.daytwo.postmortem import DEFAULT_MINUTES, evidence, node_postmortem
from sparkdeploy.guard.state import guard_dir, line, status_of

RECENT_S = 7 * 24 * 3600  # a crash older than a week is history, not a finding


def past_crash(run: Any, node: Node) -> Result:
    if run.inventory is None:
        return skip("no inventory")
    f = run.node_facts(node)  # the set DOCTOR: home and guard_status (where the guard writes)
    result = node_postmortem(run.session(node).conn, guard_dir(f, run.inventory), DEFAULT_MINUTES)
    status = status_of(f, run.inventory)
    if not result["records"]:
        return skip(result.get("note") or "the black box is empty")
    crash = result["crash"]
    if crash and time.time() - crash["last_sample_at"] < RECENT_S:
        return warn(
            evidence(result),
            "no crash, power-off or guard kill in the black box",
            f"sparkdeploy postmortem {node.name} shows the {DEFAULT_MINUTES} minutes before it",
            data={"crash": crash, "crashes": result["crashes"]},
        )
    if status and status.get("state") == "held":
        return warn(line(status), "engines running", "free memory on the node, then `sparkdeploy up`")
    return ok(f"{result['records']} records, no crash; {line(status)}", "no crash in the black box")
