"""Fixtures for tests/deploy: hand-built deployments and facts for the fast suite (no node, no image
definition needed), and for the lab tests the ONE shared session lab (the default LabSpec, as
tests/lab/conftest.py brings it up: `lab up` is idempotent, so this reuses the same lab, never a second one).
"""

from __future__ import annotations

import pytest

from tests.deploy.deploy_helpers import make_deployment


@pytest.fixture
def deployment():
    return make_deployment
