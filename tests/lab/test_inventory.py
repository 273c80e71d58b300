"""The lab's inventory is a valid sparkdeploy inventory that points at the lab's own keys and secrets."""

from __future__ import annotations

import pytest

from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.config.secrets import parse_env_file

pytestmark = pytest.mark.lab


def test_inventory_loads_and_matches_the_lab(lab):
    inv = load_inventory(lab.spec.inventory_path)
    assert inv.cluster.image_override == "vllm-sim"
    assert inv.local_path(inv.cluster.known_hosts) == lab.known_hosts
    assert [n.name for n in inv.nodes] == [n.name for n in lab.nodes]
    assert inv.head.name == "spark1"
    for node, want in zip(inv.nodes, lab.nodes, strict=False):
        assert node.mgmt_ip == want.mgmt_ip
        assert node.fabric_ip == f"{want.fabric_ip}/{want.prefixlen}"
        assert node.fabric_ifaces == [lab.spec.fabric_iface]
        assert node.hcas == list(lab.spec.hcas)
        assert node.ssh.user == "spark" and inv.local_path(node.ssh.key) == lab.key


def test_lab_secrets(lab):
    inv = load_inventory(lab.spec.inventory_path)
    values = parse_env_file(inv.local_path(inv.cluster.secrets_file))
    assert len(values["HF_TOKEN"]) > 20
    assert values["LITELLM_MASTER_KEY"].startswith("sk-") and len(values["LITELLM_MASTER_KEY"]) > 20
