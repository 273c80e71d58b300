"""Fixtures for doctor's tests. Lab tests use the ONE shared session lab (`lab`, tests/conftest.py)."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

SAMPLES = Path(__file__).resolve().parent / "samples"


@pytest.fixture
def sample():
    def read(name: str) -> str:
        return (SAMPLES / name).read_text()

    return read


def absolute_inventory(path: Path) -> dict:
    """The lab's inventory as data, with every local path made absolute (so a copy works elsewhere)."""
    data = yaml.safe_load(path.read_text())
    base = path.parent
    cluster = data.setdefault("cluster", {})
    for key in ("secrets_file", "known_hosts"):
        if cluster.get(key) and not os.path.isabs(os.path.expanduser(cluster[key])):
            cluster[key] = str(base / cluster[key])
    for node in data["nodes"]:
        ssh = node.get("ssh") or {}
        if ssh.get("key") and not os.path.isabs(os.path.expanduser(ssh["key"])):
            ssh["key"] = str(base / ssh["key"])
    return data


@pytest.fixture
def lab_inventory(lab) -> Path:
    return lab.spec.inventory_path


@pytest.fixture
def derived_inventory(lab, tmp_path):
    """Write a modified copy of the lab's inventory: derived_inventory(lambda data: ...) -> path."""

    def make(mutate=None, name: str = "inventory.yaml") -> Path:
        data = copy.deepcopy(absolute_inventory(lab.spec.inventory_path))
        if mutate is not None:
            mutate(data)
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return make
