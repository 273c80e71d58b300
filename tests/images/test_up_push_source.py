"""`up` with an image some nodes lack: from a node of the deployment that has it (over the fabric), else from
this machine. The choice only (pure logic; the pushes themselves have their lab tests)."""

from __future__ import annotations

from types import SimpleNamespace

from sparkdeploy import preflight
from sparkdeploy.cli import up_cmd
from sparkdeploy.inventory import Node


def _node(name: str, i: int) -> Node:
    return Node(name=name, role="head" if i == 1 else "worker", mgmt_ip=f"10.0.0.{i}",
                fabric_ip=f"192.168.100.{i}/24", fabric_ifaces=["eth1"])


def _dep(nodes, image):
    nds = [SimpleNamespace(node=n, containers=[SimpleNamespace(image=image)]) for n in nodes]
    inventory = SimpleNamespace(node=lambda name: next(n for n in nodes if n.name == name))
    return SimpleNamespace(nodes=nds, inventory=inventory)


def test_up_pushes_from_a_node_that_has_the_image_else_from_here(monkeypatch):
    calls = []
    monkeypatch.setattr("sparkdeploy.images.push_from.push_from_node",
                        lambda ref, inv, source, targets: calls.append(("from", ref, source.name,
                                                                        [t.name for t in targets])) or (None, [], 0))
    monkeypatch.setattr("sparkdeploy.images.push.push_image",
                        lambda name, inv, targets: calls.append(("here", name, [t.name for t in targets])) or [])
    out = SimpleNamespace(progress=lambda _t: None, warn=lambda _t: None)
    nodes = [_node(f"spark{i}", i) for i in (1, 2, 3)]
    ref = "sparkdeploy/vllm-node:abc123"
    missing = [preflight.Check(n, "image", False, "missing", missing_image=ref) for n in ("spark2", "spark3")]
    assert up_cmd._push_missing(_dep(nodes, ref), missing, out)
    assert calls == [("from", ref, "spark1", ["spark2", "spark3"])]

    calls.clear()
    everyone = [preflight.Check(n.name, "image", False, "missing", missing_image=ref) for n in nodes]
    assert up_cmd._push_missing(_dep(nodes, ref), everyone, out)
    assert calls == [("here", "vllm-node", ["spark1", "spark2", "spark3"])]
