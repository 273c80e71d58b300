"""Push decisions that need no node: what a node needs, the preflight, docker load's output, the node facts."""

from __future__ import annotations

import json

import pytest

from sparkdeploy.config.inventory import Node
from sparkdeploy.errors import StepFailed
from sparkdeploy.images.channel import load_failure
from sparkdeploy.images.inventory_images import ImageRecord, NodeImages, parse_facts
from sparkdeploy.images.push import SourceImage, plan_target
from sparkdeploy.nodeside.layers import chain_ids

DIFFS = [f"sha256:{c * 64}" for c in "abcd"]
SOURCE = SourceImage(
    "sparkdeploy/x:0123456789ab", "sha256:" + "9" * 64, "x", DIFFS, [100_000_000, 0, 50_000_000, 20_000_000, 1_000_000]
)  # 5 history entries, 4 layers
NODE = Node(name="spark1", mgmt_ip="192.0.2.1", fabric_ip="198.51.100.1/24", fabric_ifaces=["eth0"])
GB = 1_000_000_000


def facts(images=(), free=100 * GB, zstd=True, containerd=False) -> NodeImages:
    return NodeImages("spark1", "/var/lib/docker", "overlay2", "20.10.24", free, zstd, containerd, list(images))


def image(id_: str, layers, tags=()) -> ImageRecord:
    return ImageRecord(id_, list(tags), list(layers), {})


def test_node_with_the_image_id_needs_nothing_or_a_tag():
    assert plan_target(SOURCE, NODE, facts([image(SOURCE.id, DIFFS, [SOURCE.tag])])).action == "present"
    assert plan_target(SOURCE, NODE, facts([image(SOURCE.id, DIFFS, ["other:tag"])])).action == "tag"


def test_only_layers_whose_chain_the_node_lacks_are_sent():
    plan = plan_target(SOURCE, NODE, facts([image("sha256:" + "1" * 64, DIFFS[:2])]))
    assert plan.action == "send" and plan.needed == set(DIFFS[2:]) and plan.layers_sent == 2
    # the same diff IDs on another base are other layers for the layer store: all needed
    plan = plan_target(SOURCE, NODE, facts([image("sha256:" + "1" * 64, ["sha256:" + "f" * 64] + DIFFS[1:])]))
    assert plan.needed == set(DIFFS)
    assert chain_ids(DIFFS)[1] != chain_ids(["sha256:" + "f" * 64] + DIFFS[1:])[1]


def test_preflight_needs_twice_the_transfer():
    have = [image("sha256:" + "1" * 64, DIFFS[:2])]
    plan = plan_target(SOURCE, NODE, facts(have))
    # history has 4 non-empty entries for 4 layers: they are the layers, in order; missing: 20 MB + 1 MB
    assert plan.estimate == int(21_000_000 * 1.1) + 2 * (1 << 20)
    assert plan_target(SOURCE, NODE, facts(have, free=2 * plan.estimate)).action == "send"
    with pytest.raises(
        StepFailed,
        match=r"^spark1: refused before sending: 2 layers.*need .* free in the "
        r"Docker root /var/lib/docker",
    ):
        plan_target(SOURCE, NODE, facts(have, free=2 * plan.estimate - 1))
    with pytest.raises(StepFailed, match="cannot read the free space"):
        plan_target(SOURCE, NODE, facts(have, free=None))


def test_estimate_with_ambiguous_history_is_an_upper_bound():
    # 3 non-empty entries for 4 layers: one layer is empty and could be any; 50 MB may be layer 1 or 2
    source = SourceImage(SOURCE.tag, SOURCE.id, "x", DIFFS, [100_000_000, 0, 50_000_000, 20_000_000])
    plan = plan_target(source, NODE, facts([image("sha256:" + "1" * 64, DIFFS[:2])]))
    assert plan.estimate == int(70_000_000 * 1.1) + 2 * (1 << 20)


