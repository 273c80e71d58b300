"""The ONE shared four-node lab of a test session (`lab4`), for the tests marked `lab4` (and `lab`).

Brought up only when a test that uses it runs (a session fixture), beside the default two-node lab, on the two
subnets after the default lab's (CI: 172.30.79/80 next to 172.30.77/78; a developer's SPARKDEPLOY_LAB_SUBNETS
moves both). Like the default lab it is left up for the next session (`lab up` is idempotent and reuses it).

Engine images (lab setup, not the feature under test: the push itself is tested in tests/images): vllm-sim is
pushed to spark1 over SSH and spark1's image store is copied into the three other fresh nodes (`lab up --seed`,
sparkdeploy/lab/seed.py), which skips three docker loads of ~1.3 GB; every node's image ID is then checked by
the push. litellm-proxy goes to the head only, the one node its proxy runs on (2xsolo, replicas).
"""

from __future__ import annotations

import ipaddress

import pytest

from sparkdeploy.lab import LabSpec, up
from tests.lab.conftest import Lab, ensure_engine

LAB4_NAME = "lab4"
HEAD_ONLY_IMAGES = ("litellm-proxy",)


def lab4_subnets() -> tuple[str, str]:
    """Two /24s after the default lab's fabric subnet: deterministic, so a second session reuses the lab."""
    default = LabSpec()
    fabric = ipaddress.IPv4Network(default.fabric_subnet)
    shift = 2 * fabric.num_addresses
    mgmt = ipaddress.IPv4Network(default.mgmt_subnet)
    return (
        str(ipaddress.IPv4Network((int(mgmt.network_address) + shift, mgmt.prefixlen))),
        str(ipaddress.IPv4Network((int(fabric.network_address) + shift, fabric.prefixlen))),
    )


def lab4_spec() -> LabSpec:
    mgmt, fabric = lab4_subnets()
    return LabSpec(name=LAB4_NAME, nodes=4, mgmt_subnet=mgmt, fabric_subnet=fabric, images=("vllm-sim",), seed=True)


@pytest.fixture(scope="session")
def lab4() -> Lab:
    from sparkdeploy.config.inventory import load_inventory
    from sparkdeploy.images.build import docker_client
    from sparkdeploy.lab.engine_images import preload

    ensure_engine()
    spec = lab4_spec()
    result = up(spec)
    inventory = load_inventory(str(spec.inventory_path))
    result.images += preload(docker_client(), list(HEAD_ONLY_IMAGES), inventory, print, nodes=[inventory.head.name])
    return Lab(result)
