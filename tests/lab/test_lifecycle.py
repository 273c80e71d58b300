"""Leftovers, `lab down`, and labs side by side, on a throw-away one-node lab (own name, free subnets, state).

The shared session lab is only read here: the last test checks `lab down` of the side lab left it alone.
"""

from __future__ import annotations

import dataclasses

import docker
import pytest

from sparkdeploy.errors import ConfigError
from sparkdeploy.lab import LabSpec, down, hub, up
from sparkdeploy.lab.network import free_subnets
from sparkdeploy.lab.spec import LAB_LABEL, NAME_LABEL

pytestmark = pytest.mark.lab

MARK = "/var/lib/docker/lab-test-marker"


@pytest.fixture(scope="module")
def client():
    return docker.from_env()


@pytest.fixture(scope="module")
def side(lab, tmp_path_factory, client, side_spec):
    spec = side_spec("labtest", 1, tmp_path_factory.mktemp("labtest"))
    first = up(spec)
    assert first.created == ["spark1"]
    yield spec
    down(spec)


def _container(client, spec):
    return client.containers.get(spec.container_name("spark1"))


def _labelled(client, spec) -> list[str]:
    f = {"label": [f"{LAB_LABEL}=1", f"{NAME_LABEL}={spec.qualified_name}"]}
    return (
        [c.name for c in client.containers.list(all=True, filters=f)]
        + [n.name for n in client.networks.list(filters=f)]
        + [v.name for v in client.volumes.list(filters=f)]
    )


def test_stopped_leftover_is_started_not_replaced(side, client):
    before = _container(client, side)
    before.stop(timeout=20)
    again = up(side)
    assert again.created == [] and again.started == ["spark1"]
    assert _container(client, side).id == before.id
    assert again.nodes[0].ssh and again.nodes[0].dockerd


def test_leftover_whose_network_vanished_is_recreated_keeping_its_volume(side, client):
    """As after an engine restart or a manual cleanup: the container refers to a network that is gone."""
    old = _container(client, side)
    old.exec_run(["touch", MARK])
    old.stop(timeout=20)
    client.networks.get(side.fabric_network).remove()
    again = up(side)
    assert again.created == ["spark1"]
    new = _container(client, side)
    assert new.id != old.id
    assert new.exec_run(["test", "-e", MARK]).exit_code == 0  # inner Docker storage survived
    assert again.nodes[0].ssh and again.nodes[0].dockerd and again.nodes[0].fabric_iface == side.fabric_iface


def test_another_state_folder_adopts_the_running_labs_keys(side, client, tmp_path):
    """Two users (or test sessions) with different state folders share one lab instead of fighting over it."""
    other = dataclasses.replace(side, state_dir=tmp_path)
    result = up(other)
    assert result.created == [] and result.started == []
    assert (tmp_path / "lab_ed25519").read_bytes() == (side.directory / "lab_ed25519").read_bytes()
    assert (tmp_path / "known_hosts").read_text() == (side.directory / "known_hosts").read_text()


def test_foreign_overlapping_network_is_a_config_error(client, tmp_path):
    from docker.types import IPAMConfig, IPAMPool

    taken, fabric = free_subnets(client)
    foreign = client.networks.create("sparkdeploy-test-foreign", ipam=IPAMConfig(pool_configs=[IPAMPool(subnet=taken)]))
    try:
        spec = LabSpec(name="labclash", nodes=1, mgmt_subnet=taken, fabric_subnet=fabric, images=(), state_dir=tmp_path)
        with pytest.raises(ConfigError) as err:
            up(spec)
        assert "--subnet" in str(err.value) and "sparkdeploy-test-foreign" in str(err.value)
        assert _labelled(client, spec) == []
    finally:
        foreign.remove()


def test_down_removes_this_lab_and_nothing_else(side, lab, client):
    shared_before = {
        c.name: c.id for c in client.containers.list(filters={"label": f"{NAME_LABEL}={LabSpec().qualified_name}"})
    }
    removed = down(side)
    assert sorted(removed["containers"]) == sorted([side.container_name("spark1"), hub.container_name(side)])
    assert sorted(removed["networks"]) == sorted([side.mgmt_network, side.fabric_network])
    assert removed["volumes"] == [side.volume_name("spark1")]
    assert _labelled(client, side) == []
    assert not side.inventory_path.exists()
    shared_after = {
        c.name: c.id for c in client.containers.list(filters={"label": f"{NAME_LABEL}={LabSpec().qualified_name}"})
    }
    assert shared_after == shared_before
    # the nodes and the hub (and the lab's registry, if tests/images/test_registry_lab.py started it before)
    assert len([n for n in shared_after if not n.endswith("-registry")]) == lab.spec.nodes + 1
