"""The memory guard's status read as a registered fact (issue 37 item 4: node state only through facts/): the fact
`guard_status` frames each status.json a guard wrote; guard/state.py's status_of picks the one guard_folder
would (the single deployment's first, else a stack's guard unit's)."""

from __future__ import annotations

import json
import time

from sparkdeploy.facts import parse
from sparkdeploy.guard.state import status_of
from tests.deploy.deploy_helpers import make_deployment


def _facts(files: dict[str, str]):
    text = "@@sparkdeploy-facts@@ home\n/home/spark\n@@sparkdeploy-facts@@ guard_status\n"
    text += "".join(f"@@status {path}\n{body}\n" for path, body in files.items())
    return parse("spark1", text)


def test_the_single_deployments_guard_first_then_a_stacks():
    inv = make_deployment("solo").inventory
    now = time.time()
    single = json.dumps({"state": "ok", "updated": now})
    stack = json.dumps({"state": "armed", "updated": now})
    both = _facts({".sparkdeploy/guard/status.json": single, ".sparkdeploy-guard/guard/status.json": stack})
    assert status_of(both, inv)["state"] == "ok"
    assert status_of(_facts({".sparkdeploy-guard/guard/status.json": stack}), inv)["state"] == "armed"
    assert status_of(_facts({}), inv) is None


def test_a_stale_or_broken_status_says_so():
    inv = make_deployment("solo").inventory
    old = _facts({".sparkdeploy/guard/status.json": json.dumps({"state": "ok", "updated": time.time() - 60})})
    assert status_of(old, inv)["stale_s"] >= 59
    broken = status_of(_facts({".sparkdeploy/guard/status.json": "{not json"}), inv)
    assert broken == {"state": "unreadable", "reason": "/home/spark/.sparkdeploy/guard/status.json is not JSON"}
