"""`up` with an image some nodes lack: from a node of the deployment that has it (over the fabric), else from
this machine. The choice (pure logic, both pushes replaced), then the real `up` in the lab: the engine image
built on spark1 only (`images build --on spark1`), `up` pushes it from spark1 to spark2 node to node, and the
deployment is healthy."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml

from sparkdeploy.config.inventory import Node
from sparkdeploy.deploy import preflight
from sparkdeploy.deploy import up as up_pipeline


def _node(name: str, i: int) -> Node:
    return Node(
        name=name,
        role="head" if i == 1 else "worker",
        mgmt_ip=f"10.0.0.{i}",
        fabric_ip=f"192.168.100.{i}/24",
        fabric_ifaces=["eth1"],
    )


def _dep(nodes, image):
    nds = [SimpleNamespace(node=n, containers=[SimpleNamespace(image=image)]) for n in nodes]
    inventory = SimpleNamespace(node=lambda name: next(n for n in nodes if n.name == name))
    return SimpleNamespace(nodes=nds, inventory=inventory)


def test_up_pushes_from_a_node_that_has_the_image_else_from_here(monkeypatch):
    calls = []
    monkeypatch.setattr(
        "sparkdeploy.images.push_from.push_from_node",
        lambda ref, inv, source, targets: (
            calls.append(("from", ref, source.name, [t.name for t in targets])) or (None, [], 0)
        ),
    )
    monkeypatch.setattr(
        "sparkdeploy.images.push.push_image",
        lambda name, inv, targets: calls.append(("here", name, [t.name for t in targets])) or [],
    )
    out = SimpleNamespace(progress=lambda _t: None, warn=lambda _t: None)
    nodes = [_node(f"spark{i}", i) for i in (1, 2, 3)]
    ref = "sparkdeploy/vllm-node:abc123"
    missing = [
        preflight.Result("fail", "missing", node=n, check="image", missing_image=ref) for n in ("spark2", "spark3")
    ]
    assert up_pipeline.push_missing(_dep(nodes, ref), missing, out)
    assert calls == [("from", ref, "spark1", ["spark2", "spark3"])]

    calls.clear()
    everyone = [preflight.Result("fail", "missing", node=n.name, check="image", missing_image=ref) for n in nodes]
    assert up_pipeline.push_missing(_dep(nodes, ref), everyone, out)
    assert calls == [("here", "vllm-node", ["spark1", "spark2", "spark3"])]


# -- the real `up`, in the shared lab -------------------------------------------------------------------------

NAME = "up-push-test"  # the engine image: vllm-sim plus one random layer, built on spark1 only
LAYER_BYTES = 8_000_000  # random: zstd cannot shrink it, and far more than `up`'s own traffic on either link


@pytest.fixture
def engine_built_on_spark1(lab, tmp_path, monkeypatch, cli):
    """A definition standing in for vllm-sim's (same flags and launchers) with vllm-sim as its base, beside the
    real definitions; built on spark1 only; a copy of the lab inventory whose image_override names it. Yields
    (inventory path, tag); at the end: `down`, and the image removed from both nodes."""
    from sparkdeploy import paths
    from sparkdeploy.images import definitions
    from tests.doctor.conftest import absolute_inventory

    real = paths.images_dir()
    root = tmp_path / "images"
    root.mkdir()
    for manifest in real.glob("*/manifest.yaml"):
        (root / manifest.parent.name).symlink_to(manifest.parent)
    sim = yaml.safe_load((real / "vllm-sim" / "manifest.yaml").read_text())
    manifest = {
        k: sim[k] for k in ("platform", "vllm_version", "extra_flags", "stands_in_for", "launchers", "simulated")
    }
    (root / NAME).mkdir()
    (root / NAME / "manifest.yaml").write_text(
        yaml.safe_dump(
            dict(
                manifest,
                name=NAME,
                description="test: vllm-sim and one random layer",
                base="vllm-sim",
                build_needs={"arch": "x86_64", "disk_gb": 1},
            )
        )
    )
    (root / NAME / "Dockerfile").write_text(
        f"ARG BASE\nFROM ${{BASE}}\nRUN head -c {LAYER_BYTES} /dev/urandom > /opt/up-push-test.bin\n"
    )
    monkeypatch.setattr("sparkdeploy.paths.images_dir", lambda: root)
    definitions.clear_cache()
    data = absolute_inventory(lab.spec.inventory_path)
    data["cluster"]["image_override"] = NAME
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump(data, sort_keys=False))
    tag = definitions.load_definition(NAME).tag
    try:
        code, out, err = cli("down", "-i", str(inv))  # nothing of ours running on the image's nodes
        assert code == 0, out + err
        code, out, err = cli("images", "build", NAME, "--on", lab.nodes[0].name, "-i", str(inv))
        assert code == 0, out + err
        yield str(inv), tag
    finally:
        cli("down", "-i", str(inv))
        for node in lab.nodes:
            lab.ssh(node, f"docker image rm {tag} >/dev/null 2>&1; true", check=False)
        definitions.clear_cache()


@pytest.mark.lab
def test_up_sends_an_image_a_node_lacks_from_the_node_that_has_it(lab, engine_built_on_spark1, cli):
    from tests.images.conftest import interface_bytes

    inv, tag = engine_built_on_spark1
    a, b = lab.nodes[0], lab.nodes[1]

    def image_id(node) -> str | None:
        r = lab.ssh(node, f"docker image inspect --format '{{{{.Id}}}}' {tag}", check=False)
        return r.stdout.strip() if r.returncode == 0 else None

    built = image_id(a)
    assert built and image_id(b) is None, "spark1 only should hold the image before `up`"
    before = {n.name: interface_bytes(lab, n) for n in (a, b)}
    code, out, err = cli(
        "up",
        "--recipe",
        "openai-gpt-oss-120b",
        "-t",
        "cluster",
        "-i",
        inv,
        "--timeout",
        "240",
        "--json",
        "--no-fabric-gate",
    )
    after = {n.name: interface_bytes(lab, n) for n in (a, b)}
    assert code == 0, out + err
    result = json.loads(out)
    assert result["ok"] and result["health"]["ok"], result
    assert result["image"] == tag
    (push,) = result["pushed"]
    assert (push["image"], push["from"]) == (tag, a.name), push
    (row,) = push["nodes"]
    assert (row["node"], row["action"], row["ok"]) == (b.name, "sent", True), row
    assert row["bytes_sent"] >= LAYER_BYTES, row  # the random layer; spark2 already had vllm-sim's
    assert image_id(b) == built  # the same image, by ID
    delta = {n: {k: after[n][k] - before[n][k] for k in after[n]} for n in after}
    assert delta[b.name]["fabric"] >= row["bytes_sent"], delta  # it came over the fabric...
    assert delta[b.name]["mgmt"] < row["bytes_sent"] / 2, delta  # ...not over the management LAN...
    assert push["bytes_through_this_machine"] < 64_000, push  # ...and not through this machine
    code, out, err = cli("status", "-i", inv, "--json")
    assert code == 0, out + err
    status = json.loads(out)
    assert status["healthy"], status
    engines = [c for n in status["nodes"] for c in n["containers"] if c["role"] != "guard"]  # the guard: its image
    assert {c["image_id"] for c in engines} == {built}, status
    print(f"up pushed {row['bytes_sent']} B from {a.name}; interface bytes during up: {delta}")