def test_compression_choice(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    assert plan_target(SOURCE, NODE, facts()).compression == "zstd"
    plan = plan_target(SOURCE, NODE, facts(zstd=False))
    assert plan.compression == "gzip" and "no zstd on the node" in plan.note
    with pytest.raises(StepFailed, match="zstd is not installed on the node"):
        plan_target(SOURCE, NODE, facts(zstd=False), compression="zstd")
    assert plan_target(SOURCE, NODE, facts(zstd=False), compression="none").compression == "none"


def test_containerd_image_store_gets_every_layer():
    plan = plan_target(SOURCE, NODE, facts([image("sha256:" + "1" * 64, DIFFS[:3])], containerd=True))
    assert plan.needed == set(DIFFS) and "containerd" in plan.note


@pytest.mark.parametrize(
    "code, output, expected",
    [
        (0, "Loaded image: sparkdeploy-incoming/x:abc\n", None),
        # docker load can report the full disk in its stream and still exit 0
        (0, "Error processing tar file(exit status 1): write /x/layer.tar: no space left on device\n", "out of disk"),
        (1, "Error processing tar file(exit status 1): write /x/layer.tar: no space left on device", "out of disk"),
        (1, "unexpected EOF", "docker load exited 1: unexpected EOF"),
        (-1, "", "docker load was killed on the node"),
        (137, "bash: line 1: 8517 Killed | docker load", "docker load was killed on the node (exit 137)"),
        (None, "", "did not finish"),
        (0, "", "reported no loaded image"),
    ],
)
def test_load_output_is_parsed(code, output, expected):
    why = load_failure(code, output)
    if expected is None:
        assert why is None
    else:
        assert expected in why


def test_node_facts_are_parsed():
    info = {
        "root": "/srv/docker",
        "driver": "overlay2",
        "version": "28.3.0",
        "status": [["Backing Filesystem", "extfs"], ["Supports d_type", "true"]],
    }
    img = {
        "id": "sha256:" + "1" * 64,
        "tags": ["sparkdeploy/vllm-node:abc"],
        "layers": DIFFS,
        "labels": {"io.sparkdeploy.image": "vllm-node"},
        "size": 123,
    }
    text = (
        f"info {json.dumps(info)}\ndf 5000\nzstd yes\nimage {json.dumps(img)}\nimage "
        + json.dumps({"id": "sha256:" + "2" * 64, "tags": None, "layers": None, "labels": None, "size": 0})
        + "\n"
    )
    f = parse_facts("spark1", text)
    assert (f.root_dir, f.driver, f.server_version, f.free_bytes, f.zstd, f.containerd_store) == (
        "/srv/docker",
        "overlay2",
        "28.3.0",
        5000,
        True,
        False,
    )
    assert [i.name for i in f.managed()] == ["vllm-node"]
    assert f.image("sparkdeploy/vllm-node:abc").id == img["id"]
    assert chain_ids(DIFFS)[-1] in f.chain_ids()
    containerd = dict(info, status=[["driver-type", "io.containerd.snapshotter.v1"]])
    assert parse_facts("spark1", f"info {json.dumps(containerd)}\ndf \nzstd no\n").containerd_store
    with pytest.raises(StepFailed, match="spark1"):
        parse_facts("spark1", "zstd no\n")


def test_cli_rejects_an_unknown_node_before_connecting(cli, inventory_file):
    code, _out, err = cli("images", "push", "vllm-sim", "--to", "spark9", "-i", str(inventory_file))
    assert code == 2 and "spark9" in err and "not found" in err


def test_cli_build_on_and_local_exclude_each_other(cli, inventory_file):
    code, _out, err = cli("images", "build", "debian-base", "--on", "spark1", "--local", "-i", str(inventory_file))
    assert code == 2 and "exclude" in err


def test_auto_compression_skips_zstd_when_a_sample_of_the_layers_does_not_compress():
    from sparkdeploy.images.push_from import _choose_compression

    with_zstd = [facts(zstd=True), facts(zstd=True)]
    assert _choose_compression("auto", with_zstd, 0.45)[0] == "zstd"  # CUDA/Python layers: about 2x
    assert _choose_compression("auto", with_zstd, None)[0] == "zstd"  # not sampled (docker save reader)
    choice, why = _choose_compression("auto", with_zstd, 0.99)  # random or already-compressed layers
    assert choice == "none" and "0.99" in why
    assert _choose_compression("auto", [facts(zstd=True), facts(zstd=False)], 0.45)[0] == "none"
    assert _choose_compression("zstd", with_zstd, 0.99)[0] == "zstd"  # asked for: as asked
    choice, why = _choose_compression("auto", with_zstd, None, estimate=3 * 2**20)  # a re-push of one small layer
    assert choice == "none" and "3.1 MB" in why, why
