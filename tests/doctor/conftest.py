"""Fixtures for doctor's tests. Lab tests use the ONE shared session lab of tests/lab/conftest.py."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

SAMPLES = Path(__file__).resolve().parent / "samples"
LAB_CONFTEST = Path(__file__).resolve().parents[1] / "lab" / "conftest.py"


def _lab_module():
    import importlib.util
    import sys

    name = "sparkdeploy_tests_lab_conftest"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, LAB_CONFTEST)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses in it look their module up by name
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.fixture(scope="session")
def lab():
    """The ONE shared session lab: tests/lab/conftest.py's default lab (same LabSpec, same containers).

    `lab up` is idempotent: when the lab tests (or another folder's fixture) brought it up already, this only
    checks it (about 3 s) and never creates a second lab nor takes it down.
    """
    module = _lab_module()
    module.ensure_engine()
    from sparkdeploy.lab import LabSpec, up

    return module.Lab(up(LabSpec()))


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
