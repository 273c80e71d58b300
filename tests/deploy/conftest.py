"""Fixtures for tests/deploy: hand-built deployments and facts for the fast suite (no node, no image
definition needed), and for the lab tests the ONE shared session lab (the default LabSpec, as
tests/lab/conftest.py brings it up: `lab up` is idempotent, so this reuses the same lab, never a second one).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.deploy.deploy_helpers import make_deployment
from tests.support.cli_process import failure
from tests.support.cli_process import sd as run_cli_process


@pytest.fixture
def deployment():
    return make_deployment


@pytest.fixture(scope="module")
def inv(lab) -> Iterator[str]:
    """The shared lab's inventory for a module of stack lab tests (test_stack_lab, test_ondemand_lab,
    test_ondemand_faults_lab): the lab emptied first (`down`), and after the module `down --keys` (the gateway's
    keys and spend counts too). A module that needs another setup defines its own `inv`, which overrides this."""
    path = str(lab.spec.inventory_path)
    r = run_cli_process("down", "-i", path, timeout=900)
    assert r.returncode == 0, failure(r)
    yield path
    run_cli_process("down", "--keys", "-i", path, timeout=900)
