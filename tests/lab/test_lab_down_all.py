"""`lab down --all` with SPARKDEPLOY_LAB_INSTANCE set takes down that instance's labs only (a developer sharing
the engine with other checkouts must not remove their labs), on a real Docker engine with real labelled objects."""

from __future__ import annotations

import uuid

import pytest

from sparkdeploy.images.build import docker_client
from sparkdeploy.lab import lifecycle
from sparkdeploy.lab.spec import INSTANCE_ENV, LAB_LABEL, NAME_LABEL, LabSpec

pytestmark = pytest.mark.lab


def test_down_all_keeps_other_instances_labs(monkeypatch, tmp_path):
    client = docker_client()
    tag = uuid.uuid4().hex[:8]
    mine, other = f"t{tag}a", f"t{tag}b"
    volumes = {
        n: client.volumes.create(f"sparkdeploy-{n}-lab-test", labels={LAB_LABEL: "1", NAME_LABEL: f"{n}-lab"})
        for n in (mine, other)
    }
    try:
        monkeypatch.setenv(INSTANCE_ENV, mine)
        # a scratch state dir: down also forgets the spec's inventory and known_hosts (the running lab's otherwise)
        removed = lifecycle.down(LabSpec(state_dir=tmp_path), all_labs=True)
        names = {v.name for v in client.volumes.list(filters={"label": f"{LAB_LABEL}=1"})}
        assert f"sparkdeploy-{mine}-lab-test" in removed["volumes"]
        assert f"sparkdeploy-{mine}-lab-test" not in names
        assert f"sparkdeploy-{other}-lab-test" in names and f"sparkdeploy-{other}-lab-test" not in removed["volumes"]
    finally:
        for v in volumes.values():
            try:
                v.remove(force=True)
            except Exception:  # noqa: BLE001 - already removed by the test
                pass
