"""Fixtures for tests/deploy: hand-built deployments and facts for the fast suite (no node, no image
definition needed), and for the lab tests the ONE shared session lab (the default LabSpec, as
tests/lab/conftest.py brings it up: `lab up` is idempotent, so this reuses the same lab, never a second one).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.deploy.deploy_helpers import make_deployment


@pytest.fixture
def deployment():
    return make_deployment


# -- the lab (tests marked lab) ---------------------------------------------------------------------------

@pytest.fixture(scope="session")
def lab():
    """The shared session lab: the default lab of tests/lab/conftest.py (same LabSpec, same containers)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "lab" / "conftest.py"
    spec = importlib.util.spec_from_file_location("sparkdeploy_tests_lab_conftest", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    module.ensure_engine()
    from sparkdeploy.lab import LabSpec, up

    return module.Lab(up(LabSpec()))
