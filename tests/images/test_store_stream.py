"""Pure logic of the store reader's pipeline: how layers are gathered into loads, and the partial configs."""

from __future__ import annotations

import hashlib
import json

from sparkdeploy.images.store_stream import Load, plan_loads
from sparkdeploy.nodeside import archive


def test_layers_are_gathered_into_loads_of_at_least_the_batch():
    sizes = {0: 100, 1: 300, 2: 50, 3: 60, 4: 500, 6: 10}
    loads = plan_loads(8, [0, 1, 2, 3, 4, 6], sizes, batch_bytes=400)
    assert loads == [Load(1, [0, 1], False), Load(4, [2, 3, 4], False), Load(7, [6], True)]


def test_the_last_batch_on_a_boundary_becomes_the_final_load():
    loads = plan_loads(5, [1, 2], {1: 500, 2: 500}, batch_bytes=400)
    assert loads == [Load(1, [1], False), Load(4, [2], True)]


def test_a_small_image_is_one_load():
    assert plan_loads(3, [2], {2: 10}, batch_bytes=400) == [Load(2, [2], True)]
    assert plan_loads(3, [0, 1, 2], {0: 1, 1: 1, 2: 1}, batch_bytes=1 << 62) == [Load(2, [0, 1, 2], True)]


def test_every_layer_in_order_exactly_once():
    positions = [0, 2, 3, 5, 8, 9]
    loads = plan_loads(10, positions, {p: 7 * p + 1 for p in positions}, batch_bytes=20)
    assert [p for load in loads for p in load.positions] == positions
    assert [load.final for load in loads] == [False] * (len(loads) - 1) + [True]
    assert all(load.top == load.positions[-1] for load in loads[:-1]) and loads[-1].top == 9


def test_partial_config_names_its_layers_and_its_image():
    config = json.dumps(
        {
            "architecture": "arm64",
            "variant": "v8",
            "os": "linux",
            "history": [{"created_by": "RUN x"}] * 3,
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + "a" * 64, "sha256:" + "b" * 64]},
            "config": {"Labels": {"io.sparkdeploy.image": "vllm-node"}},
        }
    ).encode()
    image_id = "sha256:" + hashlib.sha256(config).hexdigest()
    partial = archive.partial_config(config, ["sha256:" + "a" * 64], image_id)
    data = json.loads(partial)
    assert data["rootfs"] == {"type": "layers", "diff_ids": ["sha256:" + "a" * 64]}
    assert data["config"]["Labels"] == {archive.PARTIAL_LABEL: image_id}
    assert (data["architecture"], data["variant"], data["os"]) == ("arm64", "v8", "linux")
    assert "history" not in data  # the engine refuses more non-empty history entries than layers
    assert archive.config_id(partial) == "sha256:" + hashlib.sha256(partial).hexdigest() != image_id
    assert archive.partial_config(config, ["sha256:" + "a" * 64], image_id) == partial  # the same bytes again
