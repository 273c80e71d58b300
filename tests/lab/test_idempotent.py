"""A second `lab up` changes nothing: same containers, not restarted; `lab status` reports them healthy."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sparkdeploy.lab import LabSpec, status, up

pytestmark = pytest.mark.lab


def test_second_up_changes_nothing(lab):
    before = {s.node: (s.container_id, s.started_at) for s in status(lab.spec)}
    inventory = lab.spec.inventory_path.read_text()
    again = up(LabSpec())
    assert again.created == [] and again.started == []
    assert {s.node: (s.container_id, s.started_at) for s in again.nodes} == before
    assert lab.spec.inventory_path.read_text() == inventory
    assert all(not i.loaded for i in again.images)  # nothing loaded twice
    assert again.seconds < 30


def test_status_json_via_cli(lab):
    out = subprocess.run(
        [sys.executable, "-c", "from sparkdeploy.cli.main import main; main()", "lab", "status", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [(n["node"], n["state"], n["mgmt_ip"], n["ssh"], n["dockerd"]) for n in data["nodes"]] == [
        (n.name, "running", n.mgmt_ip, True, True) for n in lab.nodes
    ]
